"""What the hang watch says of a GPU task's hang, end to end: ``ddlctl launch --strategy one_device``
over ``benchmarks/gpu_hang_load.py`` hung in a kernel that does not end, then in host code, and
the ``hangs`` record of each run's ``outcome.json`` (the GPU's state over the stall, the reason).

On a GPU machine the kernel's GPU reads busy and the host hang's idle; on a CPU host the records
say nothing of GPUs. Needs PyTorch.

    python benchmarks/gpu_hang_check.py [--hang-timeout 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-timeout", type=float, default=8.0)
    args = parser.parse_args()
    failed = []
    for hang, expected in (("kernel", "busy"), ("host", "idle")):
        with tempfile.TemporaryDirectory(prefix="ddlctl-gpu-hang-") as folder:
            runs = Path(folder) / "runs"
            command = [sys.executable, "-m", "ddlctl", "launch", "--strategy", "one_device", "--runs-dir", str(runs),
                       "--hang-timeout", str(args.hang_timeout), "--", sys.executable,
                       str(HERE / "gpu_hang_load.py"), "--hang", hang]
            start = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
            took = time.monotonic() - start
            outcome = json.loads(next(runs.glob("*/outcome.json")).read_text())
            # which GPU each task used, as NVML saw its processes (the telemetry agent says it when it changes)
            using = [json.loads(line)["gpu_tasks"] for path in runs.glob("*/telemetry/*.jsonl")
                     for line in path.read_text().splitlines() if '"gpu_tasks"' in line]
        hangs = outcome.get("hangs") or []
        if done.returncode != 124 or not hangs:
            failed.append(hang)
            print(f"{hang}: exit {done.returncode}, {len(hangs)} hang record(s)\n{done.stderr[-2000:]}")
            continue
        record = hangs[0]
        gpu = record["tasks"][0]["gpu"]
        print(f"{hang}: exit 124 after {took:.0f}s; culprit {record['culprit']}; GPU record {json.dumps(gpu)}; "
              f"GPUs by task as NVML saw them: {using or 'never said'}")
        print(f"  why: {record['why']}")
        if gpu is not None and gpu["state"] != expected:
            failed.append(hang)
            print(f"  expected the GPU to read {expected}")
    if failed:
        raise SystemExit(f"not as expected: {', '.join(failed)}")


if __name__ == "__main__":
    main()
