"""Per-host telemetry agent: ``python -m ddlctl.host.telemetry --host LABEL --run-id ID ...``.

One per host, started by ddlctl over the same transport as the tasks and supervised like them.
It prints JSON lines on stdout (ddlctl streams them into ``telemetry/<host>.jsonl``):

* first ``{"type": "hello", ...}``: host, interval, GPU inventory or why there is none, whether
  psutil is available;
* then every ``--interval`` seconds ``{"type": "sample", "t": epoch_s, ...}`` with host CPU %,
  memory, network byte counters, per-task ``[cpu %, rss bytes, kernel cpu %]`` (processes found by the run id in
  their environment), every GPU's reading as an array in the order of ``hello``'s ``gpu_fields``
  (see :class:`ddlctl.host.nvml.GpuSampler`; arrays keep hours of samples small and fast to
  read) and the number of steps each task on this host has recorded so far (for the live view).

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
from ddlctl.contract.rundir import TASK_STEPS
from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.host.nvml import GpuSampler
from ddlctl.host.procsetup import seal
from ddlctl.host.stepfollow import StepFile

WATCHDOG_MARK = "ddlctl.host.watchdog"
RESCAN_S = 5.0


class _Stop(Exception):
    """Raised by the signal handler to end a sleep between samples."""


class HostSampler:
    """psutil figures for the host and the run's task processes (None-filled without psutil)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
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

    def _scan(self) -> set[int]:
        """Find the run's task processes; the pids found now (their CPU figures start from now)."""
        psutil = self.psutil
        found: dict[int, tuple[str, object]] = {}
        me = os.getpid()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid == me:
                    continue
                env = proc.environ()
                task = env.get(envvars.TASK)
                if env.get(envvars.RUN_ID) != self.run_id or not task or task.startswith("agent"):
                    continue
                if any(WATCHDOG_MARK in part for part in proc.info["cmdline"] or ()):
                    continue
                previous = self.procs.get(proc.pid)
                if previous is None:
                    proc.cpu_percent(None)
                    self._kernel_percent(proc.pid, proc.cpu_times().system)
                found[proc.pid] = (task, previous[1] if previous else proc)
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
                        help="a task on this host and its task directory (for live step counts)")
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
    host = HostSampler(args.run_id)
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
