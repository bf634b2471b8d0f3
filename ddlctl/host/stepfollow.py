"""Following a task's ``steps.jsonl`` as it grows (the host agent's step counts, progress and
ps credits). Standard library only: shipped to every host with the agent."""

from __future__ import annotations

import json
import os


def new_lines(follower: StepFile | PhaseFile) -> list[bytes]:
    """The whole lines (newline kept) written to ``follower.path`` since its ``offset``, which moves
    past them (a line still being written waits for the next call; a file not there yet: none)."""
    try:
        with open(follower.path, "rb") as handle:
            handle.seek(follower.offset)
            chunk = handle.read()
    except OSError:
        return []
    complete = chunk.rfind(b"\n") + 1
    follower.offset += complete
    return chunk[:complete].splitlines(keepends=True)


class StepFile:
    """Follows a task's ``steps.jsonl``, reading only what is new: ``count`` training steps
    recorded (a record of a block counts its ``steps``), ``last`` the highest step number reached
    (a resumed run records steps again from its checkpoint: ``last`` is progress, ``count`` work),
    ``total`` the steps the task declared it will run (None: unknown) and ``credits`` the steps
    of each worker that ran some (a ps chief's records say which worker ran each block)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self.offset = 0
        self.count = 0
        self.last = 0
        self.total: int | None = None
        self.credits: dict[str, int] = {}

    def poll(self) -> int:
        for line in new_lines(self):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                steps = int(record.get("steps", 1))
                self.last = max(self.last, int(record["step"]) + steps - 1)
                if isinstance(record.get("total"), int):
                    self.total = record["total"]
                if isinstance(record.get("worker"), str) and record["worker"]:
                    self.credits[record["worker"]] = self.credits.get(record["worker"], 0) + steps
            except (ValueError, TypeError, KeyError, AttributeError):
                steps = 1  # an unreadable line still counts as a record
            self.count += steps
        return self.count


class PhaseFile:
    """Follows a task's ``phases.jsonl`` (:func:`ddlctl.phase`, :func:`ddlctl.task.steps.beat`), reading
    only what is new: ``activity`` the lines written (each a sign of work outside the step
    records: a phase begun or ended, a beat; an earlier attempt's lines count too, as its steps
    do) and ``open`` the phase this attempt began and has not ended yet (its name; None: none; a
    phase an earlier attempt left open when it died is not this one's)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self.offset = 0
        self.activity = 0
        self.open: str | None = None
        try:
            self.earlier = os.path.getsize(self.path)  # what earlier attempts wrote
        except OSError:
            self.earlier = 0

    def poll(self) -> int:
        at = self.offset
        for line in new_lines(self):
            at += len(line)
            if not line.strip():
                continue
            self.activity += 1
            try:
                record = json.loads(line)
                if record.get("phase") and at > self.earlier:
                    self.open = str(record["phase"]) if record.get("open") else None
            except (ValueError, TypeError, AttributeError):
                pass
        return self.activity
