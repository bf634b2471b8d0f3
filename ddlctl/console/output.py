"""Turning several tasks' byte streams into whole, prefixed lines on one terminal."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import BinaryIO

from ddlctl.console import closed_stdout as stdoutgone
from ddlctl.console.collapse import LineWriter


class LineSplitter:
    """Cuts a byte stream into whole lines, holding back an unfinished tail.

    A line ends with ``\\n``, ``\\r\\n`` or ``\\r`` (progress-bar updates stay whole, one per
    segment). A tail without terminator is released by :meth:`flush_stale` once it has waited
    ``stale_s`` (a prompt, a progress bar without newline) or grown past ``max_partial`` bytes.
    """

    def __init__(self, max_partial: int = 65536) -> None:
        self.pending = b""
        self.pending_since: float | None = None
        self.max_partial = max_partial

    def feed(self, data: bytes, now: float) -> list[bytes]:
        """Add ``data``; return the complete lines it finished."""
        buffer = self.pending + data
        # where the last whole line ends: the last \n, or the last \r that is not the buffer's last
        # byte (that one may be half of a \r\n). Found from the end, and only in what came now (the
        # held tail has no line end, but perhaps a final \r): a regex over the tail at every feed
        # cost time in the square of a long line without a newline (200 KB: minutes)
        start = max(0, len(self.pending) - 1)
        end = max(buffer.rfind(b"\n", start), buffer.rfind(b"\r", start, len(buffer) - 1)) + 1
        # (bytes.splitlines breaks at \n, \r\n and \r alone, keeping them; in C)
        lines = buffer[:end].splitlines(keepends=True) if end else []
        self.pending = buffer[end:]
        if not self.pending:
            self.pending_since = None
        elif self.pending_since is None or end:
            self.pending_since = now
        if len(self.pending) >= self.max_partial:
            lines.append(self.pending)
            self.pending, self.pending_since = b"", None
        return lines

    def flush_stale(self, now: float, stale_s: float = 2.0) -> list[bytes]:
        """Release the unfinished tail if it has waited ``stale_s`` seconds. (Not much less: Python's
        ``print('a', x)`` to an unbuffered pipe is several writes, and a task descheduled between
        them on a loaded machine had its line shown in two at 0.5 s.)"""
        if self.pending and self.pending_since is not None and now - self.pending_since >= stale_s:
            return self.flush()
        return []

    def flush(self) -> list[bytes]:
        """Release whatever is held (end of output)."""
        lines = [self.pending] if self.pending else []
        self.pending, self.pending_since = b"", None
        return lines


_COLORS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)
#: C0 controls but tab, DEL, and C1 controls as UTF-8 (U+0080-U+009F): what a terminal acts on.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]|\xc2[\x80-\x9f]")
_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # colours and text attributes only
_SGR_OR_CONTROL = re.compile(_SGR.pattern + b"|" + _CONTROL.pattern)
#: The bytes of a plain block (printable ASCII, tabs, the newlines between its lines): deleting them
#: from a block leaves nothing unless it needs line-by-line care (a control character, a byte that
#: is not ASCII). bytes.translate does it 12x faster than a regex search (0.4 against 5 ms a MiB).
_PLAIN_BYTES = bytes(range(0x20, 0x7F)) + b"\t\n"


def _show(match: re.Match[bytes]) -> bytes:
    raw = match.group()
    if len(raw) == 2:  # C1
        return f"<U+{raw[1]:04X}>".encode()  # U+0080-U+009F is 0xC2 0x80-0x9F
    return b"^?" if raw == b"\x7f" else b"^" + bytes([raw[0] + 0x40])


def _show_but_colors(match: re.Match[bytes]) -> bytes:
    return match.group() if _SGR.fullmatch(match.group()) else _show(match)


def visible(line: bytes, keep_colors: bool = False) -> bytes:
    """``line`` with every control character a terminal would act on made visible (ESC -> ``^[``,
    BEL -> ``^G``, CSI -> ``<U+009B>``): a task's output cannot move the cursor, rewrite ddlctl's
    lines or set the clipboard. Tabs stay. ``keep_colors``: colour sequences (``ESC [ ... m``)
    pass unchanged. Bytes that are not UTF-8 are shown escaped (``\\x9b``): a lone 0x9B is CSI to
    a terminal in an 8-bit locale. The task logs keep the raw bytes."""
    if not line.isascii():
        line = line.decode("utf-8", "backslashreplace").encode("utf-8")
    if keep_colors:
        return _SGR_OR_CONTROL.sub(_show_but_colors, line)
    return _CONTROL.sub(_show, line)


class PrefixedWriter:
    """Writes tasks' lines to ``stream`` as ``[worker:1@host] line`` (control characters made
    visible: :func:`visible`); coloured prefixes on a terminal."""

    def __init__(self, stream: BinaryIO, color: bool | None = None, task_colors: bool = False) -> None:
        self.stream = stream
        self.task_colors = task_colors
        if color is None:
            isatty = getattr(stream, "isatty", lambda: False)
            color = bool(isatty()) and "NO_COLOR" not in os.environ
        self.color = color
        self._prefixes: dict[str, bytes] = {}

    def prefix(self, task: str, host: str) -> bytes:
        key = f"{task}@{host}"
        if key not in self._prefixes:
            text = f"[{key}]"
            if self.color:
                code = _COLORS[len(self._prefixes) % len(_COLORS)]
                text = f"\x1b[{code}m{text}\x1b[0m"
            self._prefixes[key] = text.encode() + b" "
        return self._prefixes[key]

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        if not lines:
            return
        prefix = self.prefix(task, host)
        plain = b"\n".join([line.rstrip(b"\r\n") for line in lines])
        if not plain.translate(None, _PLAIN_BYTES):  # a block of printable ASCII lines: one pass, one write
            out = prefix + plain.replace(b"\n", b"\n" + prefix) + b"\n"
        else:
            out = b"".join(prefix + visible(line.rstrip(b"\r\n"), self.task_colors) + b"\n" for line in lines)
        try:
            self.stream.write(out)
            self.stream.flush()
        except BrokenPipeError:  # the reader of our stdout went away; the log files still have everything
            if stdoutgone.is_stdout(self.stream):
                stdoutgone.mark_closed()
        except ValueError:
            pass

    def tick(self, now: float) -> None:
        """Nothing is held here."""

    def flush(self) -> None:
        """Nothing is held here."""


class QuietWriter:
    """Leaves lines that ``hide`` matches (TensorFlow's start-up notices) off the console, and says
    so once; the task logs keep every byte. Same interface as :class:`PrefixedWriter`."""

    def __init__(self, inner: LineWriter, hide: Callable[[bytes], bool], on_first: Callable[[], None],
                 in_block: Callable[[bytes], bool] | None = None) -> None:
        self.inner = inner
        self.hide = hide
        self.in_block = in_block  # whether a block of lines may hold one to hide (one scan)
        self.on_first = on_first
        self.hidden = 0

    def write(self, task: str, host: str, lines: list[bytes]) -> None:
        if self.in_block is not None and not self.in_block(b"".join(lines)):
            self.inner.write(task, host, lines)
            return
        shown = [line for line in lines if not self.hide(line)]
        if len(shown) < len(lines):
            if not self.hidden:
                self.on_first()
            self.hidden += len(lines) - len(shown)
        self.inner.write(task, host, shown)

    def tick(self, now: float) -> None:
        self.inner.tick(now)

    def flush(self) -> None:
        self.inner.flush()
