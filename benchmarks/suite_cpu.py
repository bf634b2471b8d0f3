"""Where the test suite's CPU goes, by kind of process and by test: runs a command (by default the
parallel part of the suite) while sampling every process's CPU time twice a second.

    python benchmarks/suite_cpu.py                       # the parallel part of .ci/run
    python benchmarks/suite_cpu.py -- pytest -q tests/test_faults.py
    python benchmarks/suite_cpu.py -- pytest -q tests/test_ssh_faults.py -k group_restart   # one test's cost

An ``atexit`` hook would miss most of it: TensorFlow tasks end by SIGTERM/SIGKILL. Processes under
sshd or slurmd do not inherit ``PYTEST_CURRENT_TEST``; they are counted by run id or not at all.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time

import psutil

KINDS = (("ddlctl.runtime.zygote", "zygote (imports TensorFlow once)"),
         ("ddlctl.workloads", "built-in workload"), ("ddlctl.runtime.server", "TF server (ps/worker)"),
         ("hostagent", "host agent"), ("telemetry", "telemetry agent"), ("-m ddlctl", "ddlctl command"),
         ("pytest", "pytest"), ("sshd", "sshd"), ("slurm", "Slurm daemons and steps"),
         ("python", "other Python (test programs)"))


def kind_of(cmdline: str) -> str:
    """A process's kind, from its command line."""
    return next((name for needle, name in KINDS if needle in cmdline), "other")


def sample(proc: subprocess.Popen, interval: float) -> dict:
    """(pid, start) -> (cpu seconds, kind, test) until ``proc`` ends; processes older than ``proc``
    count only the CPU they use from then on."""
    seen: dict[tuple[int, float], tuple[float, str, str]] = {}
    base: dict[tuple[int, float], float] = {}
    born = psutil.Process(proc.pid).create_time()
    while proc.poll() is None:
        for p in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
            info = p.info
            if not info["cpu_times"] or not info["cmdline"]:
                continue
            key = (info["pid"], info["create_time"])
            cpu = info["cpu_times"].user + info["cpu_times"].system
            if info["create_time"] < born - 0.01:
                cpu -= base.setdefault(key, cpu)
            old = seen.get(key)
            if old is not None and cpu <= old[0]:
                continue
            test = old[2] if old else ""
            if not test:
                try:
                    env = p.environ()
                    test = env.get("PYTEST_CURRENT_TEST", "").split(" ")[0] or \
                        (f"run {env['DDLCTL_RUN_ID']}" if "DDLCTL_RUN_ID" in env else "")
                except (psutil.Error, OSError):
                    pass
            seen[key] = (cpu, kind_of(" ".join(info["cmdline"])), test)
        time.sleep(interval)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--top", type=int, default=25, help="tests to list")
    parser.add_argument("command", nargs="*", default=[sys.executable, "-m", "pytest", "-q", "-n", "4", "--dist",
                                                       "loadfile", "--no-loadscope-reorder", "-m", "not timing",
                                                       "-p", "no:cacheprovider"])
    args = parser.parse_args()
    started = time.monotonic()
    before = psutil.cpu_times()
    proc = subprocess.Popen(args.command)
    seen = sample(proc, args.interval)
    wall = time.monotonic() - started
    after = psutil.cpu_times()
    idle = (after.idle - before.idle) / max(1e-9, sum(after) - sum(before))
    # everything the machine did meanwhile (processes under sshd or slurmd too): what one test costs
    # when it runs alone (``-- pytest -q tests/FILE.py -k NAME``, nothing else running)
    fields = ("user", "nice", "system", "irq", "softirq", "steal")  # (guest time is in user's already)
    busy = sum(getattr(after, f, 0.0) - getattr(before, f, 0.0) for f in fields)
    by_kind: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    by_test: collections.Counter[str] = collections.Counter()
    for cpu, kind, test in seen.values():
        by_kind[kind] += cpu
        count[kind] += 1
        by_test[test or "(unknown)"] += cpu
    total = sum(by_kind.values())
    print(f"\nwall {wall:.0f} s, machine idle {idle:.0%}, machine busy {busy:.1f} CPU-s, sampled CPU {total:.0f} s, "
          f"exit code {proc.returncode}")
    print(f"{'CPU s':>8} {'procs':>6} {'avg s':>6}  kind")
    for kind, cpu in by_kind.most_common():
        print(f"{cpu:8.1f} {count[kind]:6d} {cpu / count[kind]:6.2f}  {kind}")
    print(f"\n{'CPU s':>8}  test (top {args.top})")
    for test, cpu in by_test.most_common(args.top):
        print(f"{cpu:8.1f}  {test}")
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
