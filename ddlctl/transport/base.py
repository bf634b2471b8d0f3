"""The small interface every transport implements, and the exit status value."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Protocol

from ddlctl.cluster.model import Host
from ddlctl.planning.plan import TaskSpec


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"`` (``"signal 99"`` when unknown)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit ``code``, or the ``signal`` that killed it."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From ``Popen.returncode`` (negative: killed by that signal)."""
        return cls(signal=-returncode) if returncode < 0 else cls(code=returncode)

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def shell_code(self) -> int:
        """The code a shell would report: the exit code, or 128 + signal number."""
        return self.code if self.code is not None else 128 + (self.signal or 0)

    def describe(self) -> str:
        if self.code is not None:
            return f"exit code {self.code}"
        return f"killed by {signal_name(self.signal or 0)}"


class TaskProcess(Protocol):
    """One started task (behind its watchdog)."""

    spec: TaskSpec

    def fileno(self) -> int:
        """A file descriptor that becomes readable when output (or EOF) is available."""

    def read(self) -> bytes | None:
        """Output available now; ``None`` when there is none yet, ``b""`` once it has ended."""

    def poll(self) -> ExitStatus | None:
        """The exit status once the task has ended, else None."""

    def send(self, sig: str) -> None:
        """Ask the watchdog to send ``"TERM"``, ``"INT"`` or ``"KILL"`` to the task's group."""

    def force_kill(self) -> None:
        """Last resort when the watchdog does not answer: kill it (the task dies with it)."""

    def pids(self) -> dict[str, object]:
        """Process ids to record in the run directory (for ``ddlctl stop``)."""


class Transport(Protocol):
    """Starts tasks on one host."""

    host: Host

    def free_ports(self, count: int) -> list[int]:
        """``count`` distinct TCP ports free on the host now."""

    def start(self, spec: TaskSpec, grace_s: float) -> TaskProcess:
        """Start ``spec`` under a watchdog that kills it ``grace_s`` after TERM."""

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts about the host (``ddlctl.runtime.probe``); ``quick_ports``: launch-time form."""

    def port_open(self, port: int) -> bool:
        """Whether something on the host accepts connections on ``port``."""

    def close(self) -> None:
        """Release connections."""
