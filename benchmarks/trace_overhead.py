"""Profiler capture overhead: a job's training time with ``--trace`` off and with one 10-step
capture, interleaved in one run.

Each round runs the built-in workload (``ddlctl launch -s mwms --workers 2 --steps N``) once
without ``--trace`` and once with ``--trace A-(A+9)`` in the middle of the run, in alternating
order, and reads the training time from each run's records: the lead worker's first step start to
its last step end (``steps.jsonl``), so start-up and the report's reading of the traces are left
out (they are not the training's). Prints the medians and their ratio, and the capture's own time
(``capture.json``: start to stop), and what the capture added to the steps around it against the
run's usual pace (the direct cost, which the runs' spread would hide). Target: a 10-step capture costs at
most 3% of a 5-minute job; off costs nothing measurable (nothing runs then: the recorder's one
``None`` test per step).

``--auto``: the same with a straggler (worker:1 sleeps ``--slow-ms`` before each step), ``--trace
off`` against ``--trace auto`` (``profile``'s default), which finds it and captures it and worker:0
once. Target: at most 5% of a 5-minute job.

    .venv/bin/python benchmarks/trace_overhead.py [--rounds 3] [--steps 3000] [--strategy mwms] [--auto]
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


def training_s(run_dir: Path) -> float:
    """Seconds from worker 0's first step start to its last step end."""
    records = [json.loads(line) for line in (run_dir / "tasks" / "worker-0" / "steps.jsonl").read_text().splitlines()]
    first = min(r["start_us"] for r in records) / 1e6
    last = max(r["start_us"] / 1e6 + r["duration_s"] for r in records)
    return last - first


def pause_s(run_dir: Path, capture: dict) -> float:
    """The time the capture added to worker 0's training: its steps from just before the capture's
    start to a few seconds after its stop took this much longer than usual steps (their time
    between the first start and the last end, less the median step pace over that many steps)."""
    records = sorted((json.loads(line) for line in
                      (run_dir / "tasks" / "worker-0" / "steps.jsonl").read_text().splitlines()),
                     key=lambda r: r["start_us"])
    starts = [r["start_us"] / 1e6 for r in records]
    ends = [s + r["duration_s"] for s, r in zip(starts, records, strict=True)]
    pace = statistics.median(b - a for a, b in zip(starts, starts[1:], strict=False))
    near = [i for i, s in enumerate(starts) if capture["start_s"] - 1 <= s <= capture["end_s"] + 3]
    first, last = near[0], near[-1]
    return max(0.0, ends[last] - starts[first] - pace * (last - first + 1))


def one_run(root: Path, strategy: str, steps: int, trace: str | None,
            slow_ms: float = 0.0) -> tuple[float, float | None, float | None]:
    """(training seconds, the capture's seconds or None, the pause it added or None)."""
    runs = Path(tempfile.mkdtemp(dir=root))
    flags = ["--trace", trace] if trace else []
    workload = ["--", sys.executable, "-m", "ddlctl.workloads", "--steps", str(steps), "--slow-task", "worker:1",
                "--slow-ms", str(slow_ms)] if slow_ms else ["--steps", str(steps)]
    done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "-s", strategy, "--workers", "2",
                           "--no-telemetry", "--runs-dir", str(runs), *flags, *workload],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:  # (kept: the run's folder says why)
        kept = Path(tempfile.mkdtemp(prefix="ddlctl-trace-bench-failed-"))
        shutil.copytree(runs, kept, dirs_exist_ok=True)
        raise SystemExit(f"ddlctl launch {' '.join(flags)} ended with {done.returncode}: {done.stderr[-2000:]}\n"
                         f"(its run folder: {kept})")
    (run_dir,) = runs.iterdir()
    capture = run_dir / "tasks" / "worker-0" / ("capture-auto-1.json" if trace == "auto" else "capture.json")
    took = paused = None
    if capture.exists():
        record = json.loads(capture.read_text())
        took, paused = record["end_s"] - record["start_s"], pause_s(run_dir, record)
    return training_s(run_dir), took, paused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--strategy", default="mwms")
    parser.add_argument("--auto", action="store_true", help="a job with a straggler: --trace off against auto")
    parser.add_argument("--slow-ms", type=float, default=20.0, help="--auto: worker:1's sleep before each step")
    args = parser.parse_args()
    middle = args.steps // 2
    trace = "auto" if args.auto else f"{middle}-{middle + 9}"
    baseline, slow_ms = ("off", args.slow_ms) if args.auto else (None, 0.0)
    root = Path(tempfile.mkdtemp(prefix="ddlctl-trace-bench-"))
    off, on, captures, pauses = [], [], [], []
    try:
        for round_ in range(args.rounds):
            for traced in ((False, True) if round_ % 2 == 0 else (True, False)):
                seconds, took, paused = one_run(root, args.strategy, args.steps, trace if traced else baseline,
                                                slow_ms)
                (on if traced else off).append(seconds)
                if took is not None:
                    captures.append(took)
                    pauses.append(paused)
            print(f"round {round_ + 1}: off {off[-1]:.2f}s  --trace {trace} {on[-1]:.2f}s  "
                  f"ratio {on[-1] / off[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    a, b = statistics.median(off), statistics.median(on)
    straggler = f", worker:1 {args.slow_ms:g} ms late a step" if args.auto else ""
    print(f"\n{args.strategy}, 2 workers{straggler}, {args.steps} steps, {args.rounds} interleaved rounds, "
          "training time:")
    print(f"  --trace off          : median {a:.2f}s")
    print(f"  --trace {trace:<13}: median {b:.2f}s (the capture itself: median {statistics.median(captures):.2f}s)")
    print(f"  ratio of medians {b / a:.3f} (the runs' own spread is larger than a capture: see below)")
    cost = statistics.median(pauses)
    print(f"what the capture added to the training it interrupted (steps around it against the usual pace): "
          f"median {cost:.2f}s = {100 * cost / a:.2f}% of this job, {100 * cost / 300:.2f}% of a 5-minute job "
          f"(target <= {5 if args.auto else 3}%; captures taken: {len(captures)} of {args.rounds})")


if __name__ == "__main__":
    main()
