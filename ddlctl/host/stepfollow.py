"""Following a task's ``steps.jsonl`` as it grows (the host agent's step counts, progress and
ps credits). Standard library only: shipped to every host with the agent."""

from __future__ import annotations

import json
import os

from ddlctl.contract.wire import MAX_INT, integer

#: What one poll reads of a file at most, and the longest line taken: a task writes these files,
#: so neither its speed nor a line without end can make the agent read without bound.
READ_MAX = 4 << 20
LINE_MAX = 64 << 10
#: The largest step number or count taken from a record (what a frame may carry).
STEP_MAX = MAX_INT
#: The records of each task (a ps chief's: each worker) whose step times make its pace, and how
#: many tasks a file may name (a chief names its workers; more names are passed over).
PACE_RECORDS = 16
PACE_NAMES = 64


def new_lines(follower: StepFile | PhaseFile) -> list[bytes]:
    """The whole lines (newline kept) written to ``follower.path`` since its ``offset``, which moves
    past them (a line still being written waits for the next call; a file not there yet: none).
    At most :data:`READ_MAX` bytes a call; a line longer than :data:`LINE_MAX` is passed over
    (counted in ``follower.skipped``), however long it grows."""
    try:
        with open(follower.path, "rb") as handle:
            handle.seek(follower.offset)
            chunk = handle.read(READ_MAX)
    except OSError:
        return []
    lines = []
    at = 0
    while True:
        end = chunk.find(b"\n", at)
        if end < 0:
            break
        if follower.overlong:  # the end of a line passed over
            follower.overlong = False
        elif end + 1 - at > LINE_MAX:
            follower.skipped += 1
        else:
            lines.append(chunk[at:end + 1])
        at = end + 1
    if len(chunk) - at > LINE_MAX:  # a tail too long to be a record: passed over up to its end
        if not follower.overlong:
            follower.skipped += 1
        follower.overlong, at = True, len(chunk)
    follower.offset += at
    return lines


class StepFile:
    """Follows a task's ``steps.jsonl``, reading only what is new: ``count`` training steps
    recorded (a record of a block counts its ``steps``), ``last`` the highest step number reached
    (a resumed run records steps again from its checkpoint: ``last`` is progress, ``count`` work),
    ``total`` the steps the task declared it will run (None: unknown) and ``credits`` the steps
    of each worker that ran some (a ps chief's records say which worker ran each block); :meth:`pace`
    the recent step times of each task that ran steps (``--trace auto`` compares them)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self.offset = 0
        self.overlong = False  # within a line too long to take
        self.skipped = 0  # records passed over: too long, not JSON, wrong types, out of range
        self.count = 0
        self.last = 0
        self.total: int | None = None
        self.credits: dict[str, int] = {}
        self.recent: dict[str, list[tuple[float, float | None]]] = {}  # ran by -> (s a step, sync s a step)
        self.seen: dict[str, int] = {}  # ran by -> records with a step time

    def poll(self) -> int:
        for line in new_lines(self):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                steps = integer(record.get("steps", 1), 1, 1 << 31)
                self.last = max(self.last, min(integer(record["step"], 0) + steps - 1, STEP_MAX))
                if record.get("total") is not None:
                    self.total = integer(record["total"], 0)
                worker = record.get("worker")
                if isinstance(worker, str) and worker and len(worker) <= 200:
                    self.credits[worker] = min(self.credits.get(worker, 0) + steps, STEP_MAX)
                self._time(worker if isinstance(worker, str) and worker and len(worker) <= 200 else "",
                           record, steps)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                self.skipped += 1
                steps = 1  # an unreadable line still counts as a record (progress)
            self.count = min(self.count + steps, STEP_MAX)
        return self.count

    def _time(self, ran_by: str, record: dict, steps: int) -> None:
        duration, sync = record.get("duration_s"), record.get("sync_s")
        if type(duration) not in (int, float) or not 0 <= duration < 1e7:
            return
        if ran_by not in self.recent and len(self.recent) >= PACE_NAMES:
            return
        sync_s = sync / steps if type(sync) in (int, float) and 0 <= sync < 1e7 else None
        kept = self.recent.setdefault(ran_by, [])
        kept.append((duration / steps, sync_s))
        del kept[:-PACE_RECORDS]
        self.seen[ran_by] = min(self.seen.get(ran_by, 0) + 1, STEP_MAX)

    def pace(self) -> dict[str, list]:
        """Who ran steps ("": the task itself; a ps chief's workers by name) -> [the median seconds a
        step over its last :data:`PACE_RECORDS` records, the median sync seconds a step (null: some
        record lacks it), the records timed so far]."""
        paces = {}
        for ran_by, kept in self.recent.items():
            times = sorted(t for t, _ in kept)
            syncs = sorted(s for _, s in kept if s is not None)
            paces[ran_by] = [round(times[len(times) // 2], 6),
                             round(syncs[len(syncs) // 2], 6) if len(syncs) == len(kept) else None,
                             self.seen[ran_by]]
        return paces


class PhaseFile:
    """Follows a task's ``phases.jsonl`` (:func:`ddlctl.phase`, :func:`ddlctl.task.steps.beat`), reading
    only what is new: ``activity`` the lines written (each a sign of work outside the step
    records: a phase begun or ended, a beat; an earlier attempt's lines count too, as its steps
    do) and ``open`` the phase this attempt began and has not ended yet (its name; None: none; a
    phase an earlier attempt left open when it died is not this one's); ``beat`` the kind of the
    last beat this attempt wrote."""

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self.offset = 0
        self.overlong = False
        self.skipped = 0
        self.activity = 0
        self.open: str | None = None
        self.beat: str | None = None  # the kind of this attempt's last beat ("eval", "train")
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
                    self.open = str(record["phase"])[:200] if record.get("open") else None
                if record.get("beat") and at > self.earlier:
                    self.beat = str(record["beat"])[:200]
            except (ValueError, TypeError, AttributeError, RecursionError):
                self.skipped += 1
        return self.activity
