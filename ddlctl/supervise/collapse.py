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

from ddlctl.report.grouping import hosts_label, task_range

#: How long a line waits for the same line from other tasks before it is shown.
WINDOW_S = 0.5

class LineWriter(Protocol):
    """Where task lines go: ``write(task, host, lines)``; ``tick(now)`` lets held lines out when
    their time has come and ``flush()`` lets every held line out (before ddlctl's own messages)."""

    def write(self, task: str, host: str, lines: list[bytes]) -> None: ...

    def tick(self, now: float) -> None: ...

    def flush(self) -> None: ...


@dataclass
class _Group:
    text: bytes  # the line without its terminator
    line: bytes  # the first task's raw line
    since: float
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (task, host), in arrival order


class CollapsingWriter:
    """Holds each task line up to ``window_s``; the same line from other tasks meanwhile joins it
    and is shown once with their range. Same interface as :class:`ddlctl.supervise.output.PrefixedWriter`
    (plus :meth:`tick` and :meth:`flush`, which the supervisor calls)."""

    def __init__(self, inner: LineWriter, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.window_s = window_s
        self.clock = clock  # the supervisor's clock: tick(now) is given its time
        self._groups: list[_Group] = []
        self.merged = 0  # lines not shown because an identical one from another task was

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        """Hold ``lines`` of ``task``. A line joins an earlier identical one from other tasks; when
        this task has printed other lines since, the merged line moves down after them, unless that
        would put it after a later line of one of its tasks (every task's lines keep their order)."""
        if not lines:
            return
        now = self.clock()
        for line in lines:
            text = line.rstrip(b"\r\n")
            last = max((i for i, g in enumerate(self._groups) if any(t == task for t, _ in g.tasks)), default=-1)
            for index, group in enumerate(self._groups):
                if group.text != text or now - group.since >= self.window_s or any(t == task for t, _ in group.tasks):
                    continue
                if index < last:
                    members = {t for t, _ in group.tasks}
                    if any(t in members for h in self._groups[index + 1:last + 1] for t, _ in h.tasks):
                        continue  # moving it down would pass a later line of one of its tasks
                    self._groups.insert(last, self._groups.pop(index))
                group.tasks.append((task, host))
                self.merged += 1
                break
            else:
                self._groups.append(_Group(text, line, now, [(task, host)]))
        self.tick(now)

    def tick(self, now: float) -> None:
        """Show the held lines, in order, up to the first whose window has not passed."""
        due = 0
        while due < len(self._groups) and now - self._groups[due].since >= self.window_s:
            due += 1
        if due:
            self._show(self._groups[:due])
            del self._groups[:due]

    def flush(self) -> None:
        """Show every held line now."""
        groups, self._groups = self._groups, []
        self._show(groups)
        self.inner.flush()

    def _show(self, groups: list[_Group]) -> None:
        for group in groups:
            if len(group.tasks) == 1:
                task, host = group.tasks[0]
            else:
                task, host = task_range(t for t, _ in group.tasks), hosts_label(h for _, h in group.tasks)
            self.inner.write(task, host, [group.line])
