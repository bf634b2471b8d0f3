"""The live view of ``ddlctl profile``: per-task step rate, per-host CPU and GPU figures.

Fed by the agents' samples (which carry each task's step count). On a terminal it is a rich
``Live`` table with the tasks' output scrolling above it; otherwise a plain status line every
``plain_every_s`` seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ddlctl.telemetry.nvml import GPU_FIELDS, gpu_reading


@dataclass
class _TaskRate:
    count: int = 0
    rate: float | None = None
    t: float | None = None


@dataclass
class LiveState:
    """Latest figures, updated from agent samples (pure bookkeeping, no I/O)."""

    tasks: dict[str, _TaskRate] = field(default_factory=dict)
    hosts: dict[str, dict] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)

    def update(self, host: str, record: dict) -> None:
        if record.get("type") == "hello":
            self.fields[host] = list(record.get("gpu_fields") or GPU_FIELDS)
        if record.get("type") != "sample":
            return
        record = {**record, "gpus": [gpu_reading(g, self.fields.get(host, GPU_FIELDS))
                                     for g in record.get("gpus") or ()]}
        t = float(record.get("t", time.time()))
        self.hosts[host] = record
        for task, count in (record.get("steps") or {}).items():
            entry = self.tasks.setdefault(task, _TaskRate())
            if entry.t is not None and t > entry.t and count >= entry.count:
                rate = (count - entry.count) / (t - entry.t)
                entry.rate = rate if entry.rate is None else 0.5 * entry.rate + 0.5 * rate
            entry.count, entry.t = count, t

    def table(self) -> Table:
        table = Table(title="ddlctl profile (live)", title_justify="left", expand=False)
        table.add_column("task / host")
        table.add_column("steps", justify="right")
        table.add_column("steps/s", justify="right")
        table.add_column("CPU %", justify="right")
        table.add_column("GPU util % / memory", justify="left")
        for task, entry in sorted(self.tasks.items()):
            table.add_row(task, str(entry.count), "-" if entry.rate is None else f"{entry.rate:.1f}", "", "")
        for host, record in sorted(self.hosts.items()):
            gpus = record.get("gpus") or []
            text = "  ".join(
                f"{g['index']}: {g.get('util', '-')}% {(g.get('mem_used') or 0) / 2**30:.1f}/"
                f"{(g.get('mem_total') or 0) / 2**30:.0f} GiB" for g in gpus) or "no GPU"
            cpu = record.get("cpu")
            table.add_row(Text(host, style="bold"), "", "", "-" if cpu is None else f"{cpu:.0f}", text)
        return table

    def line(self) -> str:
        parts = [f"{task} {e.count} steps" + ("" if e.rate is None else f" {e.rate:.1f}/s")
                 for task, e in sorted(self.tasks.items())]
        for host, record in sorted(self.hosts.items()):
            gpus = record.get("gpus") or []
            gpu = " ".join(f"gpu{g['index']} {g.get('util', '-')}%" for g in gpus) or "no GPU"
            cpu = record.get("cpu")
            parts.append(f"{host} cpu {'-' if cpu is None else f'{cpu:.0f}%'} {gpu}")
        return "ddlctl live | " + " | ".join(parts)


class LiveView:
    """Shows :class:`LiveState` while a job runs; ``on_sample`` is the supervisor's callback."""

    def __init__(self, console: Console, plain_every_s: float = 5.0) -> None:
        self.console = console
        self.state = LiveState()
        self.lock = threading.Lock()
        self.plain_every_s = plain_every_s
        self.last_plain = 0.0
        self.live: Live | None = None
        if console.is_terminal:
            self.live = Live(console=console, get_renderable=self._render, refresh_per_second=2,
                             transient=True, redirect_stdout=False, redirect_stderr=False)

    def _render(self) -> Table:
        with self.lock:
            return self.state.table()

    def on_sample(self, host: str, record: dict) -> None:
        with self.lock:
            self.state.update(host, record)
        if self.live is None and record.get("type") == "sample":
            now = time.monotonic()
            if now - self.last_plain >= self.plain_every_s:
                self.last_plain = now
                self.console.print(self.state.line(), highlight=False, soft_wrap=True)

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()


class ConsoleLineWriter:
    """Task output through a rich console (so it scrolls above a live view), same interface as
    :class:`ddlctl.supervise.output.PrefixedWriter`."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        for line in lines:
            text = Text(f"[{task}@{host}] ", style="cyan")
            text.append(line.rstrip(b"\r\n").decode("utf-8", "replace"))
            self.console.print(text, soft_wrap=True)
