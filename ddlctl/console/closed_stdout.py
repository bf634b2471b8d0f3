"""Standard output whose reader went away (``ddlctl launch ... | head``): the job and its record go
on, what is left to show is dropped, and ddlctl says so once, on stderr, at its end.

Python raises ``BrokenPipeError`` at the next write to a pipe nobody reads; rich's console answers
it by exiting with 1 at once, which left a failed job's root cause and its ``job failed`` line
unsaid and turned its exit code into 1. Here the descriptor is pointed at ``/dev/null`` instead
(so neither later writes nor the interpreter's flush at exit fail) and the fact is kept.
"""

from __future__ import annotations

import os
import sys

_closed: list[bool] = []


def mark_closed() -> None:
    """Stdout's reader is gone: point file descriptor 1 at /dev/null (once) and remember it."""
    if _closed:
        return
    _closed.append(True)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # (no file descriptor behind sys.stdout: nothing to point elsewhere)
        pass


def write(text: str) -> None:
    """``text`` to stdout, flushed (a program's JSON); dropped, and the reader's going kept, when
    stdout's reader is gone (Click would exit with 1 at once, whatever the command's own code)."""
    if _closed:
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        mark_closed()


def is_stdout(stream: object) -> bool:
    """Whether ``stream`` writes to file descriptor 1."""
    try:
        return stream.fileno() == 1  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def closing_note(what: str = "what followed was not shown") -> str | None:
    """The sentence ddlctl ends with when stdout's reader went away (``what``: what was not shown,
    and where it is kept), once; None otherwise."""
    if not _closed or len(_closed) > 1:
        return None
    _closed.append(True)
    return f"ddlctl: standard output was closed by its reader (as `| head` does): {what}"
