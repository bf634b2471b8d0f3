"""What each host's GPUs and each task's process did lately, from the telemetry agents' samples:
read by the hang watch to say what a stalled task's GPUs were doing since its last step, and to
blame, among tasks that all wait in a library, the one whose GPU sat idle while its peers' GPUs
ran kernels that never ended, or the one whose process kept a CPU busy while the others idled.

Why this tells hangs apart (see DESIGN.md): NVML's utilisation says that *a* kernel was running.
A collective that waits for a peer (an NCCL all-reduce whose peer never joins) is a kernel that
spins on the GPU until the peer comes, so the waiting tasks' GPUs read ~100% busy with no step
made, while the task that holds them up sits in host code with its GPU idle. A kernel that loops
reads the same as a waiting collective; an idle GPU says the stall is on the host (input, a lock,
the CPU, a peer's message). On the CPU it is the other way round: a task waiting for its peers in
a collective (gRPC) uses next to no CPU, while one that holds them up by working or spinning in
native code (a ``tf.data`` filter that never lets an element through, an op that never ends)
keeps a CPU busy; its stack only shows it waiting in TensorFlow. Not on GPUs: NCCL's proxy thread
spins on the CPU of a rank that waits, so a GPU job is read by its GPUs alone.

Pure bookkeeping over the samples (``gpus`` arrays in the order of the agent's ``gpu_fields``;
``procs``: each task's CPU % of one core and RSS); the clock is the supervisor's, taken when a
sample arrived, so hosts' clocks never matter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.host.devices import visible_devices

#: How much of each GPU's recent history is kept (seconds of the supervisor's clock).
WINDOW_S = 900.0
#: A reading at or above this utilisation (%) is busy: a kernel ran nearly all of the interval.
BUSY_UTIL = 90.0
#: A reading at or below this utilisation (%) is idle.
IDLE_UTIL = 5.0
#: The share of a stall's readings that must agree to call the GPU busy, or idle.
MOSTLY = 0.8
#: Fewer readings than this over a stall say nothing.
MIN_READINGS = 3
#: A task's process busy over a stall: at least this % of one core on average ...
BUSY_CPU = 25.0
#: ... and this many times the busiest of the other stalled tasks (waiting processes idle).
BUSIER = 4.0


@dataclass(frozen=True)
class GpuActivity:
    """What a task's GPUs did over a stall: ``readings`` samples; in how many every one of its
    GPUs was busy, or idle; the mean utilisation over them all."""

    host: str
    gpus: tuple[int, ...]
    seconds: float
    readings: int
    busy: int
    idle: int
    util_mean: float

    @property
    def state(self) -> str:
        """"busy" (kernels running all along), "idle", "mixed", or "unknown" (too few readings)."""
        if self.readings < MIN_READINGS:
            return "unknown"
        if self.busy >= MOSTLY * self.readings:
            return "busy"
        if self.idle >= MOSTLY * self.readings:
            return "idle"
        return "mixed"

    @property
    def where(self) -> str:
        """``GPU 0`` / ``GPUs 0,1`` on the host."""
        label = "GPU" if len(self.gpus) == 1 else "GPUs"
        return f"{label} {','.join(map(str, self.gpus))} on {self.host}"

    def describe(self) -> str:
        """One clause for a hang line."""
        span = f"{self.seconds:.0f}s since its last progress"
        if self.state == "busy":
            return (f"its {self.where} ran kernels all along ({self.util_mean:.0f}% busy over the {span}) with no "
                    "step made: a kernel that does not end (a collective waiting for a peer that never joins it, "
                    "or a loop on the device)")
        if self.state == "idle":
            return f"its {self.where} sat idle ({self.util_mean:.0f}% busy over the {span}): the stall is on the host"
        if self.state == "mixed":
            return f"its {self.where} was {self.util_mean:.0f}% busy over the {span}"
        return f"its {self.where}: too few telemetry readings over the {span} to say"

    def record(self) -> dict:
        """The figures for ``outcome.json``'s hang records."""
        return {"host": self.host, "gpus": list(self.gpus), "state": self.state, "readings": self.readings,
                "util_mean": round(self.util_mean, 1), "seconds": round(self.seconds, 1)}


@dataclass(frozen=True)
class CpuActivity:
    """What a task's processes did on the CPU over a stall: ``readings`` samples, their mean (%
    of one core)."""

    task: str
    seconds: float
    readings: int
    cpu_mean: float

    def describe(self) -> str:
        """One clause for a hang line."""
        return (f"its process used {self.cpu_mean:.0f}% of a CPU core over the {self.seconds:.0f}s since its last "
                "progress")

    def record(self) -> dict:
        """The figures for ``outcome.json``'s hang records."""
        return {"readings": self.readings, "cpu_mean": round(self.cpu_mean, 1), "seconds": round(self.seconds, 1)}


class _HostGpus:
    """One host's GPU readings: (time, {NVML index: utilisation}) newest last."""

    def __init__(self) -> None:
        self.fields: list[str] = list(GPU_FIELDS)
        self.uuids: dict[str, int] = {}
        self.given: str | None = None  # the agent's own CUDA_VISIBLE_DEVICES
        self.task_gpus: dict[str, tuple[int, ...]] = {}  # which GPUs NVML saw each task's processes use
        self.readings: deque[tuple[float, dict[int, float]]] = deque()


class ActivityWatch:
    """Recent GPU utilisation of every host whose telemetry agent reports GPUs, which GPUs each task
    uses, and each task's CPU (the telemetry agents' samples, as the supervisor receives them)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.hosts: dict[str, _HostGpus] = {}
        self.tasks: dict[str, deque[tuple[float, float]]] = {}  # task -> (time, CPU % of one core)

    def add(self, host: str, record: Mapping[str, object], now: float) -> None:
        """A telemetry agent's line (its hello, or a sample) from ``host``, received at ``now``."""
        kind = record.get("type")
        if kind == "hello":
            mine = self.hosts.setdefault(host, _HostGpus())
            mine.fields = list(record.get("gpu_fields") or GPU_FIELDS)  # type: ignore[call-overload]
            mine.uuids = {str(g["uuid"]): int(g["index"]) for g in record.get("gpus") or []  # type: ignore[attr-defined]
                          if isinstance(g, dict) and g.get("uuid") and g.get("index") is not None}
            given = record.get("cuda_visible")
            mine.given = str(given) if given else None
            return
        if kind != "sample":
            return
        self._add_cpu(record.get("procs"), now)
        using = record.get("gpu_tasks")
        if isinstance(using, dict):
            self.hosts.setdefault(host, _HostGpus()).task_gpus = {
                str(t): tuple(int(i) for i in v) for t, v in using.items() if isinstance(v, list)}
        gpus = record.get("gpus")
        if not gpus:
            return
        mine = self.hosts.setdefault(host, _HostGpus())
        try:
            at_index, at_util = mine.fields.index("index"), mine.fields.index("util")
        except ValueError:
            return
        reading: dict[int, float] = {}
        for entry in gpus:  # type: ignore[attr-defined]
            values = entry if isinstance(entry, list) else [entry.get(f) for f in mine.fields]
            if len(values) > max(at_index, at_util) and values[at_index] is not None and values[at_util] is not None:
                reading[int(values[at_index])] = float(values[at_util])
        if reading:
            mine.readings.append((now, reading))
        while mine.readings and mine.readings[0][0] < now - self.window_s:
            mine.readings.popleft()

    def _add_cpu(self, procs: object, now: float) -> None:
        """Each task's CPU % from a sample's ``procs`` (task -> [CPU %, RSS])."""
        if not isinstance(procs, dict):
            return
        for task, figures in procs.items():
            if isinstance(figures, list) and figures and isinstance(figures[0], int | float):
                readings = self.tasks.setdefault(str(task), deque())
                readings.append((now, float(figures[0])))
                while readings and readings[0][0] < now - self.window_s:
                    readings.popleft()

    def cpu(self, task: str, since: float, now: float) -> CpuActivity | None:
        """What ``task``'s processes did on the CPU between ``since`` and ``now``; None with no
        readings (no telemetry, no psutil)."""
        values = [cpu for t, cpu in self.tasks.get(task, ()) if since < t <= now]
        if not values:
            return None
        return CpuActivity(task, max(0.0, now - since), len(values), sum(values) / len(values))

    def indices(self, host: str, planned: Sequence[int] | None) -> tuple[int, ...] | None:
        """The NVML indices of the GPUs a task sees: the plan's (numbered 0..N-1 among those the host
        gives ddlctl: the host agent maps them through its own ``CUDA_VISIBLE_DEVICES``, as here),
        or every GPU of the host when the plan pinned none; None when unknown."""
        mine = self.hosts.get(host)
        if mine is None or not mine.readings:
            return None
        if planned is None:
            return tuple(sorted(mine.readings[-1][1]))
        resolved = visible_devices(",".join(map(str, planned)), mine.given)
        found = []
        for entry in (e.strip() for e in resolved.split(",") if e.strip()):
            if entry.isdigit():
                found.append(int(entry))
            elif entry in mine.uuids:
                found.append(mine.uuids[entry])
            else:
                return None  # a MIG instance or a name NVML does not list: unknown
        return tuple(found)

    def gpu(self, host: str, planned: Sequence[int] | None, since: float, now: float,
            task: str | None = None) -> GpuActivity | None:
        """What the GPUs of ``task`` on ``host`` did between ``since`` and ``now``: those NVML saw
        its processes use (the telemetry agent's ``gpu_tasks``), else its plan's ``planned`` GPUs
        (:meth:`indices`); None for a task with no GPU, or a host with no GPU readings."""
        mine = self.hosts.get(host)
        seen = mine.task_gpus.get(task) if mine is not None and task else None
        indices = seen if seen and mine is not None and mine.readings else self.indices(host, planned)
        if not indices:
            return None
        readings = [r for t, r in self.hosts[host].readings if since < t <= now and all(i in r for i in indices)]
        utils = [r[i] for r in readings for i in indices]
        return GpuActivity(host, indices, max(0.0, now - since), len(readings),
                           busy=sum(all(r[i] >= BUSY_UTIL for i in indices) for r in readings),
                           idle=sum(all(r[i] <= IDLE_UTIL for i in indices) for r in readings),
                           util_mean=sum(utils) / len(utils) if utils else 0.0)


def idle_among_busy(activities: Mapping[str, GpuActivity | None]) -> list[str]:
    """The tasks whose GPUs sat idle over the stall while another task's GPUs ran kernels all
    along: those peers wait in a collective for them (empty unless both are seen)."""
    states = {n: a.state for n, a in activities.items() if a is not None}
    if "busy" not in states.values():
        return []
    return [n for n, s in states.items() if s == "idle"]


def busy_among_idle(activities: Mapping[str, CpuActivity | None]) -> list[str]:
    """The task whose processes kept a CPU busy over the stall (:data:`BUSY_CPU`) while every
    other stalled task's idled (:data:`BUSIER` times less): the others wait for it (empty unless
    every task has enough readings)."""
    seen = {n: a for n, a in activities.items() if a is not None and a.readings >= MIN_READINGS}
    if len(seen) < 2 or len(seen) < len(activities):
        return []
    busiest = max(seen, key=lambda n: seen[n].cpu_mean)
    rest = max(a.cpu_mean for n, a in seen.items() if n != busiest)
    mine = seen[busiest].cpu_mean
    return [busiest] if mine >= BUSY_CPU and mine >= BUSIER * rest else []
