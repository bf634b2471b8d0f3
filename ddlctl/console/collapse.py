"""One console line for what many tasks say: an identical line printed by several tasks within a
short window is shown once, prefixed with the tasks as a range (``[worker:0-7@localhost]``).

Only identical lines merge (a warning that differs by one character is shown on its own); a task's
own lines keep their order; ``--verbose`` and the task logs keep every line of every task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ddlctl.contract.grouping import hosts_label, task_range

#: How long a line waits for the same line from other tasks before it is shown.
WINDOW_S = 0.5
#: The most lines held at once: a task printing faster than this per window has its oldest lines
#: shown sooner (what every held line costs a new one stays bounded).
MAX_HELD = 1000

class LineWriter(Protocol):
    """Where task lines go: ``write(task, host, lines)``; ``tick(now)`` lets held lines out when
    their time has come and ``flush()`` lets every held line out (before ddlctl's own messages)."""

    def write(self, task: str, host: str, lines: list[bytes]) -> None: ...

    def tick(self, now: float) -> None: ...

    def flush(self) -> None: ...


@dataclass(eq=False)  # (two held lines are two, however alike)
class _Group:
    text: bytes  # the line without its terminator
    line: bytes  # the first task's raw line
    since: float
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (task, host), in arrival order


class CollapsingWriter:
    """Holds each task line up to ``window_s``; the same line from other tasks meanwhile joins it
    and is shown once with their range. Same interface as :class:`ddlctl.console.output.PrefixedWriter`
    (plus :meth:`tick` and :meth:`flush`, which the supervisor calls)."""

    def __init__(self, inner: LineWriter, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, tasks: int | None = None) -> None:
        self.inner = inner
        self.alone = tasks == 1  # one task: no line can ever merge, none is held
        self.window_s = window_s
        self.clock = clock  # the supervisor's clock: tick(now) is given its time
        self._groups: list[_Group] = []
        # the held lines by text, and how many of those hold each task's: a line with no identical
        # one held, or only identical ones of its own task, is placed without looking at the others
        self._by_text: dict[bytes, list[_Group]] = {}
        self._holding: dict[tuple[bytes, str], int] = {}
        self._last: dict[str, _Group] = {}  # each task's latest held line (the last of its held ones)
        self.merged = 0  # lines not shown because an identical one from another task was

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        """Hold ``lines`` of ``task``. A line joins an earlier identical one from other tasks; when
        this task has printed other lines since, the merged line moves down after them, unless that
        would put it after a later line of one of its tasks (every task's lines keep their order)."""
        if not lines:
            return
        if self.alone:
            self.inner.write(task, host, lines)
            return
        now = self.clock()
        for line in lines:
            text = line.rstrip(b"\r\n")
            same = self._by_text.get(text, [])
            group = self._join(task, text, now) if len(same) > self._holding.get((text, task), 0) else None
            if group is None:
                group = _Group(text, line, now, [])
                self._groups.append(group)
                self._by_text.setdefault(text, []).append(group)
            else:
                self.merged += 1
            group.tasks.append((task, host))
            self._holding[text, task] = self._holding.get((text, task), 0) + 1
            self._last[task] = group
        self.tick(now)
        if len(self._groups) > MAX_HELD:
            self._release(len(self._groups) - MAX_HELD)

    def _join(self, task: str, text: bytes, now: float) -> _Group | None:
        """The held line identical to ``text`` that ``task``'s joins (moved down after the task's
        last held line if need be), or None."""
        mine = self._last.get(task)
        last = self._groups.index(mine) if mine is not None else -1
        viable = [g for g in self._by_text[text]
                  if now - g.since < self.window_s and all(t != task for t, _ in g.tasks)]
        for group in sorted(viable, key=self._groups.index):
            index = self._groups.index(group)
            if index < last:
                members = {t for t, _ in group.tasks}
                if any(t in members for h in self._groups[index + 1:last + 1] for t, _ in h.tasks):
                    continue  # moving it down would pass a later line of one of its tasks
                self._groups.insert(last, self._groups.pop(index))
            return group
        return None

    def tick(self, now: float) -> None:
        """Show the held lines, in order, up to the first whose window has not passed."""
        due = 0
        while due < len(self._groups) and now - self._groups[due].since >= self.window_s:
            due += 1
        self._release(due)

    def flush(self) -> None:
        """Show every held line now."""
        self._release(len(self._groups))
        self.inner.flush()

    def _release(self, count: int) -> None:
        """Show the first ``count`` held lines and forget them."""
        if count <= 0:
            return
        groups = self._groups[:count]
        del self._groups[:count]
        for group in groups:
            same = self._by_text[group.text]
            same.remove(group)  # (by identity; the oldest held are released first: found at once)
            if not same:
                del self._by_text[group.text]
            for task, _ in group.tasks:
                if self._last.get(task) is group:
                    del self._last[task]
                key = (group.text, task)
                self._holding[key] -= 1
                if not self._holding[key]:
                    del self._holding[key]
        self._show(groups)

    def _show(self, groups: list[_Group]) -> None:
        """Each group's line under its tasks' prefix; a run of lines of one task in one write."""
        run: list[bytes] = []
        who: tuple[str, str] | None = None
        for group in groups:
            if len(group.tasks) == 1:
                task, host = group.tasks[0]
            else:
                task, host = task_range(t for t, _ in group.tasks), hosts_label(h for _, h in group.tasks)
            if (task, host) != who:
                if run and who is not None:
                    self.inner.write(*who, run)
                run, who = [], (task, host)
            run.append(group.line)
        if run and who is not None:
            self.inner.write(*who, run)
