"""The run summary: a pure function of the run directory (``ddlctl report`` on a copied run
directory gives the same answer as the live run).

Inputs: ``plan.json``, ``outcome.json``, ``tasks/*/steps.jsonl``, ``tasks/*/result.json``,
``telemetry/*.jsonl``. Output: :class:`RunSummary`, whose :meth:`RunSummary.to_dict` is
``summary.json`` (keys documented in the README, ``schema`` 1).

Rules, stated once:

* warm-up: the first ``warmup_steps`` records of each task are left out of every statistic;
* percentiles: linear interpolation between closest ranks (numpy's default);
* throughput: post-warm-up samples of all tasks / the post-warm-up time window (first kept start to
  last kept end over all tasks) -- never a mean of per-step rates;
* straggler: a task whose median step time is > 1.10 x the fleet median (median of the tasks'
  medians), or, in synchronous training where step times are coupled, whose median *arrival* at
  the synchronisation point (step start + ``sync_s``: gradients ready) is later than the earliest
  task's by more than 10% of the fleet median step time;
* telemetry gap: no sample from a host for more than 3 sampling intervals while the run went on.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddlctl.rundir import task_dirs

DEFAULT_WARMUP_STEPS = 5
STRAGGLER_RATIO = 1.10
LATE_ARRIVAL_FRACTION = 0.10
INPUT_BOUND_FRACTION = 0.30
GPU_IDLE_UTIL = 50.0
MEMORY_FULL_FRACTION = 0.95
CPU_SATURATED = 90.0
GAP_INTERVALS = 3.0


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """``p``-th percentile (0-100) of already sorted values, linear interpolation."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = (n - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, n - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if len(values) else None


def _median(values: Iterable[float]) -> float | None:
    return percentile(sorted(values), 50)


@dataclass
class TaskSteps:
    """Step records of one task, as compact columns."""

    name: str
    step: array = field(default_factory=lambda: array("q"))
    start_us: array = field(default_factory=lambda: array("q"))
    duration: array = field(default_factory=lambda: array("d"))
    samples: array = field(default_factory=lambda: array("q"))  # -1: unknown
    input_s: array = field(default_factory=lambda: array("d"))  # -1: not recorded
    sync_s: array = field(default_factory=lambda: array("d"))  # -1: not recorded
    block: int = 1  # steps per record (steps_per_execution)
    bad_lines: int = 0


def read_steps(path: Path, name: str) -> TaskSteps:
    """Parse one ``steps.jsonl``; unreadable lines (e.g. a task killed mid-write) are counted."""
    steps = TaskSteps(name)
    if not path.is_file():
        return steps
    loads = json.loads
    with path.open("rb") as handle:
        for line in handle:
            try:
                raw = loads(line)
                steps.step.append(int(raw["step"]))
                steps.start_us.append(int(raw["start_us"]))
                steps.duration.append(float(raw["duration_s"]))
                samples = raw.get("samples")
                steps.samples.append(-1 if samples is None else int(samples))
                value = raw.get("input_s")
                steps.input_s.append(-1.0 if value is None else float(value))
                value = raw.get("sync_s")
                steps.sync_s.append(-1.0 if value is None else float(value))
                steps.block = max(steps.block, int(raw.get("steps", 1)))
                if raw.get("task"):
                    steps.name = str(raw["task"])
            except (ValueError, KeyError, TypeError):
                steps.bad_lines += 1
    return steps


@dataclass(frozen=True)
class TaskSummary:
    name: str
    host: str | None
    role: str | None
    state: str | None
    exit_code: int | None
    steps: int
    kept_steps: int
    steps_per_record: int
    step_time_p50_s: float | None
    step_time_p90_s: float | None
    step_time_p99_s: float | None
    samples_per_s: float | None
    input_fraction: float | None
    arrival_lateness_p50_s: float | None
    straggler: bool
    straggler_reason: str | None
    loss: float | None
    accuracy: float | None
    cpu_mean: float | None = None
    rss_peak_bytes: int | None = None


@dataclass(frozen=True)
class GpuSummary:
    index: int
    name: str | None
    util_mean: float | None
    util_p5: float | None
    sm_active_mean: float | None
    mem_peak_bytes: int | None
    mem_total_bytes: int | None
    power_mean_w: float | None
    power_peak_w: float | None


@dataclass(frozen=True)
class HostSummary:
    host: str
    samples: int
    cpu_util_mean: float | None
    mem_peak_bytes: int | None
    mem_total_bytes: int | None
    net_sent_bytes_per_s: float | None
    net_recv_bytes_per_s: float | None
    gpu_note: str | None
    gpus: tuple[GpuSummary, ...]
    gaps: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    strategy: str
    wall_time_s: float | None
    warmup_steps: int
    hosts_count: int
    gpus_count: int
    tasks_count: int
    global_batch: int | None
    throughput_samples_per_s: float | None
    throughput_steps_per_s: float | None
    total_steps: int
    skipped_lines: int
    tasks: tuple[TaskSummary, ...]
    hosts: tuple[HostSummary, ...]
    diagnosis: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """``summary.json`` (``schema`` 1)."""
        data = asdict(self)
        data = {"schema": 1, **data}
        for host in data["hosts"]:
            host["gaps"] = [{"start": a, "end": b} for a, b in host["gaps"]]
        return data


# -- telemetry -------------------------------------------------------------------------------


@dataclass
class _GpuSeries:
    name: str | None = None
    util: array = field(default_factory=lambda: array("d"))
    sm: array = field(default_factory=lambda: array("d"))
    mem: array = field(default_factory=lambda: array("d"))
    mem_total: float | None = None
    power: array = field(default_factory=lambda: array("d"))


@dataclass
class _HostSeries:
    host: str
    interval: float = 1.0
    gpu_note: str | None = None
    t: array = field(default_factory=lambda: array("d"))
    cpu: array = field(default_factory=lambda: array("d"))
    mem: array = field(default_factory=lambda: array("d"))
    mem_total: float | None = None
    net: list[tuple[float, float, float]] = field(default_factory=list)
    gpus: dict[int, _GpuSeries] = field(default_factory=dict)
    procs: dict[str, tuple[array, array]] = field(default_factory=dict)
    bad_lines: int = 0


def read_telemetry(path: Path) -> _HostSeries:
    """Parse one ``telemetry/<host>.jsonl``."""
    series = _HostSeries(path.stem)
    loads = json.loads
    with path.open("rb") as handle:
        for line in handle:
            try:
                raw = loads(line)
            except ValueError:
                series.bad_lines += 1
                continue
            kind = raw.get("type")
            if kind == "hello":
                series.host = raw.get("host", series.host)
                series.interval = float(raw.get("interval", 1.0))
                series.gpu_note = raw.get("gpu_note")
                for gpu in raw.get("gpus", []):
                    entry = series.gpus.setdefault(int(gpu["index"]), _GpuSeries())
                    entry.name = gpu.get("name")
                    entry.mem_total = gpu.get("memory_total_bytes")
                continue
            if kind != "sample":
                continue
            series.t.append(float(raw["t"]))
            if raw.get("cpu") is not None:
                series.cpu.append(float(raw["cpu"]))
            if raw.get("mem_used") is not None:
                series.mem.append(float(raw["mem_used"]))
                series.mem_total = raw.get("mem_total")
            if raw.get("net_sent") is not None:
                series.net.append((float(raw["t"]), float(raw["net_sent"]), float(raw["net_recv"])))
            for gpu in raw.get("gpus", ()):
                entry = series.gpus.setdefault(int(gpu["index"]), _GpuSeries())
                if gpu.get("util") is not None:
                    entry.util.append(gpu["util"])
                if gpu.get("sm_active") is not None:
                    entry.sm.append(gpu["sm_active"])
                if gpu.get("mem_used") is not None:
                    entry.mem.append(gpu["mem_used"])
                if gpu.get("mem_total"):
                    entry.mem_total = gpu["mem_total"]
                if gpu.get("power_w") is not None:
                    entry.power.append(gpu["power_w"])
            for task, figures in (raw.get("procs") or {}).items():
                cpu, rss = series.procs.setdefault(task, (array("d"), array("d")))
                cpu.append(figures.get("cpu", 0.0))
                rss.append(figures.get("rss", 0))
    return series


def _gaps(series: _HostSeries, run_start: float | None, run_end: float | None) -> tuple[tuple[float, float], ...]:
    limit = GAP_INTERVALS * series.interval
    times = sorted(series.t)
    gaps = []
    if not times:
        return ((run_start, run_end),) if run_start is not None and run_end is not None else ()
    if run_start is not None and times[0] - run_start > limit + 5.0:  # agent start-up allowance
        gaps.append((run_start, times[0]))
    for before, after in zip(times, times[1:], strict=False):
        if after - before > limit:
            gaps.append((before, after))
    if run_end is not None and run_end - times[-1] > limit:
        gaps.append((times[-1], run_end))
    return tuple(gaps)


def _host_summary(series: _HostSeries, run_start: float | None, run_end: float | None) -> HostSummary:
    gpus = []
    for index, gpu in sorted(series.gpus.items()):
        util = sorted(gpu.util)
        gpus.append(GpuSummary(
            index=index, name=gpu.name, util_mean=mean(gpu.util), util_p5=percentile(util, 5),
            sm_active_mean=mean(gpu.sm), mem_peak_bytes=int(max(gpu.mem)) if gpu.mem else None,
            mem_total_bytes=int(gpu.mem_total) if gpu.mem_total else None,
            power_mean_w=mean(gpu.power), power_peak_w=max(gpu.power) if gpu.power else None))
    sent = recv = None
    if len(series.net) >= 2 and series.net[-1][0] > series.net[0][0]:
        span = series.net[-1][0] - series.net[0][0]
        sent = (series.net[-1][1] - series.net[0][1]) / span
        recv = (series.net[-1][2] - series.net[0][2]) / span
    return HostSummary(
        host=series.host, samples=len(series.t), cpu_util_mean=mean(series.cpu),
        mem_peak_bytes=int(max(series.mem)) if series.mem else None,
        mem_total_bytes=int(series.mem_total) if series.mem_total else None,
        net_sent_bytes_per_s=sent, net_recv_bytes_per_s=recv, gpu_note=series.gpu_note,
        gpus=tuple(gpus), gaps=_gaps(series, run_start, run_end))


# -- steps -----------------------------------------------------------------------------------


def _kept(steps: TaskSteps, warmup: int) -> slice:
    return slice(warmup, None) if len(steps.step) > warmup else slice(0, 0)


def _window_rate(columns: Sequence[tuple[TaskSteps, slice]]) -> tuple[float | None, float | None, int]:
    """(samples/s, records/s, records) over the union time window of the kept records."""
    start = end = None
    samples = records = 0
    known = True
    for steps, kept in columns:
        starts, durations = steps.start_us[kept], steps.duration[kept]
        if not starts:
            continue
        first = min(starts)
        last = max(s + d * 1e6 for s, d in zip(starts, durations, strict=True))
        start = first if start is None else min(start, first)
        end = last if end is None else max(end, last)
        counts = steps.samples[kept]
        known = known and min(counts) >= 0
        samples += sum(counts)
        records += len(starts)
    if start is None or end is None or end <= start:
        return None, None, records
    span = (end - start) / 1e6
    return (samples / span if known else None), records / span, records


def _arrival_lateness(all_steps: Sequence[TaskSteps], warmup: int) -> dict[str, float]:
    """Median lateness of each task's arrival at the synchronisation point (start + ``sync_s``)
    behind the earliest task, over step numbers present in every task (synchronous training)."""
    arrivals: dict[str, dict[int, float]] = {}
    for steps in all_steps:
        kept = _kept(steps, warmup)
        if not steps.sync_s or min(steps.sync_s[kept] or [-1]) < 0:
            return {}
        arrivals[steps.name] = {s: st / 1e6 + sync for s, st, sync in
                                zip(steps.step[kept], steps.start_us[kept], steps.sync_s[kept], strict=True)}
    common = set.intersection(*(set(a) for a in arrivals.values())) if arrivals else set()
    if len(arrivals) < 2 or not common:
        return {}
    late: dict[str, list[float]] = {name: [] for name in arrivals}
    for step in common:
        first = min(a[step] for a in arrivals.values())
        for name, a in arrivals.items():
            late[name].append(a[step] - first)
    return {name: _median(values) or 0.0 for name, values in late.items()}


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def summarize(run_dir: str | Path, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> RunSummary:
    """Summary of the run in ``run_dir``."""
    run_dir = Path(run_dir)
    plan = _load_json(run_dir / "plan.json")
    outcome = _load_json(run_dir / "outcome.json")
    planned = {t["name"]: t for t in plan.get("tasks", [])}
    ended = {t["name"]: t for t in outcome.get("tasks", [])}

    all_steps: list[TaskSteps] = []
    results: dict[str, dict] = {}
    for folder in task_dirs(run_dir):
        name = folder.name.replace("-", ":", 1)
        steps = read_steps(folder / "steps.jsonl", name)
        result = _load_json(folder / "result.json")
        if steps.step or result:
            all_steps.append(steps)
            results[steps.name] = result
    telemetry = [read_telemetry(p) for p in sorted((run_dir / "telemetry").glob("*.jsonl"))]

    synchronous = plan.get("strategy") != "ps"
    medians: dict[str, float] = {}
    for steps in all_steps:
        kept = sorted(steps.duration[_kept(steps, warmup_steps)])
        if kept:
            medians[steps.name] = percentile(kept, 50) or 0.0
    fleet = _median(medians.values())
    lateness = _arrival_lateness(all_steps, warmup_steps) if synchronous else {}
    procs = {task: figures for series in telemetry for task, figures in series.procs.items()}

    tasks = []
    for steps in all_steps:
        kept = _kept(steps, warmup_steps)
        durations = sorted(steps.duration[kept])
        rate, _, _ = _window_rate([(steps, kept)])
        reason = None
        median = medians.get(steps.name)
        if fleet and median is not None and len(medians) > 1 and median > STRAGGLER_RATIO * fleet:
            reason = f"median step {median * 1e3:.1f} ms vs fleet median {fleet * 1e3:.1f} ms"
        late = lateness.get(steps.name)
        if fleet and late is not None and late > LATE_ARRIVAL_FRACTION * fleet:
            reason = f"arrives {late * 1e3:.1f} ms after the first task at each synchronisation " \
                     f"(fleet median step {fleet * 1e3:.1f} ms)"
        inputs = [v for v in steps.input_s[kept] if v >= 0]
        input_fraction = sum(inputs) / sum(steps.duration[kept]) if inputs and sum(steps.duration[kept]) else None
        info = planned.get(steps.name, {})
        end = ended.get(steps.name, {})
        exit_text = end.get("exit") or ""
        cpu, rss = procs.get(steps.name, ((), ()))
        tasks.append(TaskSummary(
            name=steps.name, host=info.get("host"), role=info.get("role"), state=end.get("state"),
            exit_code=int(exit_text.rsplit(" ", 1)[1]) if exit_text.startswith("exit code") else None,
            steps=len(steps.step), kept_steps=len(durations), steps_per_record=steps.block,
            step_time_p50_s=percentile(durations, 50), step_time_p90_s=percentile(durations, 90),
            step_time_p99_s=percentile(durations, 99), samples_per_s=rate, input_fraction=input_fraction,
            arrival_lateness_p50_s=late, straggler=reason is not None, straggler_reason=reason,
            loss=results.get(steps.name, {}).get("loss"), accuracy=results.get(steps.name, {}).get("accuracy"),
            cpu_mean=mean(cpu) if cpu else None, rss_peak_bytes=int(max(rss)) if rss else None))

    columns = [(s, _kept(s, warmup_steps)) for s in all_steps]
    throughput, record_rate, _ = _window_rate(columns)
    step_rate = None
    if record_rate is not None and all_steps:
        # synchronous tasks record the same steps: count a global step once
        per_step_records = len(all_steps) if synchronous else 1
        step_rate = record_rate * max(s.block for s in all_steps) / per_step_records

    starts = [s.start_us[0] / 1e6 for s in all_steps if s.start_us]
    ends = [max(st / 1e6 + d for st, d in zip(s.start_us, s.duration, strict=True)) for s in all_steps if s.start_us]
    run_start = min(starts) if starts else None
    run_end = max(ends) if ends else None
    hosts = tuple(_host_summary(series, run_start, run_end) for series in telemetry)

    wall = outcome.get("wall_time_s")
    if wall is None and run_start is not None and run_end is not None:
        wall = run_end - run_start
    request = plan.get("request", {})
    batch = None
    args = list(request.get("workload_args") or [])
    if "--batch-size" in args and not request.get("command"):
        batch = int(args[args.index("--batch-size") + 1])
    used_hosts = {t.get("host") for t in planned.values()}
    gpus_count = sum(len(h.gpus) for h in hosts) or sum(
        h.get("gpus", 0) for h in plan.get("cluster", {}).get("hosts", [])
        if h.get("name") in {u.split("@")[-1].split(":")[0] for u in used_hosts if u})

    summary = RunSummary(
        run_id=str(plan.get("run_id", run_dir.name)), strategy=str(plan.get("strategy", "?")),
        wall_time_s=wall, warmup_steps=warmup_steps, hosts_count=len(used_hosts) or len(hosts),
        gpus_count=gpus_count, tasks_count=len(planned) or len(all_steps), global_batch=batch,
        throughput_samples_per_s=throughput, throughput_steps_per_s=step_rate,
        total_steps=sum(len(s.step) for s in all_steps),
        skipped_lines=sum(s.bad_lines for s in all_steps) + sum(t.bad_lines for t in telemetry),
        tasks=tuple(tasks), hosts=hosts, diagnosis=())
    return _with_diagnosis(summary, outcome)


def _with_diagnosis(summary: RunSummary, outcome: dict) -> RunSummary:
    """Add the few lines a person can act on."""
    lines = []
    for task in summary.tasks:
        if task.straggler:
            lines.append(f"straggler: {task.name} on {task.host}: {task.straggler_reason}")
        if task.input_fraction is not None and task.input_fraction > INPUT_BOUND_FRACTION:
            lines.append(f"input-bound on {task.host}: {task.name} spends {task.input_fraction:.0%} of each "
                         f"step waiting for input (parallel map, prefetch, more CPU for the input pipeline)")
    for host in summary.hosts:
        for gpu in host.gpus:
            if gpu.util_mean is not None and gpu.util_mean < GPU_IDLE_UTIL:
                lines.append(f"GPU {gpu.index} on {host.host} mostly idle: busy {gpu.util_mean:.0f}% of the "
                             f"time (idle {100 - gpu.util_mean:.0f}%)")
            if gpu.mem_peak_bytes and gpu.mem_total_bytes and \
                    gpu.mem_peak_bytes > MEMORY_FULL_FRACTION * gpu.mem_total_bytes:
                lines.append(f"GPU {gpu.index} on {host.host} memory near full: peak "
                             f"{gpu.mem_peak_bytes / gpu.mem_total_bytes:.0%} of {gpu.mem_total_bytes / 2**30:.0f} GiB")
        if host.cpu_util_mean is not None and host.cpu_util_mean > CPU_SATURATED:
            lines.append(f"CPU saturated on {host.host}: mean {host.cpu_util_mean:.0f}% (input pipeline, or "
                         f"too many tasks for its cores)")
        for start, end in host.gaps:
            lines.append(f"telemetry gap on {host.host}: no samples for {end - start:.1f}s")
    for gap in outcome.get("telemetry_gaps", []):
        lines.append(gap)
    return RunSummary(**{**{f: getattr(summary, f) for f in summary.__dataclass_fields__},
                         "diagnosis": tuple(lines)})
