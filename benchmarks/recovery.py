"""Recovery after a fault, measured side by side in one run (by hand; not part of CI).

For each scenario, the built-in workload runs once without a fault and once with ``kill -9`` of
one task at a third of the run; printed per scenario:

* recovery: seconds from the kill to the replacement stepping again (a ps worker, a server: to
  listening again and rejoining; the chief, the ps task and the mwms group: to the next step
  recorded after the restart), next to the cold start of the same job (ddlctl start -> first step);
* goodput (productive step time / training window) with and without the fault, and their ratio;
* steps redone after resuming.

Targets (issue 10): ps worker back <= 5 s; mwms group stepping again <= cold start + 3 s; goodput
with one fault >= 0.9 x fault-free for a 3-minute job (``--steps`` sized so a run takes ~3 min).

    .venv/bin/python benchmarks/recovery.py --steps 7000 --mwms-steps 9000
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlctl.testing.faults import Job  # noqa: E402

SCENARIOS = {  # name: (strategy, victim, trainer task)
    "ps worker": ("ps", "worker-1", "chief-0"),
    "ps chief": ("ps", "chief-0", "chief-0"),
    "ps server": ("ps", "ps-0", "chief-0"),
    "mwms group": ("mwms", "worker-1", "worker-0"),
}


def first_step_s(run_dir: Path, task: str) -> float | None:
    path = run_dir / "tasks" / task / "steps.jsonl"
    for line in path.read_text().splitlines():
        return json.loads(line)["start_us"] / 1e6
    return None


def run(root: Path, strategy: str, steps: int, victim: str | None, trainer: str) -> dict:
    runs = root / f"{strategy}-{victim or 'clean'}-{time.monotonic_ns()}"
    runs.mkdir(parents=True)
    started = time.time()
    job = Job(runs, "-s", strategy, "--steps", str(steps), "--max-restarts", "1", "--no-telemetry",
              "--grace", "2", "--startup-timeout", "180")
    killed = None
    if victim is not None:
        job.wait_steps(trainer, steps // 3, timeout=600)
        killed = job.kill(victim, signal.SIGKILL)
    code = job.wait(1800)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    first = first_step_s(job.run_dir, trainer)
    return {"code": code, "summary": summary, "killed": killed,
            "cold_start_s": None if first is None else first - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=7000, help="steps of every ps run (~3 minutes here)")
    parser.add_argument("--mwms-steps", type=int, default=None, help="steps of every mwms run (default: --steps)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddlctl-recovery-"))
    rows = []
    clean: dict[str, dict] = {}
    for name in args.scenarios.split(","):
        strategy, victim, trainer = SCENARIOS[name.strip()]
        steps = args.mwms_steps if strategy == "mwms" and args.mwms_steps else args.steps
        if strategy not in clean:
            clean[strategy] = run(root, strategy, steps, None, trainer)
        faulty = run(root, strategy, steps, victim, trainer)
        restarts = faulty["summary"]["restarts"]
        recovery = restarts[0]["downtime_s"] if restarts else None
        good, base = faulty["summary"]["goodput"], clean[strategy]["summary"]["goodput"]
        rows.append((name, faulty["code"], recovery, clean[strategy]["cold_start_s"], base, good,
                     None if not (good and base) else good / base, faulty["summary"]["steps_lost"]))
        print(f"{name}: exit {faulty['code']}, back after {recovery}s", flush=True)
    print(f"\n{'scenario':<12} {'exit':>4} {'recovery s':>10} {'cold start s':>12} {'goodput clean':>13} "
          f"{'goodput fault':>13} {'ratio':>6} {'steps redone':>12}")
    for name, code, recovery, cold, base, good, ratio, lost in rows:
        def f(v, spec=".2f"):  # noqa: ANN001, ANN202
            return "-" if v is None else format(v, spec)
        print(f"{name:<12} {code:>4} {f(recovery):>10} {f(cold):>12} {f(base, '.3f'):>13} {f(good, '.3f'):>13} "
              f"{f(ratio, '.3f'):>6} {lost:>12}")
    print(f"\n(run directories under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
