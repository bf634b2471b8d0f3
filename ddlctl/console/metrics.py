"""Prometheus metrics while a job runs (``ddlctl launch/profile --metrics-port PORT``): served by
the controller with ``prometheus-client``, from what the supervisor already receives (the agents'
step reports, the telemetry agents' samples, the tasks' states and restarts).

Series (Prometheus naming: base units, ``_total`` for counters, ratios 0-1):

* ``ddlctl_steps_total{task}``: steps the task made (a restarted task's redone steps count again);
* ``ddlctl_step_seconds{task}`` (summary): ``_count`` steps and ``_sum`` seconds of training over
  which they were reported (mean step time = sum / count; reports arrive in blocks);
* ``ddlctl_task_up{task,host,role}``: 1 while the task runs, 0 once it ended;
* ``ddlctl_restarts_total``; ``ddlctl_goodput_ratio``: the share of the job's time so far in which
  it made progress (productive over the wall of the time by cause below; without it, the time
  between two progress reports at most 5 s apart);
* ``ddlctl_time_seconds{cause}``: the job's time so far by cause (``productive``, ``startup``,
  ``restart``, ``stalled``, ``checkpoint``, ... ``other``: they add up to its wall time; the
  report's accounting over the progress reports, :mod:`ddlctl.supervise.accounting`), and
  ``ddlctl_degraded_seconds``: of the productive time, that on fewer workers than planned;
* ``ddlctl_host_cpu_utilization_ratio{host}``; per GPU ``{host,gpu}``: ``ddlctl_gpu_utilization_ratio``,
  ``ddlctl_gpu_sm_active_ratio``, ``ddlctl_gpu_memory_used_bytes``, ``ddlctl_gpu_memory_total_bytes``,
  ``ddlctl_gpu_power_watts``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from ddlctl.contract.causes import CAUSES, TimeByCause
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.telemetry import GPU_FIELDS, gpu_reading

#: A longer time between two reports of progress is not productive (start-up, a stall, a restart).
PROGRESS_GAP_S = 5.0

#: (task, host, role, running) for each task, and the restarts so far: read once a tick.
Status = tuple[Sequence[tuple[str, str, str, bool]], int]

_GPU_SERIES = (("ddlctl_gpu_utilization_ratio", "GPU busy share (NVML utilization)", "util", 0.01),
               ("ddlctl_gpu_sm_active_ratio", "share of SMs active", "sm_active", 0.01),
               ("ddlctl_gpu_memory_used_bytes", "GPU memory used", "mem_used", 1.0),
               ("ddlctl_gpu_memory_total_bytes", "GPU memory in all", "mem_total", 1.0),
               ("ddlctl_gpu_power_watts", "GPU power draw", "power_w", 1.0))


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT`` -> (address, port)."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--metrics-port {text!r}: give a port (9400) or HOST:PORT (0.0.0.0:9400)")
    return host or "127.0.0.1", int(port)


class JobMetrics:
    """The figures behind the series, updated from the supervisor's thread and read by the HTTP
    server's (each update and each scrape holds the lock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.started = clock()
        self.steps: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._last: dict[str, tuple[int, float]] = {}  # task -> (highest step, when it was reported)
        self._moved_at: float | None = None  # when the job last made progress
        self.productive_s = 0.0
        self.tasks: Sequence[tuple[str, str, str, bool]] = ()
        self.restarts = 0
        self._fields: dict[str, list[str]] = {}
        self.cpu: dict[str, float] = {}
        self.gpus: dict[tuple[str, int], dict] = {}
        self.causes: TimeByCause | None = None

    def on_progress(self, figures: Mapping[str, tuple[int, int | None]], status: Status | None = None,
                    causes: TimeByCause | None = None) -> None:
        """Each task's highest step (the agents' reports), once a tick; the job's time by cause so far."""
        now = self.clock()
        with self.lock:
            if causes is not None:
                self.causes = causes
            moved = False
            for task, (last, _total) in figures.items():
                if task.startswith("agent:"):
                    continue
                before = self._last.get(task)
                if before is None or last < before[0]:  # first report, or restarted from a checkpoint
                    if before is None:
                        self.steps[task] = self.steps.get(task, 0) + last
                    self._last[task] = (last, now)
                elif last > before[0]:
                    self.steps[task] = self.steps.get(task, 0) + last - before[0]
                    self.seconds[task] = self.seconds.get(task, 0.0) + now - before[1]
                    self._last[task] = (last, now)
                    moved = True
            if moved:  # reports come every second or so: the time since the last one made progress,
                if self._moved_at is not None and now - self._moved_at <= PROGRESS_GAP_S:  # unless it stalled
                    self.productive_s += now - self._moved_at
                self._moved_at = now
            if status is not None:
                self.tasks, self.restarts = status

    def on_sample(self, host: str, record: dict) -> None:
        """A telemetry agent's line (hello or sample)."""
        with self.lock:
            if record.get("type") == "hello":
                self._fields[host] = list(record.get("gpu_fields") or GPU_FIELDS)
                return
            if record.get("type") != "sample":
                return
            if record.get("cpu") is not None:
                self.cpu[host] = float(record["cpu"])
            for raw in record.get("gpus", ()):
                gpu = gpu_reading(raw, self._fields.get(host, list(GPU_FIELDS)))
                if gpu.get("index") is not None:
                    self.gpus[(host, int(gpu["index"]))] = gpu

    def collect(self) -> Iterator[object]:
        """The series, as prometheus-client metric families (a custom collector)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        with self.lock:
            steps = CounterMetricFamily("ddlctl_steps", "Training steps each task made", labels=["task"])
            timing = SummaryMetricFamily("ddlctl_step_seconds", "Seconds of training per step (reported in blocks)",
                                         labels=["task"])
            for task in sorted(self.steps):
                steps.add_metric([task], self.steps[task])
                timing.add_metric([task], count_value=self.steps[task], sum_value=self.seconds.get(task, 0.0))
            up = GaugeMetricFamily("ddlctl_task_up", "1 while the task runs, 0 once it ended",
                                   labels=["task", "host", "role"])
            for name, host, role, running in self.tasks:
                up.add_metric([name, host, role], 1.0 if running else 0.0)
            restarts = CounterMetricFamily("ddlctl_restarts", "Restarts of tasks so far")
            restarts.add_metric([], self.restarts)
            wall = self.clock() - self.started
            goodput = GaugeMetricFamily("ddlctl_goodput_ratio", "Share of the job's time so far with progress")
            counted = self.causes
            if counted is not None and counted.wall_s > 0:
                goodput.add_metric([], counted.productive_s / counted.wall_s)
            else:
                goodput.add_metric([], self.productive_s / wall if wall > 0 else 0.0)
            cpu = GaugeMetricFamily("ddlctl_host_cpu_utilization_ratio", "Host CPU busy share", labels=["host"])
            for host, value in sorted(self.cpu.items()):
                cpu.add_metric([host], value / 100)
            families = [steps, timing, up, restarts, goodput, cpu]
            if counted is not None:
                by_cause = GaugeMetricFamily("ddlctl_time_seconds", "The job's time so far by cause (adds up to "
                                             "its wall time)", labels=["cause"])
                for key, _label in CAUSES:
                    by_cause.add_metric([key], getattr(counted, key + "_s"))
                degraded = GaugeMetricFamily("ddlctl_degraded_seconds", "Of the productive time, that on fewer "
                                             "workers than planned")
                degraded.add_metric([], counted.degraded_s)
                families += [by_cause, degraded]
            for name, text, key, scale in _GPU_SERIES:
                family = GaugeMetricFamily(name, text, labels=["host", "gpu"])
                for (host, index), gpu in sorted(self.gpus.items()):
                    if gpu.get(key) is not None:
                        family.add_metric([host, str(index)], float(gpu[key]) * scale)
                families.append(family)
        yield from families


class MetricsServer:
    """``JobMetrics`` served over HTTP for Prometheus to scrape, from a daemon thread."""

    def __init__(self, metrics: JobMetrics, address: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)  # type: ignore[arg-type]
        try:
            self.server, self.thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port: cannot serve metrics on {address}:{port} ({exc.strerror or exc}); "
                              "choose a free port") from exc
        self.url = f"http://{address}:{port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
