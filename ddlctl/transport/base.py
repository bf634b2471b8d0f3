"""The small interface every transport implements, and the exit status value."""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ddlctl.cluster.model import Host
from ddlctl.planning.plan import TaskSpec

if TYPE_CHECKING:
    from ddlctl.transport.session import HostSession


def signal_name(number: int) -> str:
    """``9`` -> ``"SIGKILL"`` (``"signal 99"`` when unknown)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit ``code``, the ``signal`` that killed it, or ``lost``: the
    connection to its host ended (its host agent kills it then; its own status is unknown)."""

    code: int | None = None
    signal: int | None = None
    lost: bool = False

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
        if self.lost:
            return 255  # what ssh reports for a dropped connection
        return self.code if self.code is not None else 128 + (self.signal or 0)

    def describe(self) -> str:
        if self.lost:
            return "connection to its host lost"
        if self.code is not None:
            return f"exit code {self.code}"
        return f"killed by {signal_name(self.signal or 0)}"


class TaskProcess(Protocol):
    """One started task (through its host's agent)."""

    spec: TaskSpec

    def read(self) -> bytes | None:
        """Output available now; ``None`` when there is none yet, ``b""`` once it has ended."""

    def poll(self) -> ExitStatus | None:
        """The exit status once the task has ended, else None."""

    def send(self, sig: str) -> None:
        """Ask the host agent to send ``"TERM"``, ``"INT"`` or ``"KILL"`` to the task's group."""

    def force_kill(self) -> None:
        """Last resort: SIGKILL now."""

    def pids(self) -> dict[str, object]:
        """Process ids to record in the run directory (for ``ddlctl stop``)."""


class Transport(Protocol):
    """Reaches one host: probes, ports, and the session of its host agent."""

    host: Host

    def free_ports(self, count: int) -> list[int]:
        """``count`` distinct TCP ports free on the host now."""

    def open_session(self, run_id: str, log_dir: Path, ports: int | None = None) -> HostSession:
        """Start the host agent of run ``run_id``; its session starts and watches the host's tasks.
        With ``ports``, its hello carries the launch-time probe with that many free ports."""

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts about the host (``ddlctl.runtime.probe``); ``quick_ports``: launch-time form."""

    def close(self) -> None:
        """Release connections."""
