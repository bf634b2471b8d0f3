"""The small interfaces every transport implements: a started task, a host agent's session, a host."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ddlctl.cluster.model import Host
from ddlctl.planning.plan import TaskSpec
from ddlctl.transport.status import ExitStatus

if TYPE_CHECKING:
    from ddlctl.transport.session import HostSession


class TaskProcess(Protocol):
    """One started task (through its host's agent)."""

    spec: TaskSpec
    listening: bool  # its own process group listens on its port (the agent saw it)
    ended_t: float | None  # wall time the agent saw it end (orders simultaneous exits)

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


class AgentSession(Protocol):
    """What the supervisor uses of one host agent's session (:class:`~.session.HostSession`)."""

    lost: str | None  # why the connection ended unexpectedly (None while it is up)
    lost_at: float | None
    clock_offset: float | None  # the host's clock less this machine's, seconds (None: not known yet)
    clock_frames: int  # the frames that told it (a bound of a few is loose: a late read lowers it)

    def fileno(self) -> int:
        """A descriptor that becomes readable when the agent has sent something."""

    def pump(self) -> None:
        """Read what the agent sent (never blocks)."""

    def start(self, spec: TaskSpec, grace_s: float) -> TaskProcess:
        """Ask the agent to start ``spec``."""

    def take_pids_changed(self) -> bool:
        """Whether a task reported its pids since the last call."""

    def step_counts(self) -> Mapping[str, tuple[int, float]]:
        """Task -> (step records so far, when the count last grew)."""

    def progress(self) -> Mapping[str, tuple[int, int | None]]:
        """Task -> (highest step reached, declared total)."""

    def credits(self) -> Mapping[str, Mapping[str, int]]:
        """Task -> worker -> the steps that worker ran for it (a ps chief's records say)."""

    def activity(self) -> Mapping[str, tuple[int, str | None]]:
        """Task -> (lines of its phases file so far, the phase it is in: None if none)."""

    def beats(self) -> Mapping[str, str]:
        """Task -> the kind of its last beat ("eval", "train"), for tasks that wrote one."""

    def paces(self) -> Mapping[str, Mapping[str, tuple[float, float | None, int]]]:
        """Task -> who ran its steps -> (median s a step lately, median sync s a step or None, records)."""

    def request_trace(self, name: str, request: dict) -> None:
        """Ask task ``name`` for a profiler capture (``--trace auto``)."""

    def check_silence(self, limit_s: float, now: float | None = None) -> bool:
        """Lose (and cut off) the session when the agent said nothing for ``limit_s``."""

    def heard(self) -> None:
        """Count the agent as heard now (ddlctl itself was not listening: its silence is not the agent's)."""

    def request_dump(self, names: Sequence[str]) -> None:
        """Ask for the processes and Python stacks of ``names``."""

    def dump_of(self, name: str) -> dict | None:
        """The dump of ``name`` once it came."""

    def wait_for(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Pump until ``ready()``, the timeout, or the connection is lost."""

    def check_ports(self, ports: dict[str, int], timeout: float = 10.0) -> dict[str, int]:
        """The given ports where still free on the host, fresh ones where not."""

    def list_files(self, folder: str, timeout: float = 60.0) -> dict[str, tuple[int, int]]:
        """Files under ``folder``: relative path -> (size, mtime in ns)."""

    def read_file(self, path: str, timeout: float = 600.0) -> bytes:
        """A file's bytes."""

    def write_file(self, path: str, data: bytes, mtime_ns: int | None = None, timeout: float = 600.0) -> None:
        """Write a file (atomically)."""

    def read_chunks(self, path: str, timeout: float = 600.0) -> Iterator[bytes]:
        """A file's bytes, piece by piece as they come."""

    def write_chunks(self, path: str, chunks: Iterable[bytes], mtime_ns: int | None = None,
                     timeout: float = 600.0) -> int:
        """Write a file (atomically) from pieces as they come; the bytes written."""


class Transport(Protocol):
    """Reaches one host: probes, ports, and the session of its host agent."""

    host: Host

    def free_ports(self, count: int) -> list[int]:
        """``count`` distinct TCP ports free on the host now."""

    def open_session(self, run_id: str, log_dir: Path, ports: int | None = None) -> HostSession:
        """Start the host agent of run ``run_id``; its session starts and watches the host's tasks.
        With ``ports``, its hello carries the launch-time probe with that many free ports."""

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts about the host (``ddlctl.host.probe``); ``quick_ports``: launch-time form."""

    def reopen(self, run_id: str, log_dir: Path) -> HostSession:
        """After a lost connection: reach the host again and start a new agent (raises
        ``HostGoneError`` when it cannot come back, e.g. its Slurm job ended)."""

    def address(self) -> str | None:
        """The host's network address when its name is an alias (None: its name)."""

    def source_address(self) -> str | None:
        """This machine's address as the host sees it (None: not known from this transport)."""

    def close(self) -> None:
        """Release connections."""
