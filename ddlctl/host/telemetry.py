"""Per-host telemetry agent: ``python -m ddlctl.host.telemetry --host LABEL --run-id ID ...``.

One per host, started by ddlctl over the same transport as the tasks and supervised like them.
It prints JSON lines on stdout (ddlctl streams them into ``telemetry/<host>.jsonl``):

* first ``{"type": "hello", ...}``: host, interval, GPU inventory or why there is none, whether
  psutil is available;
* then every ``--interval`` seconds ``{"type": "sample", "t": epoch_s, ...}`` with host CPU %,
  memory, network byte counters, per-task ``[cpu %, rss bytes, kernel cpu %]`` (each task's
  process, from its folder's ``pid.json``, and the processes below it), every GPU's reading as an
  array in the order of ``hello``'s ``gpu_fields`` (see :class:`ddlctl.host.nvml.GpuSampler`;
  arrays keep hours of samples small and fast to read) and the number of steps each task on this
  host has recorded so far (for the live view).

A missing library (psutil, nvidia-ml-py) or no GPU is reported once in ``hello`` and the agent
goes on with what it has. It exits 0 on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_PID, TASK_STEPS
from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.host.nvml import GpuSampler
from ddlctl.host.procs import tree_of
from ddlctl.host.procsetup import seal
from ddlctl.host.stepfollow import StepFile

RESCAN_S = 5.0


class _Stop(Exception):
    """Raised by the signal handler to end a sleep between samples."""


class HostSampler:
    """psutil figures for the host and the run's task processes (None-filled without psutil).

    A task's processes are the one its host agent started (the pid in the task folder's
    ``pid.json``, checked against the run id and task name in its environment) and everything below
    it: found without looking at the host's other processes, so a busy host costs no more to sample
    than an idle one."""

    def __init__(self, run_id: str, task_dirs: dict[str, str] | None = None) -> None:
        self.run_id = run_id
        self.task_dirs = dict(task_dirs or {})
        self.roots: dict[str, tuple[tuple[int, int], int]] = {}  # task -> (pid.json's stamp, its pid checked)
        try:
            import psutil
        except ImportError:
            self.psutil = None
            return
        self.psutil = psutil
        self.procs: dict[int, tuple[str, object]] = {}
        self.kernel_s: dict[int, tuple[float, float]] = {}  # pid -> (its kernel CPU-s, when read)
        self.next_scan = 0.0
        psutil.cpu_percent(None)  # start the CPU-time baseline

    def _root(self, task: str, folder: str) -> int | None:
        """The pid the host agent started task ``task`` as (its ``pid.json``), once its environment
        says it is that task of this run (not a pid used again, nor a file a task wrote for another)."""
        path = os.path.join(folder, TASK_PID)
        try:
            info = os.stat(path)
            stamp = (info.st_ino, info.st_mtime_ns)  # (written anew by a rename each time)
        except OSError:
            return None
        known = self.roots.get(task)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            with open(path, "rb") as handle:
                pid = int(json.loads(handle.read(1 << 16))["task_pid"])
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = set(handle.read().split(b"\0"))
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if {f"{envvars.RUN_ID}={self.run_id}".encode(), f"{envvars.TASK}={task}".encode()} - environ:
            return None  # (not yet itself: a forked task sets its environment just after the fork)
        self.roots[task] = (stamp, pid)
        return pid

    def _scan(self) -> set[int]:
        """Find the run's task processes; the pids found now (their CPU figures start from now)."""
        psutil = self.psutil
        roots = {pid: task for task, folder in self.task_dirs.items() if (pid := self._root(task, folder))}
        found: dict[int, tuple[str, object]] = {}
        for pid, root in tree_of(list(roots)).items():
            previous = self.procs.get(pid)
            try:
                if previous is None:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)
                    self._kernel_percent(pid, proc.cpu_times().system)
                found[pid] = (roots[root], previous[1] if previous else proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        fresh = set(found) - set(self.procs)
        self.procs = found
        return fresh

    def task_of(self) -> dict[int, str]:
        """pid -> task of the run's processes found by the last scan."""
        return {pid: task for pid, (task, _proc) in getattr(self, "procs", {}).items()}

    def sample(self, now: float) -> dict[str, object]:
        psutil = self.psutil
        if psutil is None:
            return {}
        fresh: set[int] = set()
        if now >= self.next_scan:
            fresh = self._scan()
            self.next_scan = now + RESCAN_S
        tasks: dict[str, list[float]] = {}
        for pid, (task, proc) in list(self.procs.items()):
            if pid in fresh:  # its figures are over the next interval (not the instant since the scan:
                continue  # a CPU tick over a millisecond read as 1,742% of a CPU)
            try:
                with proc.oneshot():  # type: ignore[attr-defined]
                    cpu = proc.cpu_percent(None)  # type: ignore[attr-defined]
                    kernel = self._kernel_percent(pid, proc.cpu_times().system)  # type: ignore[attr-defined]
                    rss = proc.memory_info().rss  # type: ignore[attr-defined]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self.procs.pop(pid, None)  # (its kernel reading goes below)
                continue
            entry = tasks.setdefault(task, [0.0, 0, 0.0])  # CPU %, RSS, of which in the kernel %
            entry[0] += cpu
            entry[1] += rss
            entry[2] += kernel
        for pid in set(self.kernel_s) - set(self.procs):
            del self.kernel_s[pid]
        memory = psutil.virtual_memory()
        net = psutil.net_io_counters()
        return {"cpu": psutil.cpu_percent(None), "mem_used": memory.total - memory.available,
                "mem_total": memory.total, "net_sent": net.bytes_sent, "net_recv": net.bytes_recv,
                "procs": tasks}

    def _kernel_percent(self, pid: int, system_s: float) -> float:
        """The share of a CPU (%) process ``pid`` spent in the kernel since its last reading (0 at the
        first, as psutil's ``cpu_percent``)."""
        now = time.monotonic()
        before = self.kernel_s.get(pid)
        self.kernel_s[pid] = (system_s, now)
        if before is None or now <= before[1]:
            return 0.0
        return round(100.0 * max(0.0, system_s - before[0]) / (now - before[1]), 1)


def gpu_tasks(compute_pids: dict[int, list[int]], task_of: dict[int, str]) -> dict[str, list[int]]:
    """Which GPUs each of the run's tasks uses: the GPUs whose compute processes (``compute_pids``,
    NVML's) include a process of that task (``task_of``: pid -> task, from the process scan)."""
    found: dict[str, set[int]] = {}
    for index, pids in compute_pids.items():
        for pid in pids:
            if pid in task_of:
                found.setdefault(task_of[pid], set()).add(index)
    return {task: sorted(indices) for task, indices in sorted(found.items())}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddlctl.host.telemetry")
    parser.add_argument("--host", required=True, help="host label used in the run")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--watch", action="append", default=[], metavar="TASK=DIR",
                        help="a program task on this host and its task directory (its processes "
                             "and live step counts)")
    parser.add_argument("--task", action="append", default=[], metavar="TASK=DIR",
                        help="another task on this host (a server) and its task directory (its processes)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Sample until SIGTERM; one JSON line per sample on stdout."""
    os.umask(0o077)
    seal()  # (as the host agent: no task can write its samples for it)
    args = parse_args(argv)
    stop = []
    sleeping = []

    def on_signal(*_: object) -> None:
        stop.append(True)
        if sleeping:  # leave at once (a sleep is not interrupted by a signal otherwise), never mid-line
            raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    gpus = GpuSampler()
    folders = dict(item.partition("=")[::2] for item in args.watch + args.task)
    host = HostSampler(args.run_id, folders)
    counters = {}
    for item in args.watch:
        task, _, folder = item.partition("=")
        counters[task] = StepFile(os.path.join(folder, TASK_STEPS))
    hello = {"type": "hello", "t": time.time(), "host": args.host, "interval": args.interval,
             "pid": os.getpid(), "gpus": [asdict(g) for g in gpus.gpus], "driver": gpus.inventory.driver,
             "gpu_note": gpus.note, "psutil": host.psutil is not None, "gpu_fields": list(GPU_FIELDS),
             "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    print(json.dumps(hello), flush=True)
    deadline = time.monotonic()
    used: dict[str, list[int]] = {}
    try:
        while not stop:
            now = time.time()
            record = {"type": "sample", "t": round(now, 3), **host.sample(time.monotonic()),
                      "gpus": [[g.get(f) for f in GPU_FIELDS] for g in gpus.sample()],
                      "steps": {t: c.poll() for t, c in counters.items()}}
            using = gpu_tasks(gpus.compute_pids(), host.task_of()) if gpus.handles else {}
            if using != used:  # which task uses which GPU: said when it changes
                record["gpu_tasks"] = used = using
            sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
            sys.stdout.flush()
            deadline += args.interval  # fixed schedule: no drift
            delay = deadline - time.monotonic()
            if delay > 0:
                sleeping.append(True)
                try:
                    if not stop:
                        time.sleep(delay)
                finally:
                    sleeping.clear()
            else:
                deadline = time.monotonic()
    except (BrokenPipeError, _Stop):
        pass
    finally:
        gpus.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
