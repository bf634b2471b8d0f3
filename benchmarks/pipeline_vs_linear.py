"""Pipelined vs linear execution (the research result): built-in workload, same seed, same steps.

Runs ``ddlctl compare --strategies mwms,ps --workers 2 --pipeline both`` (one process tree per run,
side by side in one invocation) and prints, per strategy, pipelined/linear throughput and the final
accuracy of both. Target for ``cnn``: pipelined >= 1.5x linear under mwms (2 workers) and under ps,
final accuracy within 1 point.

    .venv/bin/python benchmarks/pipeline_vs_linear.py [--workload cnn] [--steps 400] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--strategies", default="mwms,ps")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ddlctl-pipeline-bench-")
    done = subprocess.run([sys.executable, "-m", "ddlctl", "compare", "--strategies", args.strategies,
                           "--workers", "2", "--pipeline", "both", "--workload", args.workload, "--steps",
                           str(args.steps), "--repeats", str(args.repeats), "--run-dir", root, "--json"],
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr[-3000:])
    result = json.loads(done.stdout)
    rows = {(r["strategy"], r["pipeline"]): r for r in result["rows"]}
    print(f"{args.workload}, {args.steps} steps, 2 workers, median of {args.repeats} run(s); samples/s")
    print(f"{'strategy':<10} {'pipelined':>10} {'linear':>9} {'ratio':>7} {'acc pipelined':>14} {'acc linear':>11} "
          f"{'diff (points)':>14}")
    for strategy in args.strategies.split(","):
        fast, slow = rows.get((strategy, True)), rows.get((strategy, False))
        if not fast or not slow or fast["error"] or slow["error"]:
            print(f"{strategy:<10} failed: {(fast or {}).get('error')} / {(slow or {}).get('error')}")
            continue
        ratio = fast["throughput_samples_per_s"] / slow["throughput_samples_per_s"]
        diff = 100 * (fast["accuracy"] - slow["accuracy"])
        print(f"{strategy:<10} {fast['throughput_samples_per_s']:>10,.0f} {slow['throughput_samples_per_s']:>9,.0f} "
              f"{ratio:>6.2f}x {fast['accuracy']:>14.4f} {slow['accuracy']:>11.4f} {diff:>+14.2f}")
    print(f"runs: {result['compare_dir']}")


if __name__ == "__main__":
    main()
