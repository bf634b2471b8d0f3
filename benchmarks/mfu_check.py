"""MFU end to end: ``ddlctl profile --strategy one_device`` over a load of known FLOPs
(``benchmarks/mfu_load.py``), and the report's figures beside the load's own.

Prints the load's declared FLOPs per sample, the achieved FLOP/s the report computes (FLOPs per
sample x its samples/s) next to what the load measured itself, the GPU's dense peak from ddlctl's
table and the MFU. On a GPU machine (PyTorch, bfloat16) the MFU is a figure; on a CPU host it is
"n/a" and the achieved FLOP/s are still checked. Agreement target: within 5 %.

    .venv/bin/python benchmarks/mfu_check.py [--size 8192 --batch 8192 --layers 4 --steps 400]
    .venv/bin/python benchmarks/mfu_check.py --size 512 --batch 512 --layers 2 --steps 100   # a CPU host
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from mfu_load import load_arguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddlctl-mfu-") as folder:
        runs, own_path = Path(folder) / "runs", Path(folder) / "own.json"
        command = [sys.executable, "-m", "ddlctl", "profile", "--strategy", "one_device", "--runs-dir", str(runs),
                   "--sample-interval", "0.5", "--", sys.executable, str(HERE / "mfu_load.py"),
                   "--size", str(args.size), "--batch", str(args.batch), "--layers", str(args.layers),
                   "--steps", str(args.steps), "--out", str(own_path)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"ddlctl profile failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        summary = json.loads(next(runs.glob("*/summary.json")).read_text())
        own = json.loads(own_path.read_text())
    row = summary["mfu"][0]
    gpus = [g["name"] for h in summary["hosts"] for g in h["gpus"]]
    ratio = row["achieved_flops_per_s"] / own["achieved_flops_per_s"]
    print(f"load: {own['device']} ({own['dtype']}), {own['train_flops_per_sample']:,} FLOPs per sample, "
          f"{own['steps']} steps; GPUs seen by telemetry: {', '.join(gpus) or 'none'}")
    print(f"achieved FLOP/s: ddlctl {row['achieved_flops_per_s'] / 1e12:.2f} T, the load's own "
          f"{own['achieved_flops_per_s'] / 1e12:.2f} T: ratio {ratio:.3f} (target 0.95-1.05)")
    if row["mfu"] is not None:
        print(f"dense peak {row['peak_flops_per_s'] / 1e12:.1f} TFLOP/s: MFU {row['mfu']:.1%} (the load's own "
              f"{own['achieved_flops_per_s'] / row['peak_flops_per_s']:.1%})")
    else:
        print(f"MFU {row['note']}")
    util = [g["util_mean"] for h in summary["hosts"] for g in h["gpus"]]
    if util:
        print(f"GPU util mean {', '.join(f'{u:.0f}%' for u in util)}")
    if not 0.95 <= ratio <= 1.05:
        raise SystemExit("the report's achieved FLOP/s differ from the load's own by more than 5 %")


if __name__ == "__main__":
    main()
