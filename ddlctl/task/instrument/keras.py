"""A Keras callback that records step timings, for Keras 3 (``keras``) or Keras 2 (``tf_keras``).

With ``steps_per_execution`` > 1, Keras calls batch hooks once per block of steps: one record then
covers the block (``"steps": k``), and the summary says so. Under ParameterServerStrategy tf-keras
refuses batch-level callbacks: there the timer records each training closure the coordinator's
workers finish (a step, or a block of ``steps_per_execution``), said to be the worker's that ran
it (``"worker"``), from a wrap of TensorFlow's ``Worker._process_closure``; one block per epoch
where that method is missing. Evaluation and prediction batches (and every ps closure) are beats:
the hang watch counts them as progress.

Step numbers count from the epoch ``fit`` starts at (``initial_epoch``, or the one
``BackupAndRestore`` resumes from) when the steps per epoch are known, so a resumed run's records
reach the declared total (epochs x steps) as the run does: progress, ETAs and the hang watch's
"done stepping" read the same numbers as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from functools import lru_cache

from ddlctl.contract import envvars
from ddlctl.contract.strategies import facts_of
from ddlctl.task.flops import record_model_flops
from ddlctl.task.steps import StepRecorder, beat, record_phase, shared_recorder

MARK = "_ddlctl_step_timer"


class _TimerState:
    """What both timers keep: where records go, the batch size, the running step count."""

    _ddlctl_step_timer = True

    def __init__(self, batch_size: int | None = None, recorder: StepRecorder | None = None) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.recorder = recorder or shared_recorder()
        self.global_step = 0
        self._begin: int | None = None
        self._start = self._wall = 0.0

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Declare the run's total (epochs x steps per epoch) unless the program already did."""
        params = getattr(self, "params", None) or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        if self.recorder.total is None and epochs and steps:
            self.recorder.total = int(epochs) * int(steps)
        record_model_flops(getattr(self, "model", None))  # model FLOPs for the report (never raises)

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._eval_wall, self._eval_start = time.time(), time.monotonic()

    def on_test_end(self, logs: dict | None = None) -> None:
        """A validation of ``fit`` is an "eval" phase for the report's time by cause."""
        if getattr(self, "_eval_start", None) is not None:
            record_phase("eval", self._eval_wall, time.monotonic() - self._eval_start)
            self._eval_start = None

    def _record(self, steps: int) -> None:
        """One record for the block of ``steps`` that began at ``_start``, named by its first step."""
        first, self.global_step = self.global_step + 1, self.global_step + steps
        samples = self.batch_size * steps if self.batch_size else None
        self.recorder.record(first, self._wall, time.monotonic() - self._start, samples, steps=steps)

    def _epoch_begins(self, epoch: int) -> None:
        """Steps before ``epoch`` count as done (a resumed or ``initial_epoch`` run starts there)."""
        steps = (getattr(self, "params", None) or {}).get("steps")
        if steps:
            self.global_step = max(self.global_step, int(epoch) * int(steps))


@lru_cache(maxsize=4)
def step_timer_class(base: type) -> type:
    """A StepTimer subclass of the given Keras ``Callback`` class."""

    class StepTimer(_TimerState, base):  # type: ignore[misc, valid-type]
        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self._epoch_begins(epoch)

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self._begin, self._start, self._wall = batch, time.monotonic(), time.time()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if self._begin is None:
                return
            self._record(max(1, batch - self._begin + 1))
            self._begin = None

        def on_train_end(self, logs: dict | None = None) -> None:
            self.recorder.flush()

        def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
            beat("eval")  # a long validation is work, not a hang

        def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None:
            beat("eval")

    StepTimer.__name__ = StepTimer.__qualname__ = "StepTimer"
    return StepTimer


@lru_cache(maxsize=4)
def epoch_timer_class(base: type) -> type:
    """An epoch-level timer (batch hooks are refused under ParameterServerStrategy)."""

    class EpochStepTimer(_TimerState, base):  # type: ignore[misc, valid-type]
        def on_train_begin(self, logs: dict | None = None) -> None:
            super().on_train_begin(logs)
            self._lock = threading.Lock()
            self._closures = 0  # training closures recorded in the epoch under way
            self._block = _steps_per_execution(getattr(self, "model", None))  # steps a closure runs
            if watch_closures():
                CLOSURE_LISTENERS.append(self._closure_done)

        def _closure_done(self, worker: int | None, wall: float, seconds: float, closure: object) -> None:
            """A closure of training steps ran on worker ``worker``: a record of its steps, said to
            be that worker's (evaluation closures are beats only)."""
            if "train_function" not in _function_name(closure):
                return
            steps = self._block
            with self._lock:
                first, self.global_step = self.global_step + 1, self.global_step + steps
                self._closures += 1
                samples = self.batch_size * steps if self.batch_size else None
                self.recorder.record(first, wall, seconds, samples, steps=steps,
                                     worker=f"worker:{worker}" if worker is not None else None)

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            with self._lock:
                self._epoch_begins(epoch)
                self._closures = 0
            self._start, self._wall = time.monotonic(), time.time()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            with self._lock:
                if not self._closures:  # (no closure hook: the epoch is one record)
                    self._record(int((self.params or {}).get("steps") or 1))
            self.recorder.flush()

        def on_train_end(self, logs: dict | None = None) -> None:
            with contextlib.suppress(ValueError):
                CLOSURE_LISTENERS.remove(self._closure_done)
            self.recorder.flush()

    EpochStepTimer.__name__ = EpochStepTimer.__qualname__ = "EpochStepTimer"
    return EpochStepTimer


#: Who hears of each closure a ps coordinator's workers finish: (worker index, wall-clock start,
#: seconds, the closure) -> None (the ``model.fit`` timers under ps, while they run).
CLOSURE_LISTENERS: list = []


def watch_closures() -> bool:
    """Make each closure a ps coordinator's workers finish (a step or a block of steps of
    ``model.fit``, a batch of its evaluation) a beat (:func:`ddlctl.task.steps.beat`) and a call of
    each of :data:`CLOSURE_LISTENERS`: under ParameterServerStrategy Keras refuses batch-level
    callbacks, so an epoch was one record, and one longer than the hang threshold read as a hang.
    Once per process; False where TensorFlow's ClusterCoordinator has no
    ``Worker._process_closure`` to wrap (the epoch records stay)."""
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator
    except ImportError:
        return False
    worker = getattr(cluster_coordinator, "Worker", None)
    process = getattr(worker, "_process_closure", None)
    if process is None:
        return False
    if getattr(process, MARK, False):
        return True

    def process_closure(self, closure):  # noqa: ANN001, ANN202 - TensorFlow's Worker and Closure
        wall, start = time.time(), time.monotonic()
        process(self, closure)  # runs it on the worker and fetches its result (errors are kept, not raised)
        beat("train")
        for listener in list(CLOSURE_LISTENERS):
            with contextlib.suppress(Exception):  # a timer's failure must not fail the coordinator's thread
                listener(getattr(self, "worker_index", None), wall, time.monotonic() - start, closure)

    setattr(process_closure, MARK, True)
    worker._process_closure = process_closure  # type: ignore[union-attr]
    return True


def _function_name(closure: object) -> str:
    """The name of the function a closure runs ("__inference_train_function_123"), or ""."""
    function = getattr(closure, "_concrete_function", None)
    name = getattr(function, "name", "") or ""
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _steps_per_execution(model: object) -> int:
    """The steps one call of a Keras model's train function runs (``steps_per_execution``: 1 unless set)."""
    value = getattr(model, "_steps_per_execution", None)
    try:
        return max(1, int(value.numpy() if hasattr(value, "numpy") else value or 1))  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return 1


def _uses_parameter_servers(model: object) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    return "ParameterServer" in type(strategy).__name__ or facts_of(os.environ.get(envvars.STRATEGY)).asynchronous


def _default_keras() -> object:
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras

        return tf_keras
    import keras

    return keras


def step_timer(batch_size: int | None = None, keras_module: object = None) -> object:
    """A StepTimer callback for ``keras_module`` (default: tf_keras under TF_USE_LEGACY_KERAS=1,
    else Keras 3)."""
    module = keras_module or _default_keras()
    return step_timer_class(module.callbacks.Callback)(batch_size=batch_size)  # type: ignore[attr-defined]


def guess_batch_size(args: tuple, kwargs: dict) -> int | None:
    """Samples per step of a ``fit`` call, when it can be told: ``batch_size``, the batch size of a
    tf.data dataset (:func:`dataset_batch`), or Keras' default of 32 for arrays. None when unknown."""
    if kwargs.get("batch_size"):
        return int(kwargs["batch_size"])
    x = args[0] if args else kwargs.get("x")
    if x is None:
        return None
    if getattr(x, "element_spec", None) is not None:
        return dataset_batch(x)
    if hasattr(x, "shape") and len(args) < 3:
        return 32  # Keras' default batch size for arrays
    return None


def dataset_batch(dataset: object) -> int | None:
    """A tf.data dataset's batch size, when it can be told: its static batch dimension, else the
    constant its ``batch()`` was given, looked for through the datasets it is built on (a
    ``prefetch`` or ``repeat`` after the batch; a dataset being traced holds it as a graph constant)."""
    spec = getattr(dataset, "element_spec", None)
    first = spec[0] if isinstance(spec, (tuple, list)) and spec else spec
    if isinstance(first, dict):
        first = next(iter(first.values()), None)
    dims = getattr(getattr(first, "shape", None), "as_list", lambda: None)()
    if dims and dims[0]:
        return int(dims[0])
    tf = sys.modules.get("tensorflow")
    for _ in range(32):
        if dataset is None:
            return None
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            with contextlib.suppress(Exception):  # (not a constant: None)
                value = tf.get_static_value(size) if tf is not None else size
                return int(value) if value is not None else None
            return None
        dataset = getattr(dataset, "_input_dataset", None)
    return None


@contextlib.contextmanager
def _creator_batch(x: object, timer: _TimerState) -> object:
    """While ``fit`` runs: learn the batch size from the dataset a ``DatasetCreator`` (ps) makes
    when fit builds its per-worker datasets (the dataset function runs, traced, on the chief)."""
    make = getattr(x, "dataset_fn", None)
    if timer.batch_size is not None or not callable(make):
        yield
        return

    def dataset_fn(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        dataset = make(*args, **kwargs)
        if timer.batch_size is None:
            timer.batch_size = dataset_batch(dataset)
        return dataset

    try:
        x.dataset_fn = dataset_fn  # type: ignore[attr-defined]
    except AttributeError:
        yield
        return
    try:
        yield
    finally:
        x.dataset_fn = make  # type: ignore[attr-defined]


def patch_fit(module: object) -> bool:
    """Make ``module.Model.fit`` add a StepTimer to every call (once); True if patched."""
    model = getattr(module, "Model", None)
    fit = getattr(model, "fit", None)
    if model is None or fit is None or getattr(fit, MARK, False):
        return False

    def fit_with_step_timer(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if os.environ.get(envvars.BALANCE) == "speed" and not getattr(fit_with_step_timer, "warned", False):
            fit_with_step_timer.warned = True  # type: ignore[attr-defined]
            print("ddlctl: --balance speed cannot balance model.fit (Keras splits every batch equally over the "
                  "workers): this run uses the equal split. A custom training loop can, with ddlctl.task.balance "
                  "(docs/heterogeneous.md).", file=sys.stderr, flush=True)
        positional = len(args) > 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
        callbacks = list((args[5] if positional else kwargs.get("callbacks")) or [])
        timer = None
        if not any(getattr(cb, MARK, False) for cb in callbacks):
            make = epoch_timer_class if _uses_parameter_servers(self) else step_timer_class
            timer = make(module.callbacks.Callback)(batch_size=guess_batch_size(args, kwargs))
            callbacks.append(timer)
        if positional:
            args = (*args[:5], callbacks, *args[6:])
        else:
            kwargs["callbacks"] = callbacks
        x = args[0] if args else kwargs.get("x")
        with _creator_batch(x, timer) if timer is not None else contextlib.nullcontext():
            return fit(self, *args, **kwargs)

    setattr(fit_with_step_timer, MARK, True)
    fit_with_step_timer.__doc__ = fit.__doc__
    model.fit = fit_with_step_timer
    return True
