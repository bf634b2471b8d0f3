"""One sanitizer for every string a task or a host sends (its output, log tails, tracebacks, stacks,
task and process names, GPU names, messages) before it reaches a person's terminal (rich, the
live table, ddlctl's own lines) or a file another program reads (CSV cells). Standard library only.

What a terminal acts on is made visible, never passed: C0 controls but tab (ESC -> ``^[``, BEL ->
``^G``), DEL (``^?``), C1 controls (CSI -> ``<U+009B>``) and the bidirectional overrides and
isolates that make text read other than it is (``<U+202E>``). The files ddlctl keeps (task logs,
JSON records) keep the raw text; this is for showing it.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return "^" + chr(code + 0x40)
    return "^?" if code == 0x7F else f"<U+{code:04X}>"


def shown(text: object, keep_newlines: bool = False, limit: int | None = None) -> str:
    """``text`` (any object: ``str()`` of it) safe to show: every control character and direction
    override made visible; newlines kept when ``keep_newlines`` (a block printed line by line);
    at most ``limit`` characters (then ``…``)."""
    value = text if isinstance(text, str) else str(text)
    if limit is not None and len(value) > limit:
        value = value[:limit] + "…"
    return (_UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE).sub(_show, value)


#: What makes a spreadsheet read a cell as a formula (OWASP's list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """``value`` for a CSV cell: numbers as they are; text :func:`shown`, and quoted with a leading
    ``'`` when a spreadsheet would take it for a formula (``=cmd|...``, ``+1``, ``@SUM``)."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = str(value)
    if text.startswith(_FORMULA_START) and len(text) > 1:  # (a lone "-" is a missing value)
        text = "'" + text
    return shown(text)
