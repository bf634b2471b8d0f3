"""Reading a task's ``steps.jsonl`` into columns (:class:`TaskSteps`); a half-written last line is
counted, not fatal."""

from __future__ import annotations

import json
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Annotated

import msgspec

from ddlctl.contract.runfolder import read_last


@dataclass
class TaskSteps:
    """Step records of one task, as compact columns."""

    name: str
    step: array = field(default_factory=lambda: array("q"))
    start_us: array = field(default_factory=lambda: array("q"))
    duration: array = field(default_factory=lambda: array("d"))
    samples: array = field(default_factory=lambda: array("q"))  # -1: unknown
    input_s: array = field(default_factory=lambda: array("d"))  # -1: not recorded
    sync_s: array = field(default_factory=lambda: array("d"))  # -1: not recorded
    block: int = 1  # steps per record (steps_per_execution)
    bad_lines: int = 0
    unread_bytes: int = 0  # the start of a steps file past RECORDS_READ_MAX, not read
    worker: list = field(default_factory=list)  # per record: the task that ran it (ps), or None
    total: int | None = None  # steps the task declared it would run


def since(steps: TaskSteps, start_us: float) -> None:
    """Drop (in place) the records that began before ``start_us``."""
    keep = [i for i, start in enumerate(steps.start_us) if start >= start_us]
    if len(keep) == len(steps.start_us):
        return
    for name in ("step", "start_us", "duration", "samples", "input_s", "sync_s"):
        column = getattr(steps, name)
        setattr(steps, name, array(column.typecode, (column[i] for i in keep)))
    steps.worker = [steps.worker[i] for i in keep if i < len(steps.worker)]


def kept_records(steps: TaskSteps, warmup: int) -> slice:
    """The records every statistic uses: all but the first ``warmup`` (none when there are no more)."""
    return slice(warmup, None) if len(steps.step) > warmup else slice(0, 0)


try:  # orjson decodes about twice as fast as the json module (the report's main cost at scale)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - a dependency; json still works
    _loads = json.loads


def parse_json_lines(data: bytes) -> tuple[list, int]:
    """Objects of a JSON-lines text and the number of unreadable lines. One decode of the whole
    file as an array when every line is sound (fast), line by line otherwise."""
    body = data.strip()
    if not body:
        return [], 0
    try:
        return _loads(b"[" + body.replace(b"\n", b",") + b"]"), 0
    except ValueError:
        pass
    records, bad = [], 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            records.append(_loads(line))
        except ValueError:
            bad += 1
    return records, bad


#: Bounds on a record's numbers (a task writes them: one past its column's type or a float past any
#: real duration is a bad line, not the end of the report).
INT_MAX = 1 << 62
SECONDS_MAX = 1e12
_Int = Annotated[int, msgspec.Meta(ge=-INT_MAX, le=INT_MAX)]
_Seconds = Annotated[float, msgspec.Meta(ge=-SECONDS_MAX, le=SECONDS_MAX)]


class _StepRecord(msgspec.Struct):
    """A step record as ddlctl writes it (:mod:`ddlctl.task.steps`): only what the report reads is decoded."""

    step: _Int
    start_us: _Int
    duration_s: _Seconds
    samples: _Int | None = None
    input_s: _Seconds | None = None
    sync_s: _Seconds | None = None
    steps: Annotated[int, msgspec.Meta(ge=1, le=1 << 31)] = 1
    worker: str | None = None
    task: str | None = None
    total: _Int | None = None


def bounded_int(value: object) -> int:
    """``value`` as a record's integer: an int, or a float with an integer's value, within
    :data:`INT_MAX`; else ValueError."""
    number = int(value)  # type: ignore[call-overload]  # (TypeError, OverflowError for inf)
    if number != value or not -INT_MAX <= number <= INT_MAX:
        raise ValueError(f"not a record's integer: {value!r}")
    return number


def bounded_seconds(value: object) -> float:
    """``value`` as a record's seconds: a finite number within :data:`SECONDS_MAX`; else ValueError."""
    number = float(value)  # type: ignore[arg-type]
    if not -SECONDS_MAX <= number <= SECONDS_MAX:  # (NaN too)
        raise ValueError(f"not a record's seconds: {value!r}")
    return number


_STEP_FILE = msgspec.json.Decoder(list[_StepRecord])
_STEP_COLUMNS = attrgetter("step", "start_us", "duration_s", "samples", "input_s", "sync_s")


def _typed_steps(data: bytes, name: str) -> TaskSteps | None:
    """The fast path at scale: every line a sound record of ddlctl's own shape (but a last line cut
    short, as a task killed mid-write leaves it: counted), decoded straight into typed records (no
    dict per line) and turned into columns in C. None: read it the general way."""
    body, bad = data.strip(), 0
    try:
        records = _STEP_FILE.decode(b"[" + body.replace(b"\n", b",") + b"]") if body else []
    except msgspec.ValidationError:  # (a subclass of DecodeError: sound JSON, another shape)
        return None
    except msgspec.DecodeError:
        body, bad = body.rpartition(b"\n")[0], 1
        try:
            records = _STEP_FILE.decode(b"[" + body.replace(b"\n", b",") + b"]") if body else []
        except msgspec.DecodeError:
            return None
    steps = TaskSteps(name, bad_lines=bad)
    if not records:
        return steps
    step, start, duration, samples, input_s, sync_s = zip(*map(_STEP_COLUMNS, records), strict=True)
    steps.step, steps.start_us, steps.duration = array("q", step), array("q", start), array("d", duration)
    steps.samples = array("q", samples if None not in samples else [-1 if v is None else v for v in samples])
    steps.input_s = array("d", input_s if None not in input_s else [-1.0 if v is None else v for v in input_s])
    steps.sync_s = array("d", sync_s if None not in sync_s else [-1.0 if v is None else v for v in sync_s])
    steps.block = max(map(attrgetter("steps"), records))
    workers = list(map(attrgetter("worker"), records))
    steps.worker = workers if any(workers) else []
    if records[-1].task:
        steps.name = records[-1].task
    if b'"total"' in body:
        steps.total = next((r.total for r in reversed(records) if r.total is not None), None)
    return steps


def read_steps(path: Path, name: str) -> TaskSteps:
    """Parse one ``steps.jsonl``; unreadable lines (e.g. a task killed mid-write) are counted."""
    if not path.is_file():
        return TaskSteps(name)
    data, unread = read_last(path)
    typed = _typed_steps(data, name)
    if typed is not None:
        typed.unread_bytes = unread
        return typed
    # the general way: any record that has the three required fields, whatever its numbers' types
    records, bad = parse_json_lines(data)
    steps = TaskSteps(name, bad_lines=bad, unread_bytes=unread)
    for raw in records:
        try:
            row = (bounded_int(raw["step"]), bounded_int(raw["start_us"]), bounded_seconds(raw["duration_s"]),
                   -1 if raw.get("samples") is None else bounded_int(raw["samples"]),
                   -1.0 if raw.get("input_s") is None else bounded_seconds(raw["input_s"]),
                   -1.0 if raw.get("sync_s") is None else bounded_seconds(raw["sync_s"]),
                   min(max(bounded_int(raw.get("steps", 1)), 1), 1 << 31))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            steps.bad_lines += 1
            continue
        for column, value in zip((steps.step, steps.start_us, steps.duration, steps.samples, steps.input_s,
                                  steps.sync_s), row, strict=False):
            column.append(value)
        steps.block = max(steps.block, row[6])
        worker = raw.get("worker")
        steps.worker.append(worker[:200] if isinstance(worker, str) else None)
        if raw.get("task"):
            steps.name = str(raw["task"])
    if not any(steps.worker):
        steps.worker = []
    steps.total = _declared_total(records)
    return steps


def read_phases(path: Path) -> dict[str, list[tuple[float, float]]]:
    """``phases.jsonl`` (:func:`ddlctl.phase`): phase name -> its (start, end) intervals in epoch
    seconds, in file order (a missing file: none; unreadable lines are left out)."""
    try:
        records, _bad = parse_json_lines(read_last(path)[0])
    except OSError:
        return {}
    phases: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        if isinstance(record, dict) and record.get("phase") and isinstance(record.get("start_us"), (int, float)) \
                and not record.get("open"):  # (a phase's begin: its end has the duration)
            at = record["start_us"] / 1e6
            phases.setdefault(str(record["phase"]), []).append((at, at + float(record.get("duration_s") or 0)))
    return phases


def _declared_total(records: list) -> int | None:
    """The last ``total`` a task declared in its records (None: never)."""
    for record in reversed(records):
        if isinstance(record, dict) and type(record.get("total")) is int and 0 <= record["total"] <= INT_MAX:
            return int(record["total"])
    return None


def last_end_us(starts: Sequence[int], durations: Sequence[float]) -> float:
    """Latest ``start + duration`` in microseconds (C-level iteration: millions of records)."""
    return max(map(operator.add, starts, map(operator.mul, durations, repeat(1e6))))
