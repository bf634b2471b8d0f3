"""Tasks forked from a zygote vs started as their own interpreters, side by side in one run (by hand;
not part of CI).

Rounds alternate ``--prefork`` and ``--no-prefork`` (the same jobs, interleaved so that both see the
machine alike). Per round and mode:

* cold start: a ps job of the built-in workload (chief, 2 workers, 1 ps) from ``ddlctl launch`` to
  the chief's first step, the launch's wall time, and the CPU-seconds of every process of the run
  (``ddlctl`` and its descendants, from ``RUSAGE_CHILDREN``);
* restarts: the same job with a ps worker, then (another job) the chief, killed with ``kill -9`` at
  a third of the run; the downtime ddlctl recorded (kill to the replacement back at work).

Printed: each figure's median over the rounds per mode and the ratio no-prefork / prefork.

    .venv/bin/python benchmarks/prefork.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlctl.testing.faults import Job  # noqa: E402


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_step_s(run_dir: Path, task: str) -> float | None:
    for line in (run_dir / "tasks" / task / "steps.jsonl").read_text().splitlines():
        return json.loads(line)["start_us"] / 1e6
    return None


def cold(root: Path, mode: str, steps: int) -> dict[str, float | None]:
    runs = root / f"cold-{mode}-{time.monotonic_ns()}"
    runs.mkdir()
    cpu, started, mono = children_cpu_s(), time.time(), time.monotonic()
    job = Job(runs, "-s", "ps", "--steps", str(steps), "--no-telemetry", f"--{mode}")
    code = job.wait(900)
    wall, cpu = time.monotonic() - mono, children_cpu_s() - cpu
    assert code == 0, job.stderr()[-2000:]
    first = first_step_s(job.run_dir, "chief-0")
    return {"start-up s": None if first is None else first - started, "launch wall s": wall, "run CPU s": cpu}


def restart(root: Path, mode: str, steps: int, victim: str) -> float | None:
    runs = root / f"{victim}-{mode}-{time.monotonic_ns()}"
    runs.mkdir()
    job = Job(runs, "-s", "ps", "--steps", str(steps), "--no-telemetry", "--max-restarts", "1", "--grace", "2",
              f"--{mode}")
    job.wait_steps("chief-0", steps // 3, timeout=600)
    job.kill(victim, signal.SIGKILL)
    code = job.wait(900)
    assert code == 0, job.stderr()[-2000:]
    restarts = json.loads((job.run_dir / "summary.json").read_text())["restarts"]
    return restarts[0]["downtime_s"] if restarts else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="steps of the cold-start jobs")
    parser.add_argument("--restart-steps", type=int, default=600, help="steps of the restart jobs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-prefork-"))
    figures: dict[str, dict[str, list[float]]] = {"prefork": {}, "no-prefork": {}}
    for round_ in range(args.rounds):
        for mode in ("prefork", "no-prefork") if round_ % 2 == 0 else ("no-prefork", "prefork"):
            seen = cold(root, mode, args.steps)
            for victim, name in (("worker-1", "ps worker restart s"), ("chief-0", "chief restart s")):
                seen[name] = restart(root, mode, args.restart_steps, victim)
            for name, value in seen.items():
                if value is not None:
                    figures[mode].setdefault(name, []).append(value)
            print(f"round {round_ + 1} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in seen.items() if v is not None),
                  flush=True)
    print(f"\n{'figure':<22} {'prefork':>9} {'no-prefork':>11} {'ratio':>7}   (medians of {args.rounds} rounds)")
    for name in figures["prefork"]:
        forked, plain = (statistics.median(figures[m].get(name) or [float("nan")]) for m in ("prefork", "no-prefork"))
        print(f"{name:<22} {forked:>9.2f} {plain:>11.2f} {plain / forked:>6.2f}x")
    print(f"\n(run directories under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
