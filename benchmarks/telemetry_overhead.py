"""Telemetry overhead: the built-in workload with telemetry on vs off, interleaved in one run.

Each pair runs ``ddlctl launch --strategy mwms --workers 2 --steps N`` once with the agent
(``--telemetry``, default interval 1 s) and once without (``--no-telemetry``), in alternating
order, and reads throughput from each run's summary.json. Target: on/off ratio >= 0.98.

    .venv/bin/python benchmarks/telemetry_overhead.py [--pairs 6] [--steps 400] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def throughput(root: Path, telemetry: bool, steps: int, strategy: str, interval: float) -> float:
    run_root = Path(tempfile.mkdtemp(dir=root))
    flags = ["--telemetry", "--sample-interval", f"{interval:g}"] if telemetry else ["--no-telemetry"]
    subprocess.run([sys.executable, "-m", "ddlctl", "launch", "--strategy", strategy, "--workers", "2",
                    "--steps", str(steps), "--runs-dir", str(run_root), *flags],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (run_dir,) = run_root.iterdir()
    return float(json.loads((run_dir / "summary.json").read_text())["throughput_samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--strategy", default="mwms")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-telemetry-bench-"))
    on, off = [], []
    try:
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            for telemetry in order:
                value = throughput(root, telemetry, args.steps, args.strategy, args.interval)
                (on if telemetry else off).append(value)
            print(f"pair {pair + 1}: on {on[-1]:,.0f}  off {off[-1]:,.0f}  ratio {on[-1] / off[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"\n{args.strategy}, 2 workers, {args.steps} steps, {args.pairs} interleaved pairs, samples/s:")
    print(f"telemetry on : median {statistics.median(on):,.0f}")
    print(f"telemetry off: median {statistics.median(off):,.0f}")
    print(f"ratio of medians {statistics.median(on) / statistics.median(off):.3f}; median of pair ratios "
          f"{statistics.median(ratios):.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()
