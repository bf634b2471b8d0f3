"""Where the test suite's CPU goes, by kind of process and by test: runs a command (by default the
parallel part of the suite) while sampling every process's CPU time twice a second.

    python benchmarks/suite_cpu.py                       # the parallel part of .ci/run
    python benchmarks/suite_cpu.py -- pytest -q tests/system/test_faults.py
    python benchmarks/suite_cpu.py -- pytest -q tests/system/test_ssh_faults.py -k group_restart   # one test's cost

An ``atexit`` hook would miss most of it: TensorFlow tasks end by SIGTERM/SIGKILL. A process is
counted to the test named by ``PYTEST_CURRENT_TEST`` in its environment, else to its parent's test
(a host agent's environment is cleared: its zygote and tasks are its children), else to its run id
(processes under sshd or slurmd), which is then found in the run folders under pytest's basetemp:
the test whose temporary folder holds that run's folder. Slurm's daemons inherit the environment of
the test that started the file's test cluster: their job steps are counted to that test.
"""

from __future__ import annotations

import argparse
import collections
import getpass
import os
import re
import subprocess
import sys
import tempfile
import time

import psutil

KINDS = (("ddlctl.task.zygote", "zygote (imports TensorFlow once)"),
         ("ddlctl.workloads", "built-in workload"), ("ddlctl.task.server", "TF server (ps/worker)"),
         ("hostagent", "host agent"), ("ddlctl.host.telemetry", "telemetry agent"), ("-m ddlctl", "ddlctl command"),
         ("pytest", "pytest"), ("sshd", "sshd"), ("slurm", "Slurm daemons and steps"),
         ("python", "other Python (test programs)"))


def kind_of(cmdline: str) -> str:
    """A process's kind, from its command line."""
    return next((name for needle, name in KINDS if needle in cmdline), "other")


def program_of(cmdline: list[str]) -> str:
    """What a Python process runs: its script's name, ``-m MODULE`` or ``-c`` (for the table of
    "other Python": test programs, pytest-xdist's workers)."""
    for i, part in enumerate(cmdline[1:], 1):
        if part in ("-m", "-c"):
            return f"-m {cmdline[i + 1]}" if part == "-m" and i + 1 < len(cmdline) else part
        if part.endswith(".py"):
            return os.path.basename(part)
    return os.path.basename(cmdline[0])


def test_of(p: psutil.Process, parent_test: str) -> str:
    """The test a process is counted to: its environment's, its parent's, or ``run RUN_ID``."""
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        env = {}
    return (env.get("PYTEST_CURRENT_TEST", "").split(" ")[0] or parent_test
            or (f"run {env['DDLCTL_RUN_ID']}" if "DDLCTL_RUN_ID" in env else ""))


def tests_of_runs(basetemp: str) -> dict[str, str]:
    """Run id -> the test whose temporary folder holds that run's folder (pytest's ``basetemp``:
    ``popen-gwN/TESTNAME0/.../RUN_ID``)."""
    found: dict[str, str] = {}
    for root, dirs, _ in os.walk(basetemp):
        for name in dirs:
            if re.match(r"\d{8}-\d{6}-", name):
                test = re.search(r"(?:popen-gw\d+/)?(test_[^/]+)", root[len(basetemp):])
                found[name] = test.group(1) if test else root
        if root.count(os.sep) - basetemp.count(os.sep) > 6:
            dirs[:] = []
    return found


def _folder_name(test: str) -> str:
    """The name pytest gives a test's temporary folder (less its number): non-word characters
    replaced, 30 characters at most."""
    return re.sub(r"\W", "_", test.split("::")[-1])[:30]


def sample(proc: subprocess.Popen, interval: float) -> dict:
    """(pid, start) -> (cpu seconds, kind, test, program) until ``proc`` ends; processes older than ``proc``
    count only the CPU they use from then on."""
    seen: dict[tuple[int, float], tuple[float, str, str, str]] = {}
    base: dict[tuple[int, float], float] = {}
    test_of_pid: dict[int, str] = {}
    born = psutil.Process(proc.pid).create_time()
    while proc.poll() is None:
        for p in psutil.process_iter(["pid", "ppid", "cmdline", "cpu_times", "create_time"]):
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
            test = (old[2] if old else "") or test_of(p, test_of_pid.get(info["ppid"], ""))
            test_of_pid[info["pid"]] = test  # (a pid used again is another process's from now on)
            seen[key] = (cpu, kind_of(" ".join(info["cmdline"])), test, program_of(info["cmdline"]))
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
    runs = tests_of_runs(os.path.join(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}", "pytest-current"))
    named = {_folder_name(test): test for _, _, test, _ in seen.values() if "::" in test}
    programs: collections.Counter[str] = collections.Counter()
    for cpu, kind, test, program in seen.values():
        by_kind[kind] += cpu
        count[kind] += 1
        if kind == KINDS[-1][1]:
            programs[program] += cpu
        if test.startswith("run "):  # a test's run: by its folder, the test's name as pytest shortens it
            folder = runs.get(test[4:], "")
            test = named.get(re.sub(r"\d+$", "", folder), folder or test)
        by_test[test or "(unknown)"] += cpu
    total = sum(by_kind.values())
    print(f"\nwall {wall:.0f} s, machine idle {idle:.0%}, machine busy {busy:.1f} CPU-s, sampled CPU {total:.0f} s, "
          f"exit code {proc.returncode}")
    print(f"{'CPU s':>8} {'procs':>6} {'avg s':>6}  kind")
    for kind, cpu in by_kind.most_common():
        print(f"{cpu:8.1f} {count[kind]:6d} {cpu / count[kind]:6.2f}  {kind}")
    print(f"\n{'CPU s':>8}  {KINDS[-1][1]}, by program (top 12)")
    for program, cpu in programs.most_common(12):
        print(f"{cpu:8.1f}  {program}")
    print(f"\n{'CPU s':>8}  test (top {args.top})")
    for test, cpu in by_test.most_common(args.top):
        print(f"{cpu:8.1f}  {test}")
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
