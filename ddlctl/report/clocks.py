"""Step times, phases and samples of hosts whose clocks differ from the controller's, put on the
controller's clock (pure, in place).

A task's step records and a telemetry agent's samples carry their host's wall time; restarts,
hangs and membership changes carry the controller's. ``outcome.json``'s ``clock_offsets`` (host ->
its clock less the controller's, seconds: from the host agent's frames, see
:class:`ddlctl.transport.session.HostSession`) says by how much a host's times are off, so a
throughput window, a restart's downtime and the trace all read one clock (a host 42 s ahead made
the window 42 s longer and its throughput a tenth of the truth). Durations are never touched.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping

import numpy as np

from ddlctl.report.hosts import HostSeries
from ddlctl.report.stepfile import TaskSteps


def clock_offsets(outcome: Mapping) -> dict[str, float]:
    """Host label -> its clock less the controller's (seconds), for the hosts that had one."""
    raw = outcome.get("clock_offsets") or {}
    return {str(host): float(s) for host, s in raw.items() if isinstance(s, (int, float)) and s} \
        if isinstance(raw, Mapping) else {}


def shift_steps(steps: TaskSteps, seconds: float) -> None:
    """``steps``' start times less ``seconds`` (its host's offset)."""
    if seconds and steps.start_us:
        moved = np.frombuffer(steps.start_us, dtype=np.int64) - int(round(seconds * 1e6))
        steps.start_us = array("q", moved.tobytes())


def shift_phases(phases: dict[str, list[tuple[float, float]]], seconds: float) -> dict[str, list[tuple[float, float]]]:
    """Phase intervals (epoch seconds) less ``seconds``."""
    if not seconds:
        return phases
    return {name: [(start - seconds, end - seconds) for start, end in spans] for name, spans in phases.items()}


def shift_series(series: HostSeries, seconds: float) -> None:
    """A host's telemetry (sample times: of every reading, CPU readings, GPU readings, network)
    less ``seconds``."""
    if not seconds:
        return
    series.t = series.t - seconds
    series.cpu_t = series.cpu_t - seconds
    for gpu in series.gpus.values():
        gpu.t = gpu.t - seconds
    series.net = [(t - seconds, sent, recv) for t, sent, recv in series.net]
