"""The telemetry agent's CPU per sample with 1 and with 1,000 unrelated processes on the host.

The agent follows a run's tasks from the pids their host agent recorded (``pid.json``) down their
process trees, instead of reading the environment of every process on the host. This runs the
real agent (``python -m ddlctl.host.telemetry``) beside one stand-in task, once with 1 unrelated
process and once with ``--crowd`` (1,000) of them, alternating, and reads the agent's own CPU time
(``/proc/PID/task/*/schedstat``, nanoseconds) over ``--samples`` samples after it settled. For
comparison it also times the old way's rescan (every process's environment) at both sizes.
Target: the same CPU per sample within 20%.

    .venv/bin/python benchmarks/telemetry_scan.py [--crowd 1000] [--samples 20] [--interval 1.0] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddlctl.host.procs import processes_with

RUN_ID = "telemetry-scan-bench"


def cpu_ns(pid: int) -> int:
    """On-CPU nanoseconds of every thread of ``pid`` so far."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{thread}/schedstat") as handle:
            total += int(handle.read().split()[0])
    return total


def agent_cpu_per_sample(task_dir: Path, samples: int, interval: float, settle: int = 3) -> float:
    """Milliseconds of the agent's CPU per sample, over ``samples`` samples after ``settle``."""
    agent = subprocess.Popen([sys.executable, "-m", "ddlctl.host.telemetry", "--host", "bench", "--run-id", RUN_ID,
                              "--interval", f"{interval:g}", f"--watch=worker:0={task_dir}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(settle + 1):  # hello and the first samples (imports, first scan)
            agent.stdout.readline()
        start = cpu_ns(agent.pid)
        seen = 0
        for _ in range(samples):
            record = json.loads(agent.stdout.readline())
            seen += "worker:0" in record.get("procs", {})
        used = cpu_ns(agent.pid) - start
        assert seen >= samples - 1, f"the agent found the task in {seen} of {samples} samples"
        return used / samples / 1e6
    finally:
        agent.terminate()
        agent.wait(10)


def old_rescan_ms(rounds: int = 5) -> float:
    """Milliseconds of one pass over every process's environment (the old way's rescan)."""
    times = []
    for _ in range(rounds):
        begin = time.perf_counter()
        processes_with([f"DDLCTL_RUN_ID={RUN_ID}"])
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crowd", type=int, default=1000, help="unrelated processes in the crowded case")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both cases")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="ddlctl-telemetry-scan-"))
    task = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"],
                            env={**os.environ, "DDLCTL_RUN_ID": RUN_ID, "DDLCTL_TASK": "worker:0"})
    (folder / "pid.json").write_text(json.dumps({"task_pid": task.pid}))
    crowd: list[subprocess.Popen] = []
    figures: dict[int, list[float]] = {1: [], args.crowd: []}
    old: dict[int, float] = {}
    try:
        for round_ in range(args.rounds):
            for size in ((1, args.crowd) if round_ % 2 == 0 else (args.crowd, 1)):
                while len(crowd) < size:
                    crowd.append(subprocess.Popen(["sleep", "3600"]))
                while len(crowd) > size:
                    crowd.pop().kill()
                for process in crowd:
                    process.poll()
                old.setdefault(size, old_rescan_ms())
                figures[size].append(agent_cpu_per_sample(folder, args.samples, args.interval))
                print(f"round {round_ + 1}, {size} unrelated processes: {figures[size][-1]:.2f} ms of CPU a sample",
                      flush=True)
    finally:
        for process in crowd:
            process.kill()
        for process in crowd:
            process.wait()
        task.kill()
    few, many = statistics.median(figures[1]), statistics.median(figures[args.crowd])
    print(f"\ntelemetry agent, one task, a sample every {args.interval:g}s, medians of {args.rounds} rounds:")
    print(f"  1 unrelated process     : {few:.2f} ms of CPU a sample")
    print(f"  {args.crowd} unrelated processes: {many:.2f} ms of CPU a sample")
    print(f"  ratio {many / few:.2f} (target <= 1.20)")
    print(f"the old way's rescan (every process's environment, once per 5 s): {old[1]:.2f} ms with 1, "
          f"{old[args.crowd]:.2f} ms with {args.crowd} ({old[args.crowd] / max(old[1], 1e-9):.0f}x)")


if __name__ == "__main__":
    main()
