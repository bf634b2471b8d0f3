"""A host's telemetry file (``telemetry/<host>.jsonl``) as series, and its summary: CPU, memory,
GPUs (utilisation, SM activity, memory, power, throttling) and the gaps in its sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ddlctl.contract.runfolder import read_last
from ddlctl.contract.stats import percentile
from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.report.gpudiag import diagnose_gpu, throttling_of
from ddlctl.report.stepfile import parse_json_lines

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
    #: the CPU and GPU figures are over the whole run, start-up included: steps were recorded, but
    #: fewer than :data:`MIN_WINDOW_SAMPLES` samples fell between the first and the last
    whole_run: bool = False


@dataclass
class GpuSeries:
    """One GPU's readings as columns (numpy arrays of floats, one value per reading, NaN where the
    reading lacked the field)."""

    name: str | None = None
    readings: dict[str, np.ndarray] = field(default_factory=dict)  # field name -> column
    t: np.ndarray = field(default_factory=lambda: np.empty(0))  # each reading's sample time (epoch s)
    mem_total: float | None = None
    sm_clock_max: float | None = None
    power_limit: float | None = None

    def column(self, name: str) -> np.ndarray:
        """Every reading of ``name`` (NaN: not read)."""
        return self.readings.get(name, np.empty(0))

    def values(self, name: str) -> np.ndarray:
        """The readings of ``name`` that were read (no NaN)."""
        column = self.column(name)
        return column[~np.isnan(column)]

    def during(self, keep: np.ndarray) -> GpuSeries:
        """The readings where ``keep`` (a mask over them) is true."""
        return GpuSeries(self.name, {name: column[keep] for name, column in self.readings.items()}, self.t[keep],
                         self.mem_total, self.sm_clock_max, self.power_limit)


@dataclass
class HostSeries:
    """A host's telemetry as columns (numpy float arrays; the nulls of a field left out)."""

    host: str
    interval: float = 1.0
    gpu_note: str | None = None
    t: np.ndarray = field(default_factory=lambda: np.empty(0))
    cpu: np.ndarray = field(default_factory=lambda: np.empty(0))
    cpu_t: np.ndarray = field(default_factory=lambda: np.empty(0))  # the time of each CPU reading
    mem: np.ndarray = field(default_factory=lambda: np.empty(0))
    mem_total: float | None = None
    net: list[tuple[float, float, float]] = field(default_factory=list)
    gpus: dict[int, GpuSeries] = field(default_factory=dict)
    # task -> (CPU %, RSS, of the CPU % the kernel's; the last empty from agents before it was read)
    procs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    bad_lines: int = 0
    unread_bytes: int = 0  # the start of the file past RECORDS_READ_MAX, not read


class _Hello(msgspec.Struct, tag_field="type", tag="hello"):
    host: str | None = None
    interval: float = 1.0
    gpu_note: str | None = None
    gpu_fields: list[str] | None = None
    gpus: list[dict] | None = None


class _Sample(msgspec.Struct, tag_field="type", tag="sample"):
    """A sample as the agent writes it (:mod:`ddlctl.host.telemetry`): GPU readings and task figures as
    arrays; only what the report reads is decoded."""

    t: float
    cpu: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    net_sent: float | None = None
    net_recv: float | None = None
    procs: dict[str, list[float | None]] | None = None
    gpus: list[list[float | None]] | None = None


class _Error(msgspec.Struct, tag_field="type", tag="error"):
    pass


_TELEMETRY_FILE = msgspec.json.Decoder(list[_Hello | _Sample | _Error])


def _typed_records(data: bytes) -> tuple[list, int] | None:
    """The fast path: every line a hello, sample or error of the agent's own shape (but a last line
    cut short: counted), decoded straight into typed records. None: read it the general way."""
    body, bad = data.strip(), 0
    for _ in range(2):
        try:
            return (_TELEMETRY_FILE.decode(b"[" + body.replace(b"\n", b",") + b"]") if body else []), bad
        except msgspec.ValidationError:  # sound JSON, another shape (an older agent's dicts...)
            return None
        except msgspec.DecodeError:
            body, bad = body.rpartition(b"\n")[0], 1
    return None


def _general_records(data: bytes) -> tuple[list, int]:
    """Any sound line, as the typed records (GPU readings and task figures written as dicts by older
    agents become arrays in the hello's field order); unreadable lines, and lines of a shape the
    agent never writes (a host's file is data: a reading that is not a number), counted."""
    records, bad = parse_json_lines(data)
    typed: list = []
    fields = list(GPU_FIELDS)
    for raw in records:
        kind = raw.get("type") if isinstance(raw, dict) else None
        try:
            if kind == "sample":
                procs, gpus = raw.get("procs") or {}, raw.get("gpus") or ()
                raw = {**raw, "procs": {task: f if isinstance(f, list) else [f.get("cpu"), f.get("rss")]
                                        for task, f in procs.items()},
                       "gpus": [g if isinstance(g, list) else [g.get(f) for f in fields] for g in gpus]}
                typed.append(msgspec.convert(raw, _Sample))
            elif kind == "hello":
                hello = msgspec.convert(raw, _Hello)
                fields = list(hello.gpu_fields or fields)
                typed.append(hello)
            elif kind != "error":  # agents report problems as {"type": "error"}; anything else is unreadable
                bad += 1
        except (msgspec.ValidationError, AttributeError, TypeError):
            bad += 1
    return typed, bad


#: The readings a GPU's series keeps as columns (those the summary and the diagnosis read).
GPU_COLUMNS = ("util", "sm_active", "mem_used", "mem_total", "power_w", "sm_clock_mhz", "throttle", "temp_c")


def _floats(values: list) -> np.ndarray:
    """A float column (None -> NaN)."""
    return np.array(values, dtype=float).reshape(len(values))


def _present(column: np.ndarray) -> np.ndarray:
    return column[~np.isnan(column)]


def _matrix(rows: list[list]) -> np.ndarray:
    """Rows of readings as a float matrix (None -> NaN; rows shorter than the longest, from an older
    agent, padded with NaN)."""
    try:
        return np.array(rows, dtype=float).reshape(len(rows), -1)
    except ValueError:  # rows of unequal length
        width = max(map(len, rows))
        return np.array([row + [None] * (width - len(row)) for row in rows], dtype=float)


def read_telemetry(path: Path) -> HostSeries:
    """Parse one ``telemetry/<host>.jsonl`` into columns (hours of samples of many GPUs stay fast)."""
    series = HostSeries(path.stem)
    data, series.unread_bytes = read_last(path)
    records, series.bad_lines = _typed_records(data) or _general_records(data)
    fields = list(GPU_FIELDS)
    samples = []
    for record in records:
        if isinstance(record, _Sample):
            samples.append(record)
        elif isinstance(record, _Hello):
            series.host = str(record.host if record.host is not None else series.host)
            series.interval = float(record.interval)
            series.gpu_note = record.gpu_note
            fields = list(record.gpu_fields or fields)
            numbered = [g for g in record.gpus or [] if type(g.get("index")) is int and 0 <= g["index"] < 1 << 16]
            series.bad_lines += len(numbered) < len(record.gpus or [])  # (a GPU without a number is not one)
            for gpu in numbered:
                index = gpu["index"]
                entry = series.gpus.setdefault(index, GpuSeries())
                entry.name = None if gpu.get("name") is None else str(gpu["name"])[:200]
                entry.mem_total, entry.sm_clock_max, entry.power_limit = (
                    value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
                    for value in (gpu.get("memory_total_bytes"), gpu.get("sm_clock_max_mhz"),
                                  gpu.get("power_limit_w")))
    series.t = _floats([r.t for r in samples])
    cpu = _floats([r.cpu for r in samples])
    series.cpu, series.cpu_t = _present(cpu), series.t[~np.isnan(cpu)]
    series.mem = _present(_floats([r.mem_used for r in samples]))
    totals = [r.mem_total for r in samples if r.mem_total]
    series.mem_total = totals[-1] if totals else None
    series.net = [(float(r.t), float(r.net_sent), float(r.net_recv)) for r in (samples[0], samples[-1])
                  if r.net_sent is not None and r.net_recv is not None] if samples else []
    # GPU readings: arrays in the order of hello's gpu_fields, grouped by the GPU's index
    rows = [row for r in samples if r.gpus for row in r.gpus]
    readings = _matrix(rows) if rows else None
    position = {name: i for i, name in enumerate(fields) if readings is not None and i < readings.shape[1]}
    if readings is not None and "index" not in position:  # readings without a GPU's number: none is a GPU's
        series.bad_lines += sum(1 for r in samples if r.gpus)
    elif readings is not None:
        times = np.repeat(series.t, [len(r.gpus) if r.gpus else 0 for r in samples])
        indexes = readings[:, position["index"]]
        for index in dict.fromkeys(indexes[~np.isnan(indexes)].tolist()):
            mine = readings[indexes == index]
            entry = series.gpus.setdefault(int(index), GpuSeries())
            entry.readings = {name: mine[:, position[name]] if name in position else np.full(len(mine), np.nan)
                              for name in GPU_COLUMNS}
            entry.t = times[indexes == index]
            totals = entry.values("mem_total")
            entry.mem_total = float(totals[-1]) if totals.size else entry.mem_total
    series.procs = _procs(samples)
    return series


def _procs(samples: list) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Task -> (CPU %, RSS, kernel CPU %) columns, nulls left out."""
    with_procs = [r.procs for r in samples if r.procs]
    if not with_procs:
        return {}
    names = tuple(with_procs[0])
    if all(tuple(p) == names for p in with_procs) and all(len(f) in (2, 3) for f in with_procs[0].values()):
        try:  # the same tasks in every sample (the common case): one matrix
            figures = np.array([list(p.values()) for p in with_procs], dtype=float)
        except ValueError:
            figures = None
        if figures is not None and figures.ndim == 3:
            return {task: tuple(_present(figures[:, i, k]) if k < figures.shape[2] else np.empty(0)  # type: ignore[misc]
                                for k in range(3)) for i, task in enumerate(names)}
    by_task: dict[str, list[list]] = {}
    for procs in with_procs:
        for task, figures in procs.items():
            by_task.setdefault(task, []).append(figures)
    out = {}
    for task, task_rows in by_task.items():
        matrix = _matrix(task_rows)
        out[task] = tuple(_present(matrix[:, i]) if i < matrix.shape[1] else np.empty(0) for i in range(3))
    return out


def _gaps(series: HostSeries, run_start: float | None, run_end: float | None) -> tuple[tuple[float, float], ...]:
    limit = GAP_INTERVALS * series.interval
    times = np.sort(series.t)
    gaps = []
    if not times.size:
        return ((run_start, run_end),) if run_start is not None and run_end is not None else ()
    first, last = float(times[0]), float(times[-1])
    if run_start is not None and first - run_start > limit + 5.0:  # agent start-up allowance
        gaps.append((run_start, first))
    for i in np.nonzero(np.diff(times) > limit)[0].tolist():
        gaps.append((float(times[i]), float(times[i + 1])))
    if run_end is not None and run_end - last > limit:
        gaps.append((last, run_end))
    return tuple(gaps)


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def _max(values: np.ndarray) -> float | None:
    return float(values.max()) if values.size else None


#: the utilisation figures are taken over the training window when at least this many samples fall
#: inside it, else over the whole run (a run too short for its sampling interval)
MIN_WINDOW_SAMPLES = 3


def training(t: np.ndarray, run_start: float | None, run_end: float | None) -> np.ndarray:
    """A mask over samples taken at times ``t``: those from the first step's start to the last
    step's end (utilisation while training: a long start-up or teardown does not dilute it), or all
    of them where no steps were recorded or fewer than :data:`MIN_WINDOW_SAMPLES` fall inside."""
    if run_start is None or run_end is None or too_few_inside(t, run_start, run_end):
        return np.ones(t.size, dtype=bool)
    return (t >= run_start) & (t <= run_end)


def too_few_inside(t: np.ndarray, run_start: float | None, run_end: float | None) -> bool:
    """Whether steps were recorded (``run_start``, ``run_end``) but fewer than
    :data:`MIN_WINDOW_SAMPLES` of the times ``t`` fall between them (steps too short to sample)."""
    if run_start is None or run_end is None:
        return False
    return int(((t >= run_start) & (t <= run_end)).sum()) < MIN_WINDOW_SAMPLES


def host_summary(series: HostSeries, run_start: float | None, run_end: float | None) -> HostSummary:
    """One host's figures: memory peaks over the whole run; CPU, GPU utilisation, SM activity, power
    and throttling over the training window (:func:`training`)."""
    gpus = []
    for index, whole in sorted(series.gpus.items()):
        gpu = whole.during(training(whole.t, run_start, run_end))
        util = gpu.values("util")
        throttled = throttling_of(gpu.column("util"), gpu.column("sm_clock_mhz"), gpu.column("throttle"),
                                  gpu.column("power_w"), gpu.column("temp_c"))
        mem_peak = int(whole.values("mem_used").max()) if whole.values("mem_used").size else None
        mem_total = int(gpu.mem_total) if gpu.mem_total else None
        util_mean, sm_mean = _mean(util), _mean(gpu.values("sm_active"))
        gpus.append(GpuSummary(
            index=index, name=gpu.name, util_mean=util_mean, util_p5=percentile(np.sort(util), 5),
            sm_active_mean=sm_mean, mem_peak_bytes=mem_peak, mem_total_bytes=mem_total,
            power_mean_w=_mean(gpu.values("power_w")), power_peak_w=_max(gpu.values("power_w")),
            power_limit_w=gpu.power_limit, sm_clock_busy_mean_mhz=throttled.sm_clock_busy_mean_mhz,
            sm_clock_max_mhz=gpu.sm_clock_max, power_capped_share=throttled.power_capped_share,
            thermal_capped_share=throttled.thermal_capped_share, temp_peak_c=throttled.temp_peak_c,
            diagnosis=tuple(diagnose_gpu(f"GPU {index} on {series.host}", util_mean, sm_mean, throttled,
                                         gpu.sm_clock_max, gpu.power_limit, mem_peak, mem_total))))
    sent = recv = None
    if len(series.net) >= 2 and series.net[-1][0] > series.net[0][0]:
        span = series.net[-1][0] - series.net[0][0]
        sent = (series.net[-1][1] - series.net[0][1]) / span
        recv = (series.net[-1][2] - series.net[0][2]) / span
    whole_run = series.cpu_t.size > 0 and too_few_inside(series.cpu_t, run_start, run_end)
    return HostSummary(
        host=series.host, samples=len(series.t), whole_run=whole_run,
        cpu_util_mean=_mean(series.cpu[training(series.cpu_t, run_start, run_end)]),
        mem_peak_bytes=int(series.mem.max()) if series.mem.size else None,
        mem_total_bytes=int(series.mem_total) if series.mem_total else None,
        net_sent_bytes_per_s=sent, net_recv_bytes_per_s=recv, gpu_note=series.gpu_note,
        gpus=tuple(gpus), gaps=_gaps(series, run_start, run_end))
