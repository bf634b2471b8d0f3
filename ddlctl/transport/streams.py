"""The byte streams a host session talks to its agent over: a subprocess's pipes (an SSH or
``srun`` client's) or, for a local agent, one end of a socket pair (a pipe can be reopened through
``/proc/<agent>/fd`` by a process that may ptrace the agent; a socket cannot)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
from pathlib import Path
from typing import Protocol


class Stream(Protocol):
    """A bidirectional byte stream to an agent."""

    def fileno(self) -> int: ...
    def read(self) -> bytes | None: ...  # None: nothing now; b"": ended
    def write(self, data: bytes) -> None: ...
    def errors(self) -> str: ...  # what the agent printed on stderr (for messages)
    def abandon(self) -> None: ...  # the agent went silent: cut it off (it then kills its tasks)
    def close(self) -> None: ...
    def ended(self) -> str: ...  # what the transport knows of why the stream ended ("" when nothing)


class PipeStream:
    """A local agent subprocess: its stdin and stdout."""

    def __init__(self, popen: subprocess.Popen[bytes], stderr_path: Path | None) -> None:
        self.popen = popen
        self.stderr_path = stderr_path
        assert popen.stdout is not None
        self._fd = popen.stdout.fileno()
        os.set_blocking(self._fd, False)

    def fileno(self) -> int:
        return self._fd

    def read(self) -> bytes | None:
        try:
            return os.read(self._fd, 262144)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(data)
        self.popen.stdin.flush()

    def errors(self) -> str:
        if self.stderr_path is None:
            return ""
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text(errors="replace")[-2000:]
        return ""

    def ended(self) -> str:
        """A local pipe says nothing more than its end."""
        return ""

    def abandon(self) -> None:
        """The agent stopped answering (stopped, wedged): kill it; its tasks die with it."""
        with contextlib.suppress(OSError):
            self.popen.kill()
        self.close()

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


class SocketStream(PipeStream):
    """A local agent subprocess whose stdin and stdout are one end of a socket pair: unlike a pipe,
    a socket cannot be opened again through ``/proc/<agent>/fd/1`` (ENXIO), so a task of the agent,
    a process of the same user, cannot write frames into ddlctl's stream or commands into the
    agent's (a pipe could: a forged exit was recorded for a running task)."""

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket, stderr_path: Path | None) -> None:
        self.popen = popen
        self.stderr_path = stderr_path
        self.sock = sock
        self._fd = sock.fileno()
        os.set_blocking(self._fd, False)

    def read(self) -> bytes | None:
        try:
            return self.sock.recv(262144)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view):]
            except BlockingIOError:
                select.select([], [self._fd], [], 1.0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
