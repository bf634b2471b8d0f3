"""Following a task's ``steps.jsonl`` as it grows (the host agent's step counts, progress and
ps credits). Standard library only: shipped to every host with the agent."""

from __future__ import annotations

import json
import os


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
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return self.count
        complete = chunk.rfind(b"\n") + 1
        for line in chunk[:complete].splitlines():
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
        self.offset += complete
        return self.count
