"""Step timings: one JSON line per training step in ``$DDLCTL_TASK_DIR/steps.jsonl``.

Record format (stable; read by the summary)::

    {"task": "worker:1", "step": 12, "start_us": 1732270000123456, "duration_s": 0.0412,
     "samples": 64, "input_s": 0.003, "sync_s": 0.021, "steps": 1}

``step`` is the step's number (of a block of ``steps``, its first), counted from the start of
training (a resumed run goes on from its checkpoint's step, so a redone step repeats a number);
``start_us`` is wall-clock epoch microseconds, ``duration_s`` a monotonic-clock duration and
``samples`` how many examples this task processed in the step (so summing ``samples`` over all
tasks' files counts every example once; null when unknown). Optional: ``input_s``, the part of the
step spent waiting for input; ``sync_s``, seconds from the step's start until this task's gradients
were ready to be synchronised (start + sync_s is when it "arrived" at the all-reduce: in
synchronous training a straggler arrives last); ``steps``, how many training steps the record
covers (``steps_per_execution`` > 1); ``total``, how many steps the task will run when it is known
(``$DDLCTL_TOTAL_STEPS``, :func:`set_total_steps`, the built-in workload, the Keras hook: epochs x
steps), for progress bars and ETAs; ``worker``, the task that executed the step when it is not the
recording one (ps: the coordinator records every step, each attributed to the worker that ran it).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_PHASES, TASK_STEPS
from ddlctl.task.trace import AutoCapture, Capture


class StepRecorder:
    """Appends step records to a JSON-lines file, each written through at once (line-buffered: one
    write a record). A task that hangs, is killed or is stopped keeps nothing in a buffer, so the
    report counts every step it made, and the steps a restart redoes."""

    def __init__(self, path: str | Path | None, task: str) -> None:
        self.task = task
        self.path = Path(path) if path is not None else None
        self._file = None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8", buffering=1)
            except OSError as exc:
                _cannot_record(self.path, exc)
        self._lock = threading.Lock()  # one line at a time, whichever thread records
        self.count = 0
        self.total: int | None = None
        self.capture: Capture | AutoCapture | None = None  # a profiler capture ddlctl asked for (``--trace``)

    @classmethod
    def from_env(cls) -> StepRecorder:
        """Recorder for the task ddlctl launched (a no-op recorder outside ddlctl); its total is
        ``$DDLCTL_TOTAL_STEPS`` when that is set."""
        task_dir = os.environ.get(envvars.TASK_DIR)
        task = os.environ.get(envvars.TASK, "local:0")
        recorder = cls(Path(task_dir) / TASK_STEPS if task_dir else None, task)
        recorder.capture = Capture.from_env()
        total = os.environ.get(envvars.TOTAL_STEPS, "")
        if total.isdigit() and int(total) > 0:
            recorder.total = int(total)
        return recorder

    def record(self, step: int, start_wall_s: float, duration_s: float, samples: int | None,
               input_s: float | None = None, sync_s: float | None = None, steps: int = 1,
               worker: str | None = None) -> None:
        """Write one step that started at ``start_wall_s`` (epoch seconds) and lasted ``duration_s``."""
        self.count += 1
        if self.capture is not None:
            self.capture.after(step, steps, start_wall_s, duration_s)
        if self._file is None:
            return
        line: dict[str, object] = {"task": self.task, "step": step, "start_us": int(start_wall_s * 1e6),
                                   "duration_s": round(duration_s, 9), "samples": samples}
        if input_s is not None:
            line["input_s"] = round(input_s, 9)
        if sync_s is not None:
            line["sync_s"] = round(sync_s, 9)
        if steps != 1:
            line["steps"] = steps
        if self.total is not None:
            line["total"] = self.total
        if worker:
            line["worker"] = worker
        text = json.dumps(line) + "\n"
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write(text)
                except OSError as exc:  # a full disk never stops training: the records stop
                    self._give_up(exc)

    def flush(self) -> None:
        """Nothing waits: every record is written when it is made (kept for callers)."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.flush()
                except OSError as exc:
                    self._give_up(exc)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._give_up(exc)
                self._file = None

    def _give_up(self, exc: OSError) -> None:
        """No more records (the disk refused one): said once on stderr, the file closed."""
        handle, self._file = self._file, None
        with contextlib.suppress(OSError):  # (its buffer is what the disk refused)
            handle.close()  # type: ignore[union-attr]
        _cannot_record(self.path, exc)

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


_shared: StepRecorder | None = None
_shared_lock = threading.Lock()
_step_counter = 0


def shared_recorder() -> StepRecorder:
    """The process's recorder (``$DDLCTL_TASK_DIR/steps.jsonl``; a no-op outside ddlctl), closed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = StepRecorder.from_env()
            atexit.register(_shared.close)
        return _shared


class StepTimer:
    """What ``with ddlctl.step(...) as timer`` gives: ``timer.input_done()`` marks where the step's
    wait for its batch ends, so the record's ``input_s`` is the time from the step's start to there
    (the report's input share, the input-bound verdict)."""

    __slots__ = ("input_s", "_start")

    def __init__(self, start: float, input_s: float | None) -> None:
        self._start = start
        self.input_s = input_s

    def input_done(self) -> None:
        """The batch is here: the step's input part ends now (the rest of the step computes)."""
        self.input_s = time.monotonic() - self._start


@contextmanager
def step(samples: int | None = None, input_s: float | None = None) -> Iterator[StepTimer]:
    """Time one training step of a custom loop::

        for images, labels in dataset:
            with ddlctl.step(samples=len(images)):
                train_step(images, labels)

    or, with the wait for the batch inside the step (the report then shows the input share)::

        with ddlctl.step(samples=n) as timer:
            images, labels = next(batches)
            timer.input_done()
            train_step(images, labels)

    ``input_s``: the step's input time when the program measured it itself. Writes one record to
    the task's ``steps.jsonl`` when run under ddlctl; does nothing otherwise. A step that raises is
    not recorded.
    """
    global _step_counter
    recorder = shared_recorder()
    marker = recorder.capture.marker(_step_counter + 1) if recorder.capture is not None else contextlib.nullcontext()
    wall, start = time.time(), time.monotonic()
    timer = StepTimer(start, input_s)
    with marker:  # (a step marker in a profiler capture, --trace)
        yield timer
    duration = time.monotonic() - start
    with _shared_lock:
        _step_counter += 1
        number = _step_counter
    recorder.record(number, wall, duration, samples, input_s=timer.input_s)


def set_total_steps(total: int) -> None:
    """Declare how many training steps this task will run (progress bar, ETA); see
    :func:`ddlctl.set_total_steps`."""
    if total < 1:
        raise ValueError(f"total steps must be at least 1, not {total}")
    shared_recorder().total = int(total)


#: Phases a task may report besides its steps (the report's time by cause counts them).
PHASES = ("checkpoint", "eval")


def _cannot_record(path: Path | None, exc: OSError) -> None:
    """Say on stderr, once per file, that its records stop (training goes on)."""
    import sys

    print(f"ddlctl.step: cannot write {path}: {exc.strerror or exc}; training goes on without "
          "recording this task's steps there", file=sys.stderr, flush=True)


def _append_phase_line(record: dict) -> None:
    """One line in the task's ``phases.jsonl`` under ddlctl (nothing outside it; a full disk: none)."""
    task_dir = os.environ.get(envvars.TASK_DIR)
    if task_dir:
        with contextlib.suppress(OSError), \
                open(Path(task_dir) / TASK_PHASES, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time a phase that is not a training step (``name`` in :data:`PHASES`), e.g. a checkpoint
    save: ``with ddlctl.phase("checkpoint"): manager.save()``. Two JSON lines in the task's
    ``phases.jsonl`` under ddlctl (nothing otherwise): ``{"phase", "start_us", "open": true}`` as it
    begins (the hang watch then allows it :data:`ddlctl.supervise.hangs.watch.OPEN_PHASE_S` without a
    step) and ``{"phase", "start_us", "duration_s"}`` as it ends, whichever way."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}: one of {', '.join(PHASES)}")
    wall, start = time.time(), time.monotonic()
    _append_phase_line({"phase": name, "start_us": int(wall * 1e6), "open": True})
    try:
        yield
    finally:
        record_phase(name, wall, time.monotonic() - start)


def record_phase(name: str, start_wall_s: float, duration_s: float) -> None:
    """A phase that has ended (``name`` in :data:`PHASES`; begun at wall-clock ``start_wall_s``):
    ``{"phase", "start_us", "duration_s"}`` in ``phases.jsonl`` under ddlctl (the report's time by
    cause counts it). ddlctl's ``model.fit`` hook records each validation so."""
    _append_phase_line({"phase": name, "start_us": int(start_wall_s * 1e6), "duration_s": round(duration_s, 9)})


#: At most one beat a second from a process (each is a line in ``phases.jsonl``).
BEAT_S = 1.0
_beats = {"last": float("-inf")}
_beat_lock = threading.Lock()


def beat(kind: str) -> None:
    """Say that the task is at work outside its step records (``kind``: "eval" for a batch of an
    evaluation, "train" for a ps closure done): ``{"beat", "t"}`` in ``phases.jsonl``, at most one
    a second; the hang watch counts a beat as progress (a long evaluation is not a hang). Safe
    from any thread; nothing outside ddlctl."""
    now = time.monotonic()
    with _beat_lock:
        if now - _beats["last"] < BEAT_S:
            return
        _beats["last"] = now
    _append_phase_line({"beat": kind, "t": round(time.time(), 3)})
