"""How a process ended (:class:`ExitStatus`) and signal names: plain values every layer shares."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"`` (``"signal 99"`` when unknown)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit ``code``, the ``signal`` that killed it, or ``lost``: the
    connection to its host ended (its host agent kills it then; its own status is unknown).
    ``oom``: what says that the signal was the kernel's out-of-memory killer's. ``not_started``:
    why its host agent could not start it (the code is then the agent's: 2, 126, 127). ``profiling``:
    the profiler session a task killed by a signal had open (``ddlctl.task.trace``)."""

    code: int | None = None
    signal: int | None = None
    lost: bool = False
    oom: str | None = None
    not_started: str | None = None
    profiling: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def shell_code(self) -> int:
        """The code a shell would report: the exit code, or 128 + signal number."""
        if self.lost:
            return 255  # what ssh reports for a dropped connection
        return self.code if self.code is not None else 128 + (self.signal or 0)

    def describe(self) -> str:
        if self.lost:
            return "connection to its host lost"
        if self.code is not None:
            return f"exit code {self.code}"
        if self.oom:
            return f"killed by {signal_name(self.signal or 0)}: out of memory ({self.oom})"
        return f"killed by {signal_name(self.signal or 0)}"
