"""Pipelined vs linear execution (the research result): built-in workload, same seed, same steps.

Runs ``ddlctl compare --strategies mwms,ps --workers 2 --execution all`` (one process tree per
run, side by side in one invocation) and prints, per strategy, the throughput of each execution
mode, pipelined's ratio over the honest linear baseline (the same tf.data input without overlap)
and over python-feed (batches built in Python: the strawman), the final held-out accuracy of each
mode, and how many steps were in flight at once on average (ps: asynchronous training, the cause
of accuracy moving from run to run). Target for ``cnn``: final accuracy within 1 point between
pipelined and linear (median of repeats).

    .venv/bin/python benchmarks/pipeline_vs_linear.py [--workload cnn] [--steps 400] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

MODES = ("pipelined", "linear", "python-feed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--strategies", default="mwms,ps")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ddlctl-pipeline-bench-")
    done = subprocess.run([sys.executable, "-m", "ddlctl", "compare", "--strategies", args.strategies,
                           "--workers", "2", "--execution", "all", "--workload", args.workload, "--steps",
                           str(args.steps), "--repeats", str(args.repeats), "--runs-dir", root, "--json"],
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr[-3000:])
    result = json.loads(done.stdout)
    rows = {(r["strategy"], r["execution"]): r for r in result["rows"]}
    print(f"{args.workload}, {args.steps} steps, 2 workers, median of {args.repeats} run(s)")
    print(f"{'strategy':<9} {'mode':<12} {'samples/s':>10} {'accuracy':>9} {'runs':>24} {'in flight':>10}")
    for strategy in args.strategies.split(","):
        for mode in MODES:
            row = rows.get((strategy, mode))
            if not row or row["error"]:
                print(f"{strategy:<9} {mode:<12} failed: {(row or {}).get('error')}")
                continue
            runs = ", ".join(f"{v:,.0f}" for v in row["throughput_runs"])
            flight = row.get("steps_in_flight")
            print(f"{strategy:<9} {mode:<12} {row['throughput_samples_per_s']:>10,.0f} {row['accuracy']:>9.4f} "
                  f"{runs:>24} {'-' if flight is None else f'{flight:.2f}':>10}")
        ratios = result["execution_speedups"].get(strategy, {})
        fast, slow = rows.get((strategy, "pipelined")), rows.get((strategy, "linear"))
        gap = 100 * (fast["accuracy"] - slow["accuracy"]) if fast and slow and fast["accuracy"] and slow["accuracy"] \
            else None
        print(f"{strategy:<9} pipelined / linear {ratios.get('linear', float('nan')):.2f}x, "
              f"pipelined / python-feed {ratios.get('python-feed', float('nan')):.2f}x, accuracy pipelined - linear "
              f"{'-' if gap is None else f'{gap:+.2f}'} points")
    print(f"runs: {result['compare_dir']}")


if __name__ == "__main__":
    main()
