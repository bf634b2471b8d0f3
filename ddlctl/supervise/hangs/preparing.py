"""Tasks that have not begun yet but are at work: before a task listens on its port, or before its
first step, a program may prepare for minutes (read and decode its data set, build a vocabulary,
download, import); a timeout must not call that a hang.

Two looks at the same tasks :data:`LOOK_AGAIN_S` apart (the host agents' dumps: each task's
processes, Python stacks, CPU seconds and bytes read and written) tell a task at work from a stuck
one: at work, it kept :data:`BUSY_CPU` of a CPU busy or moved :data:`BUSY_IO` bytes a second, and
its main thread is in its own code, in a library that is not TensorFlow's, importing, or somewhere
else than at the first look. A busy process whose main thread stays at one place in TensorFlow may
wait rather than work (a collective spins on a GPU host, an input pipeline spins in native code):
it is not counted. Neither is one that sleeps, waits on a lock or a pipe, is stopped or blocked.

A task its host's zygote has not forked yet (the zygote still imports TensorFlow: a loaded host, a
slow disk) is at work by the zygote's readings, and one forked between the looks is at work too.

A task is given this benefit for :data:`PREPARING_MAX_S` after its start at most; after that its
usual timeout decides (``--startup-timeout`` sets a longer one). Pure functions and a small state
machine for the supervisor's tick loop: :meth:`Looks.look` answers None until the second look.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ddlctl.diagnose.stack_dumps import Standing, stand

#: Seconds between the two looks.
LOOK_AGAIN_S = 5.0
#: A process tree using this share of one CPU or more between the looks is busy.
BUSY_CPU = 0.25
#: ... or one reading and writing this many bytes a second (files, pipes, sockets: a download).
BUSY_IO = 256 * 1024
#: How long after its start a task that has not begun may be found at work and waited for.
PREPARING_MAX_S = 1800.0
#: Where a busy main thread may be waiting rather than working, unless its stack moves.
WAITS_IN = frozenset({"TensorFlow", "Keras", "ddlctl's instrumentation"})


@dataclass(frozen=True)
class Work:
    """A task found at work between two looks."""

    task: str
    where: str  # "in its own code at prep.py:18 in tokenize", "in pandas (...)", "importing (...)"
    cpu: float | None  # share of one CPU between the looks (None: not measured, it started meanwhile)
    io: float | None  # bytes read and written a second

    def describe(self) -> str:
        figures = [] if self.cpu is None else [f"{self.cpu * 100:.0f}% of a CPU"]
        if self.io is not None and self.io >= BUSY_IO:
            figures.append(f"{self.io / 2**20:.1f} MiB/s read and written")
        return ", ".join([self.where, " and ".join(figures)] if figures else [self.where])

    def record(self) -> dict:
        """For ``outcome.json``."""
        return {"task": self.task, "where": self.where, "cpu": None if self.cpu is None else round(self.cpu, 2),
                "io_bytes_s": None if self.io is None else round(self.io)}


def at_work(task: str, first: Mapping | None, second: Mapping | None) -> Work | None:
    """What two dump replies of ``task`` (the first taken before the second) say of it: at work,
    or None (idle, waiting in one place, stopped, blocked, gone, or no readings to compare)."""
    moved = rates(first, second)
    if first is None or second is None or moved is None:
        return None
    cpu, io = moved
    if first.get("forking"):  # not forked at the first look: its zygote's import was its work
        if not second.get("forking"):  # (the readings are of two processes: not comparable)
            started = stand(task, dict(second)).state in ("user", "waiting")
            return Work(task, "started meanwhile (its host's zygote had imported TensorFlow for it)", None, None) \
                if started else None
        busy = cpu >= BUSY_CPU or io >= BUSY_IO
        return Work(task, "not started yet: its host's zygote imports TensorFlow for it", cpu, max(0.0, io)) \
            if busy else None
    before, now = stand(task, dict(first)), stand(task, dict(second))
    if now.state not in ("user", "waiting") or not (cpu >= BUSY_CPU or io >= BUSY_IO):
        return None
    importing = next((f for f in now.frames if f.importing), None) is not None
    if now.state == "waiting" and now.library in WAITS_IN and not importing and before.frames == now.frames:
        return None
    return Work(task, _where(now, importing), cpu, max(0.0, io))


def rates(first: Mapping | None, second: Mapping | None) -> tuple[float, float] | None:
    """(share of a CPU, bytes read and written a second) between two dump replies of one task, or
    None without the readings."""
    if not first or not second or any(key not in reply for key in ("cpu_s", "io_bytes", "at")
                                      for reply in (first, second)):
        return None
    seconds = float(second["at"]) - float(first["at"])
    if seconds <= 0:
        return None
    return ((float(second["cpu_s"]) - float(first["cpu_s"])) / seconds,
            (int(second["io_bytes"]) - int(first["io_bytes"])) / seconds)


def idle_between(first: Mapping | None, second: Mapping | None) -> bool:
    """Whether a task did no work between two looks (under :data:`BUSY_CPU` and :data:`BUSY_IO`;
    no readings: not known to work)."""
    moved = rates(first, second)
    return moved is None or (moved[0] < BUSY_CPU and moved[1] < BUSY_IO)


def _where(standing: Standing, importing: bool) -> str:
    where = f"in its own code at {standing.where}" if standing.state == "user" \
        else standing.where.replace("waiting in ", "in ", 1)
    return f"importing, {where}" if importing else where


def interval_for(timeout_s: float) -> float:
    """The seconds between the looks for a timeout of ``timeout_s``: :data:`LOOK_AGAIN_S`, or half
    the timeout where that is shorter (the first look is taken that far ahead of it)."""
    return min(LOOK_AGAIN_S, max(0.5, timeout_s / 2))


def preparing_line(found: Mapping[str, Work], not_yet: str, waited_s: float, again_s: float) -> str:
    """What ddlctl says when tasks that have not begun (``not_yet``: "no first step", "not
    listening on its port") are found at work after ``waited_s``."""
    tasks = "; ".join(f"{name} ({work.describe()})" for name, work in sorted(found.items()))
    return (f"{not_yet} after {_duration(waited_s)}, but at work: {tasks}: preparing, not hung; looked at again "
            f"in {_duration(again_s)} (for up to {PREPARING_MAX_S / 60:g} min after its start; --startup-timeout "
            "for longer)")


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


class Looks:
    """Two looks at the same tasks, :data:`LOOK_AGAIN_S` apart, for a tick loop. ``dump`` asks the
    host agents for the dumps of some tasks and returns each one's reply (None: none came)."""

    def __init__(self, dump: Callable[[list[str]], Mapping[str, dict | None]]) -> None:
        self.dump = dump
        self.first: tuple[float, dict[str, dict | None]] | None = None
        #: where each task stood at the last second look
        self.standings: dict[str, Standing] = {}
        #: whether each task did no work between the last two looks (:func:`idle_between`)
        self.idle: dict[str, bool] = {}

    def look(self, names: list[str], now: float, interval: float = LOOK_AGAIN_S) -> dict[str, Work] | None:
        """None while the second look is not due (the first is taken now if none is pending for
        these tasks); then the tasks of ``names`` found at work (possibly none). A caller that
        knows when its timeout falls takes the first look ``interval`` ahead of it, so that the
        verdict comes on time (:func:`interval_for`)."""
        if self.first is None or not set(names) <= set(self.first[1]) or now - self.first[0] > 3 * interval:
            self.first = (now, dict(self.dump(names)))
            return None
        if now - self.first[0] < interval:
            return None
        first = self.first[1]
        self.first = None
        second = self.dump(names)
        self.standings = {name: stand(name, second.get(name)) for name in names}
        self.idle = {name: idle_between(first.get(name), second.get(name)) for name in names}
        return {name: work for name in names if (work := at_work(name, first.get(name), second.get(name)))}

    def reset(self) -> None:
        """Forget a pending first look (what it looked for is over)."""
        self.first = None
