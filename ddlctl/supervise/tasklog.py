"""A task's ``output.log`` (or an agent's telemetry file) as the supervisor writes it: a write the
disk refuses (full, a spent quota, an I/O error) never stops the supervisor. The file keeps what it
took; the rest is kept here, its last :data:`KEPT_BYTES`, so that the root cause of a task that
failed still reads its final error; the person is told once which file lost what, and why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddlctl.contract.diskspace import write_failure
from ddlctl.diagnose.rootcause import read_tail

#: What is kept in memory of the output a log could not take (the root cause reads as much).
KEPT_BYTES = 256 * 1024


class TaskLog:
    """An append-only log file that survives the disk refusing it (see the module docstring).
    ``said``: called once, with a sentence (ending in ``after``), when the first write fails."""

    def __init__(self, path: str | Path, said: Callable[[str], None] = lambda _msg: None,
                 after: str = "what follows is not kept there") -> None:
        self.path = Path(path)
        self.said, self.after = said, after
        self.failure: str | None = None
        self.unwritten = bytearray()  # the tail of what the file could not take
        self.written = 0  # bytes given to write() so far, and where the task's current attempt began
        self.attempt_from = 0
        self._file = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            self._failed(exc)

    def write(self, data: bytes) -> None:
        """Append ``data`` (to memory, once the file has refused a write)."""
        self.written += len(data)
        view = memoryview(data)
        while self._file is not None and view:
            try:
                written = self._file.write(view)
                if not written:  # (nothing taken, no error: never loop on it)
                    raise OSError(0, "the file took nothing")
                view = view[written:]  # (a short write: the rest again)
            except OSError as exc:
                self._failed(exc)
        if not view:
            return
        self.unwritten += view
        if len(self.unwritten) > KEPT_BYTES:
            del self.unwritten[:len(self.unwritten) - KEPT_BYTES]

    def tail(self, max_bytes: int = KEPT_BYTES) -> str:
        """The last ``max_bytes`` of the output, the file's and what it could not take, as text."""
        kept = bytes(self.unwritten[-max_bytes:]).decode("utf-8", "replace")
        if len(kept) >= max_bytes:
            return kept
        return read_tail(self.path, max_bytes - len(kept)) + kept

    def mark(self) -> None:
        """The task starts (again) here: :meth:`attempt` is what it writes from now on."""
        self.attempt_from = self.written

    def attempt(self, max_bytes: int = KEPT_BYTES) -> str:
        """The tail of the output of the task's current attempt only (an earlier attempt's final
        error is not this one's)."""
        return self.tail(min(max_bytes, self.written - self.attempt_from)) if self.written > self.attempt_from else ""

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # (unbuffered: nothing left to write)
            self._file = None

    def _failed(self, exc: OSError) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.failure is None:
            self.failure = write_failure(self.path, exc)
            self.said(f"{self.failure}: {self.after}")
