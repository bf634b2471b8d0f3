"""The live view while a job runs: a progress bar for the job and, under ``profile``, a table of
per-task steps, step rate and CPU, and per-host CPU and GPU figures.

Fed by two callbacks: ``on_progress`` (the host agents' step reports: highest step reached and the
declared total per task, with or without telemetry, and the job's time so far by cause, shown under
the bar) and ``on_sample`` (the telemetry agents'
samples: step counts, per-task CPU, host CPU and GPUs). On a terminal it is one rich ``Live``
region, redrawn in place, with the tasks' output scrolling above it (everything printed while it
is up must go through its console). Elsewhere (CI, ``| tee``) it stays line-oriented: a status line
every ``plain_every_s`` seconds under ``profile``, nothing extra under ``launch``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ddlctl.contract.causes import TimeByCause
from ddlctl.contract.telemetry import GPU_FIELDS, gpu_reading

RATE_WINDOW_S = 5.0
#: The time by cause is shown once the job has run this long (before, it is all start-up).
CAUSES_AFTER_S = 5.0


class WindowRate:
    """A rate over at least ``window_s`` seconds of (time, count) marks: never from two records that
    happen to arrive together (results that come in bursts would show absurd rates)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.marks: deque[tuple[float, float]] = deque()

    def add(self, t: float, count: float) -> None:
        if self.marks and count < self.marks[-1][1]:  # the count went back (a restarted task): start over
            self.marks.clear()
        self.marks.append((t, count))
        while len(self.marks) > 2 and t - self.marks[1][0] >= self.window_s:
            self.marks.popleft()  # keep the newest mark that is at least window_s old

    @property
    def rate(self) -> float | None:
        if len(self.marks) < 2:
            return None
        (t0, c0), (t1, c1) = self.marks[0], self.marks[-1]
        return (c1 - c0) / (t1 - t0) if t1 - t0 >= min(1.0, self.window_s) else None


def job_progress(figures: Mapping[str, tuple[int, int | None]]) -> tuple[int, int | None]:
    """The job's (steps done, total steps) from each task's (highest step, declared total): the
    furthest task (ps: the coordinator; synchronous workers move together), and the largest
    declared total (None when no task declared one)."""
    done = max((last for last, _ in figures.values()), default=0)
    totals = [total for _, total in figures.values() if total]
    return done, max(totals) if totals else None


#: A task whose step count has not moved this long (while others may) is shown as stalled.
STALL_SHOWN_S = 10.0
REFRESH_S = 0.25  # the live region is redrawn 4 times a second


@dataclass
class _TaskFigures:
    count: int = 0
    rate: WindowRate = field(default_factory=WindowRate)
    cpu: float | None = None
    moved_t: float | None = None  # when its count last went up (sample time)
    seen_t: float | None = None  # its latest sample
    finished: bool = False  # past its declared last step
    busy: int = 0  # its phases file's lines so far (phases begun or ended, beats: work between steps)
    busy_t: float | None = None  # its latest sample when that count last went up
    phase: str | None = None  # the phase its program declared and is in (a checkpoint save)

    def stalled_s(self) -> float | None:
        """Seconds since its last step, once over :data:`STALL_SHOWN_S` (None: stepping, finished,
        or never stepped: start-up is not a stall)."""
        if self.finished or self.moved_t is None or self.seen_t is None:
            return None
        idle = self.seen_t - self.moved_t
        return idle if idle >= STALL_SHOWN_S else None

    def stall_text(self) -> str:
        """`` (none for 45s)`` for a stalled task, `` (in checkpoint, none for 45s)`` for one inside a
        phase its program declared, `` (at work, none for 45s)`` for one whose work between steps
        goes on (an evaluation's batches, ``ddlctl.beat``), else nothing."""
        stalled = self.stalled_s()
        if stalled is None:
            return ""
        if self.phase:
            return f" (in {self.phase}, none for {stalled:.0f}s)"
        assert self.moved_t is not None and self.seen_t is not None
        working = self.busy_t is not None and self.busy_t > self.moved_t and self.seen_t - self.busy_t < STALL_SHOWN_S
        return f" ({'at work, ' if working else ''}none for {stalled:.0f}s)"


@dataclass
class LiveState:
    """Latest figures, updated from agent samples (pure bookkeeping, no I/O)."""

    tasks: dict[str, _TaskFigures] = field(default_factory=dict)
    hosts: dict[str, dict] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)
    done: int = 0
    total: int | None = None
    job_rate: WindowRate = field(default_factory=WindowRate)
    causes: str = ""  # the job's time so far by cause ("productive 81% · start-up 15% · ...")

    def update(self, host: str, record: dict) -> None:
        """Take one telemetry record (``hello`` or ``sample``) from ``host``'s agent."""
        if record.get("type") == "hello":
            self.fields[host] = list(record.get("gpu_fields") or GPU_FIELDS)
        if record.get("type") != "sample":
            return
        gpus = [gpu_reading(g, self.fields.get(host, GPU_FIELDS)) for g in record.get("gpus") or ()]
        for gpu in gpus:  # (what the table shows, checked here: a sample is data from a host)
            gpu["index"] = int(gpu["index"])
            for key in ("util", "mem_used", "mem_total"):
                if gpu.get(key) is not None:
                    gpu[key] = float(gpu[key])
        cpu = record.get("cpu")
        record = {**record, "gpus": gpus, "cpu": None if cpu is None else float(cpu)}
        t = float(record.get("t", time.time()))
        self.hosts[host] = record
        for task, count in (record.get("steps") or {}).items():
            entry = self.tasks.setdefault(task, _TaskFigures())
            if int(count) != entry.count:  # a step, or a restart counting from its checkpoint
                entry.moved_t = t
            entry.count, entry.seen_t = int(count), t
            entry.rate.add(t, count)
        for task, figures in (record.get("procs") or {}).items():  # [cpu %, rss, kernel cpu %] per task
            entry = self.tasks.setdefault(task, _TaskFigures())
            entry.cpu = float(figures[0]) if figures and figures[0] is not None else None

    def activity(self, activity: Mapping[str, tuple[int, str | None]]) -> None:
        """Take the host agents' per-task (lines of its phases file, the phase it is in), as the
        hang watch reads them: work between steps shows as work, not a stall."""
        for task, (busy, phase) in activity.items():
            entry = self.tasks.get(task)
            if entry is None:
                continue
            if busy != entry.busy:
                entry.busy, entry.busy_t = busy, entry.seen_t
            entry.phase = phase

    def progress(self, figures: Mapping[str, tuple[int, int | None]], t: float) -> None:
        """Take the host agents' per-task (highest step, declared total)."""
        self.done, self.total = job_progress(figures)
        self.job_rate.add(t, self.done)
        for task, (last, total) in figures.items():
            if task in self.tasks:
                self.tasks[task].finished = total is not None and last >= total

    def table(self) -> Table:
        table = Table(title="ddlctl profile (live)", title_justify="left", expand=False)
        table.add_column("task / host")
        table.add_column("steps", justify="right")
        table.add_column("steps/s", justify="right")
        table.add_column("CPU %", justify="right")
        table.add_column("GPU util % / memory", justify="left")
        for task, entry in sorted(self.tasks.items()):
            rate = entry.rate.rate
            stall = entry.stall_text()
            steps = Text(f"{entry.count}{stall}", style="yellow" if stall else "")
            table.add_row(task, steps, "-" if rate is None else f"{rate:.1f}",
                          "-" if entry.cpu is None else f"{entry.cpu:.0f}", "")
        for host, record in sorted(self.hosts.items()):
            table.add_row(Text(host, style="bold"), "", "", _fmt_cpu(record.get("cpu")),
                          _gpu_text(record))
        return table

    def line(self) -> str:
        """The non-terminal status line."""
        rate = self.job_rate.rate
        parts = [f"steps {self.done}/{self.total or '?'}" + ("" if rate is None else f" {rate:.1f}/s")
                 + ("" if not (rate and self.total) else f" ETA {_eta(max(0, self.total - self.done) / rate)}")]
        for task, e in sorted(self.tasks.items()):
            parts.append(f"{task} {e.count} steps{e.stall_text()}" + ("" if e.cpu is None else f" cpu {e.cpu:.0f}%"))
        for host, record in sorted(self.hosts.items()):
            gpu = " ".join(f"gpu{g['index']} {g.get('util', '-')}%" for g in record.get("gpus") or []) or "no GPU"
            parts.append(f"{host} cpu {_fmt_cpu(record.get('cpu'))}% {gpu}")
        if self.causes:
            parts.append(f"time: {self.causes}")
        return "ddlctl live | " + " | ".join(parts)


def _fmt_cpu(cpu: float | None) -> str:
    return "-" if cpu is None else f"{cpu:.0f}"


def _gpu_text(record: dict) -> str:
    return "  ".join(f"{g['index']}: {g.get('util', '-')}% {(g.get('mem_used') or 0) / 2**30:.1f}/"
                     f"{(g.get('mem_total') or 0) / 2**30:.0f} GiB" for g in record.get("gpus") or []) or "no GPU"


def _eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class LiveView:
    """Shows the job's progress (and under ``profile`` the :class:`LiveState` table) while it runs.

    ``on_sample`` and ``on_progress`` are the supervisor's callbacks. ``table``: show the per-task
    table (``profile``); ``plain``: print status lines when the console is not a terminal."""

    def __init__(self, console: Console, table: bool = True, plain: bool = True,
                 plain_every_s: float = 5.0) -> None:
        self.console = console
        self.state = LiveState()
        self.lock = threading.Lock()
        self.show_table = table
        self.plain = plain
        self.plain_every_s = plain_every_s
        self.last_plain = 0.0
        self.live: Live | None = None
        self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                            TextColumn("elapsed"), TimeElapsedColumn(), console=console, auto_refresh=False,
                            speed_estimate_period=10.0)
        self.bar_task = self.bar.add_task("training", total=None, rate="")
        # One writer to the terminal at a time: the live region's redraw or a print above it. rich
        # moves the cursor up by the region's last drawn height when a print starts, then renders;
        # a redraw from its own refresh thread in between (the region taller by then: the table's
        # first rows) left the top of the region behind in the scrollback. So the region is
        # redrawn here, under the lock every print takes (:meth:`print`).
        self.out_lock = threading.RLock()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        if console.is_terminal:
            self.live = Live(console=console, get_renderable=self._render, auto_refresh=False,
                             transient=True, redirect_stdout=False, redirect_stderr=False)

    @property
    def active(self) -> bool:
        """True while a terminal live region is up (print through ``self.console`` then)."""
        return self.live is not None and self.live.is_started

    def _render(self) -> RenderableType:
        with self.lock:
            parts: list[RenderableType] = [self.state.table()] if self.show_table else []
            time_by_cause = [Text(f"time so far: {self.state.causes}", style="dim")] if self.state.causes else []
            return Group(*parts, self.bar, *time_by_cause)

    def on_sample(self, host: str, record: dict) -> None:
        with self.lock:
            self.state.update(host, record)
        if self.live is None and self.plain and record.get("type") == "sample":
            self._plain_line()

    def on_progress(self, figures: Mapping[str, tuple[int, int | None]],
                    activity: Mapping[str, tuple[int, str | None]] | None = None,
                    causes: TimeByCause | None = None) -> None:
        done, total = job_progress(figures)
        with self.lock:
            if causes is not None and causes.wall_s >= CAUSES_AFTER_S:
                self.state.causes = causes.line()
            if activity:
                self.state.activity(activity)
            if done == self.state.done and total == self.state.total:
                return
            self.state.progress(figures, time.monotonic())
            rate = self.state.job_rate.rate
            self.bar.update(self.bar_task, completed=done, total=total,
                            rate="" if rate is None else f"{rate:.1f} steps/s")

    def _plain_line(self) -> None:
        now = time.monotonic()
        if now - self.last_plain >= self.plain_every_s:
            self.last_plain = now
            with self.lock:
                line = self.state.line()
            self.console.print(line, highlight=False, soft_wrap=True)

    def print(self, *objects: object, **options: object) -> None:
        """Print above the live region (or plainly when there is none)."""
        with self.out_lock:
            self.console.print(*objects, **options)  # type: ignore[arg-type]

    def _refresh_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self.out_lock:
                if self.live is not None and self.live.is_started:
                    self.live.refresh()

    def __enter__(self) -> LiveView:
        if self.live is not None:
            with self.out_lock:
                self.live.start(refresh=True)
            self._refresher = threading.Thread(target=self._refresh_loop, name="ddlctl-live", daemon=True)
            self._refresher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self._stop.set()
            if self._refresher is not None:
                self._refresher.join()
            with self.out_lock:
                self.live.stop()


class ConsoleLineWriter:
    """Task output through a rich console (so it scrolls above a live view: printed through
    ``live``'s lock), same interface as :class:`ddlctl.console.output.PrefixedWriter`."""

    def __init__(self, console: Console, task_colors: bool = False, live: LiveView | None = None) -> None:
        self.console = console
        self.task_colors = task_colors
        self.print = live.print if live is not None else console.print

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        from ddlctl.console.output import visible

        for line in lines:
            text = Text(f"[{task}@{host}] ", style="cyan")
            body = visible(line.rstrip(b"\r\n"), self.task_colors).decode("utf-8", "replace")
            text.append(Text.from_ansi(body) if self.task_colors else Text(body))
            self.print(text, soft_wrap=True)

    def tick(self, now: float) -> None:
        """Nothing is held here."""

    def flush(self) -> None:
        """Nothing is held here."""
