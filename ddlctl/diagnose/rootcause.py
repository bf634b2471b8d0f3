"""Finding the root cause of a failed task in its output: the last Python traceback, or the tail."""

from __future__ import annotations

import re
from pathlib import Path

TRACEBACK_HEAD = "Traceback (most recent call last):"
#: How Python reports a syntax error in the script it was asked to run: no traceback, the place,
#: up to three lines of source and caret, then the error.
SYNTAX_ERROR = re.compile(r'^ *File "(?P<file>[^"\n]+)", line (?P<line>\d+)\n(?:[ \t].*\n){0,3}'
                          r"(?:SyntaxError|IndentationError|TabError): .*$", re.M)


def last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``text`` (a final error is the last one said)."""
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - the last one
        pass
    return found


def line_at(text: str, index: int) -> str:
    """The line of ``text`` that holds ``index``, stripped."""
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start:end if end >= 0 else len(text)].strip()


#: What a full disk (ENOSPC) or a spent quota (EDQUOT) is called in an error, Python's or TensorFlow's.
DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded")
_PATH = re.compile(r"(/[^\s;'\"]+)")


def disk_full(text: str) -> tuple[str, str | None] | None:
    """(the words, the file being written when the error names one) when the last line of
    ``text`` (a task's final error) that says so is a full disk or a spent quota: Python's
    ``OSError: [Errno 28] No space left on device: '/path'``, TensorFlow's ``.../ckpt-8_temp/...;
    No space left on device [Op:SaveV2]``; None otherwise."""
    found = last_match(DISK_FULL, text)
    if found is None:
        return None
    paths = [p.rstrip(".,:") for p in _PATH.findall(line_at(text, found.start()))]
    paths = [p for p in paths if len(p) > 1 and not p.startswith("/job:")]  # (not a TensorFlow device name)
    return found.group(0), (paths[-1] if paths else None)


#: TensorFlow's words for a tensor its device's allocator could not give (CPU or GPU), and PyTorch's.
TF_OOM = re.compile(r"OOM when allocating tensor with shape\[([^\]]*)\] and type (\w+) on (\S+) by allocator (\S+)")
CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ \w+)\.?(?: GPU (\d+) has a total capacity of "
                      r"([\d.]+ \w+) of which ([\d.]+ \w+) is free)?")


def device_oom(text: str) -> str | None:
    """"out of memory on DEVICE (what could not be allocated)" when ``text`` (a task's final error)
    is TensorFlow's or PyTorch's report of a device running out of memory; None otherwise."""
    tf_match = last_match(TF_OOM, text)
    if tf_match is not None:
        shape, dtype, device, allocator = tf_match.groups()
        where = device.rsplit("device:", 1)[-1]
        return f"out of memory on {where} (a {dtype} tensor of shape [{shape}], allocator {allocator})"
    cuda = last_match(CUDA_OOM, text)
    if cuda is not None:
        size, gpu, total, free = cuda.groups()
        room = f"; {total} in all, {free} free" if total else ""
        return f"out of memory on {f'GPU {gpu}' if gpu else 'the GPU'} (tried to allocate {size}{room})"
    return None


def read_tail(path: str | Path, max_bytes: int = 256 * 1024) -> str:
    """The last ``max_bytes`` of a log file as text (undecodable bytes replaced)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes).decode("utf-8", "replace")  # (bounded: a device reads on forever)
    except OSError:
        return ""


def syntax_error(text: str) -> re.Match[str] | None:
    """The last report of a syntax error in the script Python was asked to run (it has no
    traceback), when nothing but output without a traceback follows it."""
    found = last_match(SYNTAX_ERROR, text)
    return found if found is not None and TRACEBACK_HEAD not in text[found.end():] else None


def last_traceback(text: str, max_lines: int = 60) -> list[str]:
    """The last Python traceback in ``text``: from its header to the exception line (a syntax
    error in the script Python ran, which has no traceback: its report)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    # (the header may follow output that did not end its line: a prompt of ``input()``)
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK_HEAD)]
    if not starts:
        syntax = syntax_error(text)
        return syntax.group(0).split("\n") if syntax is not None else []
    start = starts[-1]
    block = [TRACEBACK_HEAD]
    for line in lines[start + 1:]:
        block.append(line)
        if line and not line[0].isspace():  # the exception line ends the traceback
            break
    if len(block) > max_lines:
        block = block[:5] + ["  ..."] + block[-(max_lines - 6):]
    return block


def tail_lines(text: str, count: int = 20) -> list[str]:
    """The last ``count`` non-empty lines of ``text``."""
    lines = [line for line in text.replace("\r", "\n").split("\n") if line.strip()]
    return lines[-count:]
