"""A host's telemetry file (``telemetry/<host>.jsonl``) as series, and its summary: CPU, memory,
GPUs (utilisation, SM activity, memory, power, throttling) and the gaps in its sampling."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlctl.report.gpudiag import Sample, diagnose_gpu, throttling
from ddlctl.report.stats import mean, percentile
from ddlctl.report.stepfile import parse_json_lines
from ddlctl.telemetry.nvml import GPU_FIELDS

GAP_INTERVALS = 3.0


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
    power_limit_w: float | None = None
    sm_clock_busy_mean_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    power_capped_share: float | None = None
    thermal_capped_share: float | None = None
    temp_peak_c: float | None = None
    diagnosis: tuple[str, ...] = ()


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


@dataclass
class GpuSeries:
    name: str | None = None
    util: array = field(default_factory=lambda: array("d"))
    sm: array = field(default_factory=lambda: array("d"))
    mem: array = field(default_factory=lambda: array("d"))
    mem_total: float | None = None
    power: array = field(default_factory=lambda: array("d"))
    samples: list = field(default_factory=list)  # gpudiag.Sample per reading (clock, throttle reasons...)
    sm_clock_max: float | None = None
    power_limit: float | None = None


@dataclass
class HostSeries:
    host: str
    interval: float = 1.0
    gpu_note: str | None = None
    t: array = field(default_factory=lambda: array("d"))
    cpu: array = field(default_factory=lambda: array("d"))
    mem: array = field(default_factory=lambda: array("d"))
    mem_total: float | None = None
    net: list[tuple[float, float, float]] = field(default_factory=list)
    gpus: dict[int, GpuSeries] = field(default_factory=dict)
    procs: dict[str, tuple[array, array]] = field(default_factory=dict)
    bad_lines: int = 0


def _column(items: list[dict], key: str) -> array:
    return array("d", [float(v) for v in (item.get(key) for item in items) if v is not None])


#: The readings a :class:`Sample` holds, in its order.
SAMPLE_FIELDS = ("util", "sm_active", "sm_clock_mhz", "throttle", "power_w", "temp_c")


def _columns(rows: list[list]) -> Callable[[int | None], Sequence]:
    """Column ``position`` of ``rows`` (None where a row has none; all None for a field not sent).
    The rows are transposed once in C; a short row (an older agent) shortens every column, and the
    positions past it are read row by row."""
    columns = list(zip(*rows, strict=False))

    def column(position: int | None) -> Sequence:
        if position is None:
            return (None,) * len(rows)
        if position < len(columns):
            return columns[position]
        return [row[position] if len(row) > position else None for row in rows]

    return column


def _values(column: Sequence) -> array:
    """A column without its nulls."""
    return array("d", [v for v in column if v is not None])


def read_telemetry(path: Path) -> HostSeries:
    """Parse one ``telemetry/<host>.jsonl`` (column by column: hours of samples stay fast)."""
    series = HostSeries(path.stem)
    records, series.bad_lines = parse_json_lines(path.read_bytes())
    samples = []
    fields = list(GPU_FIELDS)
    for raw in records:
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "sample" and isinstance(raw.get("t"), (int, float)):
            samples.append(raw)
        elif kind == "hello":
            series.host = str(raw.get("host", series.host))
            series.interval = float(raw.get("interval", 1.0))
            series.gpu_note = raw.get("gpu_note")
            fields = list(raw.get("gpu_fields") or fields)
            for gpu in raw.get("gpus") or []:
                entry = series.gpus.setdefault(int(gpu["index"]), GpuSeries())
                entry.name = gpu.get("name")
                entry.mem_total = gpu.get("memory_total_bytes")
                entry.sm_clock_max = gpu.get("sm_clock_max_mhz")
                entry.power_limit = gpu.get("power_limit_w")
        elif kind != "error":  # agents report problems as {"type": "error"}; anything else is unreadable
            series.bad_lines += 1
    series.t = _column(samples, "t")
    series.cpu = _column(samples, "cpu")
    series.mem = _column(samples, "mem_used")
    totals = [r["mem_total"] for r in samples if r.get("mem_total")]
    series.mem_total = totals[-1] if totals else None
    series.net = [(float(r["t"]), float(r["net_sent"]), float(r["net_recv"])) for r in (samples[0], samples[-1])
                  if r.get("net_sent") is not None and r.get("net_recv") is not None] if samples else []
    # GPU readings are arrays in the order of hello's gpu_fields (older agents: dicts)
    position = {name: i for i, name in enumerate(fields)}
    by_gpu: dict[int, list[list]] = {}
    for gpus in [r.get("gpus") or () for r in samples]:
        for gpu in gpus:
            row = gpu if isinstance(gpu, list) else [gpu.get(f) for f in fields]
            by_gpu.setdefault(row[position["index"]], []).append(row)
    for index, rows in by_gpu.items():
        entry = series.gpus.setdefault(int(index), GpuSeries())
        column = _columns(rows)
        entry.util, entry.sm, entry.mem, entry.power = (_values(column(position.get(name)))
                                                        for name in ("util", "sm_active", "mem_used", "power_w"))
        totals = _values(column(position.get("mem_total")))
        entry.mem_total = totals[-1] if totals else entry.mem_total
        entry.samples = list(map(Sample, *(column(position.get(name)) for name in SAMPLE_FIELDS)))
    by_task: dict[str, list[list]] = {}
    for procs in [r.get("procs") or {} for r in samples]:
        for task, figures in procs.items():
            by_task.setdefault(task, []).append(figures if isinstance(figures, list)
                                                else [figures.get("cpu"), figures.get("rss")])
    series.procs = {task: (_values(column(0)), _values(column(1)))
                    for task, rows in by_task.items() for column in [_columns(rows)]}
    return series


def _gaps(series: HostSeries, run_start: float | None, run_end: float | None) -> tuple[tuple[float, float], ...]:
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


def host_summary(series: HostSeries, run_start: float | None, run_end: float | None) -> HostSummary:
    gpus = []
    for index, gpu in sorted(series.gpus.items()):
        util = sorted(gpu.util)
        throttled = throttling(gpu.samples)
        mem_peak = int(max(gpu.mem)) if gpu.mem else None
        mem_total = int(gpu.mem_total) if gpu.mem_total else None
        gpus.append(GpuSummary(
            index=index, name=gpu.name, util_mean=mean(gpu.util), util_p5=percentile(util, 5),
            sm_active_mean=mean(gpu.sm), mem_peak_bytes=mem_peak, mem_total_bytes=mem_total,
            power_mean_w=mean(gpu.power), power_peak_w=max(gpu.power) if gpu.power else None,
            power_limit_w=gpu.power_limit, sm_clock_busy_mean_mhz=throttled.sm_clock_busy_mean_mhz,
            sm_clock_max_mhz=gpu.sm_clock_max, power_capped_share=throttled.power_capped_share,
            thermal_capped_share=throttled.thermal_capped_share, temp_peak_c=throttled.temp_peak_c,
            diagnosis=tuple(diagnose_gpu(f"GPU {index} on {series.host}", mean(gpu.util), mean(gpu.sm), throttled,
                                         gpu.sm_clock_max, gpu.power_limit, mem_peak, mem_total))))
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
