"""Measuring a model (Keras, or a :class:`ddlctl.modelparallel.stack.Stack` of callables) for the partition
planner: per layer, forward+backward time on this machine (the reference device, speed 1),
parameter + optimizer bytes, output activation bytes.

Imports TensorFlow (only ``ddlctl partition`` and the model strategy use it).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

from ddlctl.contract.errors import ConfigError
from ddlctl.modelparallel.planner import Layer

#: Adam keeps two slots per parameter: parameters + optimizer state = 3 x the parameters.
OPTIMIZER_SLOTS = 2
#: Time each layer for at least this long (short layers: many calls; less noise).
MIN_PROFILE_S = 0.1


def load_model_factory(spec: str, said: bool = True) -> Callable[[], object]:
    """``module:function`` (a function returning a Keras model, or a :class:`ddlctl.modelparallel.stack.Stack`
    of callables) or a built-in workload name. ``said``: an error of the function is a
    ConfigError that names it and where it happened (else it is raised as it is: a task's log
    keeps its traceback)."""
    from ddlctl.workloads import WORKLOADS, models

    if spec in WORKLOADS:
        return getattr(models, spec)
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ConfigError(f"--model {spec!r} is not MODULE:FUNCTION",
                          "e.g. --model mymodels:build (a function that returns a Keras model or a "
                          "ddlctl.modelparallel.Stack), or "
                          "--workload " + "|".join(WORKLOADS))
    import os
    import sys

    if not {"", os.getcwd()} & set(sys.path):  # the ddlctl script's path starts at its own folder
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--model {spec!r}: cannot import {module_name}: {exc}",
                          "run from the folder that holds it, or add it to PYTHONPATH") from None
    except Exception as exc:  # noqa: BLE001 - the module's own error, said with where it happened
        path = os.sep + module_name.replace(".", os.sep)
        said = _said_at(exc, path + ".py", os.path.join(path, "__init__.py"))
        raise ConfigError(f"--model {spec!r}: importing {module_name} failed: {said}") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ConfigError(f"--model {spec!r}: {module_name} has no function {function!r}")

    def build() -> object:
        from ddlctl.modelparallel.stack import Stack

        try:
            model = factory()
        except Exception as exc:  # noqa: BLE001 - the function's own error, said with where it happened
            if not said:
                raise
            raise ConfigError(f"--model {spec!r}: {function}() failed: {_said_at(exc, str(module.__file__))}",
                              f"{function}() is called with no arguments and returns the model; the error "
                              "is its own") from None
        if not isinstance(model, Stack) and not (hasattr(model, "layers") and hasattr(model, "input_shape")):
            raise ConfigError(f"--model {spec!r} returned a {type(model).__name__}, not a Keras model with a "
                              "known input shape nor a ddlctl.modelparallel.Stack",
                              "return a built model (e.g. with keras.Input) or a Stack of callables")
        return model

    return build


def _said_at(exc: BaseException, *sources: str) -> str:
    """``Type: message (file:line)``: an error of the user's code, with the last place in its file
    (whose path ends with one of ``sources``) that it passed through (a syntax error: its own place)."""
    import traceback

    where = f"{exc.filename}:{exc.lineno}" if isinstance(exc, SyntaxError) and exc.filename else None
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if sources and f.filename.endswith(sources)]
    if where is None and mine:
        where = f"{mine[-1].filename}:{mine[-1].lineno}"
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)  # (a syntax error's text has its place)
    return f"{type(exc).__name__}: {message}" + (f" ({where})" if where else "")


def model_layers(model: object) -> list:
    """The layers that compute, in order (an Input layer is not one)."""
    return [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]  # type: ignore[attr-defined]


def profile(model: object, batch_size: int, repeats: int = 7, microbatches: int = 1,
            reference: WholeStep | None = None) -> list[Layer]:
    """Each layer's time for the whole batch (forward, backward and the optimizer's update; median
    of ``repeats`` after a warm-up), parameter + optimizer bytes and output activation bytes (whole
    batch), feeding it the previous layer's output on a random batch. ``reference``: the whole
    model's step on this process's device as :func:`reference_step` built it (else built here).

    With ``microbatches`` > 1 a layer is timed on the batch split in that many micro-batches, one
    after the other in one call, as a pipeline step runs them: small matrix products are less
    efficient per row (on 2 CPU cores, 8 micro-batches of 32 rows took 1.9x the time of one batch
    of 256). Each layer is timed at least ``repeats`` times and for at least ``MIN_PROFILE_S``; then
    the whole model's step is timed in one call and the layers' times scaled to add up to it. A
    layer that computes what one timed before it does (:func:`same_step`: a deep stack of equal
    blocks) takes that one's times instead of being traced and timed again."""
    from ddlctl.task.tfenv import quiet_own_retracing, quiet_tensorflow_logs

    quiet_tensorflow_logs()
    quiet_own_retracing()
    import numpy as np
    import tensorflow as tf

    shape = tuple(model.input_shape[1:])  # type: ignore[attr-defined]
    m = max(1, microbatches)
    x = tf.random.normal((max(m, batch_size - batch_size % m), *shape))
    measured = []
    overhead = _call_overhead(tf, x, repeats)
    needs_input_grad = False  # nothing before the first layer with weights needs a gradient
    timed: dict[tuple, tuple[float, float]] = {}  # same_step(...) -> (cost, update) of a layer timed
    for layer in model_layers(model):
        key = same_step(layer, x, needs_input_grad)
        if key is not None and key in timed:
            (cost, update), y = timed[key], layer(x, training=True)  # (y: the next layer's input, its size)
        else:
            cost, update, y = _layer_times(tf, layer, x, m, needs_input_grad, repeats, overhead)
            if key is not None:
                timed[key] = (cost, update)
        needs_input_grad = needs_input_grad or bool(layer.trainable_variables)
        measured.append(Layer(layer.name, cost, *_bytes(np, layer, y), update))
        x = y
    return _scaled_to_whole(tf, model, measured, batch_size, m, repeats, reference)


def _layer_times(tf, layer, x, m: int, input_grad: bool, repeats: int,  # noqa: ANN001
                 overhead: float) -> tuple[float, float, object]:
    """(step time, update time, output) of one layer on ``x`` (:func:`_layer_step`, traced here),
    each less a call's ``overhead``; the update's at most the step's."""
    variables = list(layer.trainable_variables)
    optimizer = _zero_rate_adam(variables) if variables else None  # (the step's update too)
    forward_backward = tf.function(_layer_step(tf, layer, variables, optimizer, m, input_grad))
    y, _ = forward_backward(x)  # trace and warm up
    forward_backward(x)[1].numpy()
    step = lambda: forward_backward(x)[1].numpy()  # noqa: E731
    # the step and its update timed in turns: a busy moment of the machine touches both alike (timed
    # one after the other, a loaded machine measured an update longer than the whole step, which then
    # had no compute left: and equal layers take one layer's times)
    calls = [step] if optimizer is None else [step, _update_call(tf, optimizer, variables)]
    times, *updates = _turns(calls, repeats, MIN_PROFILE_S)
    cost = max(statistics.median(times) - overhead, min(times) / 10)
    update = max(0.0, statistics.median(updates[0]) - overhead) if updates else 0.0
    return cost, min(update, cost), y


def same_step(layer: object, x: object, input_grad: bool) -> tuple | None:
    """What decides a layer's step in :func:`profile`: its class, its Keras configuration but its
    name, the shapes and types of its input (``x``) and weights, and whether its input's gradient is
    taken: two layers alike in all of these compute the same thing at the same cost. None where that is
    not known: a layer without a configuration (a :class:`ddlctl.modelparallel.stack.Stack`'s piece: its closure
    is not described), or one Keras cannot serialize."""
    get_config = getattr(layer, "get_config", None)
    if get_config is None:
        return None
    try:
        config = json.dumps({k: v for k, v in get_config().items() if k != "name"}, sort_keys=True)
    except Exception:  # noqa: BLE001 - NotImplementedError for a custom layer's arguments, TypeError...
        return None
    weights = tuple((tuple(v.shape), str(v.dtype)) for v in layer.trainable_variables)  # type: ignore[attr-defined]
    return type(layer), config, tuple(x.shape), str(x.dtype), input_grad, weights  # type: ignore[attr-defined]


def sizes(model: object, batch_size: int) -> list[Layer]:
    """Each layer's parameter + optimizer bytes and output activation bytes (whole batch), from one
    forward pass on a random batch; no time measured (``cost_s`` 0). Enough to tell a model that
    cannot be placed, before :func:`profile` spends seconds timing it."""
    from ddlctl.task.tfenv import quiet_tensorflow_logs

    quiet_tensorflow_logs()
    import numpy as np
    import tensorflow as tf

    x = tf.random.normal((batch_size, *tuple(model.input_shape[1:])))  # type: ignore[attr-defined]
    found = []
    for layer in model_layers(model):
        x = layer(x, training=False)
        found.append(Layer(layer.name, 0.0, *_bytes(np, layer, x)))
    return found


def _bytes(np, layer: object, output) -> tuple[int, int]:  # noqa: ANN001 - numpy, a tensor
    """A layer's (parameter + optimizer state bytes, output activation bytes) for ``output``, its
    output on the whole batch."""
    params = sum(_bytes_of(np, v) for v in layer.trainable_variables)  # type: ignore[attr-defined]
    return params * (1 + OPTIMIZER_SLOTS), int(output.shape.num_elements()) * output.dtype.size


def _bytes_of(np, variable: object) -> int:  # noqa: ANN001 - the numpy module
    """A variable's size in bytes (a Keras variable's dtype is a name, a ``tf.Variable``'s a DType)."""
    dtype = getattr(variable.dtype, "as_numpy_dtype", variable.dtype)  # type: ignore[attr-defined]
    return int(np.prod(variable.shape)) * np.dtype(dtype).itemsize  # type: ignore[attr-defined]


def _update_call(tf, optimizer, variables: list) -> Callable[[], object]:  # noqa: ANN001
    """A call of the optimizer's update of ``variables`` alone (gradients given), traced and warmed
    up: the part of a layer's step that runs after the step's gradients, off a pipeline's critical
    path."""
    gradients = [tf.zeros_like(v) for v in variables]

    @tf.function
    def update():  # noqa: ANN202
        optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return tf.reduce_sum(tf.reshape(variables[0], [-1])[:1])

    update().numpy()  # trace and warm up
    return lambda: update().numpy()


def _turns(calls: list[Callable[[], object]], repeats: int, min_s: float) -> list[list[float]]:
    """Seconds of each call of ``calls``, called in turns (each once a round) for at least
    ``repeats`` rounds, and more (up to 100) until the first call's times add up to ``min_s``."""
    times: list[list[float]] = [[] for _ in calls]
    while len(times[0]) < repeats or (sum(times[0]) < min_s and len(times[0]) < 100):
        for call, mine in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()  # a call that waits for its work to finish
            mine.append(time.perf_counter() - start)
    return times


def _scaled_to_whole(tf, model: object, measured: list[Layer], batch_size: int, m: int,  # noqa: ANN001
                     repeats: int, reference: WholeStep | None = None) -> list[Layer]:
    """The layers' times scaled so that they add up to one step of the whole model, timed in one
    call (one layer at a time leaves caches cold and pays for a call per layer: the sum came out
    10-25% above the whole step on 2 CPU cores). Unscaled when the whole model cannot run here."""
    import dataclasses

    total = sum(layer.cost_s for layer in measured)
    step = whole_step_time(model, batch_size, m, repeats, built=reference)
    if step is None or not total > 0:
        return measured
    scale = step / total
    return [dataclasses.replace(layer, cost_s=layer.cost_s * scale, update_s=layer.update_s * scale)
            for layer in measured]


class WholeStep(NamedTuple):
    """A traced training step of the whole model (:func:`_whole_step`): ``call(x)`` runs it,
    ``noop(x)`` is a call that does next to nothing, ``state`` the variables it updates (the model's
    trainable ones, then its optimizer's), in the order :func:`_step_state` gives them."""

    call: Callable
    x: object
    noop: Callable
    state: list


def _zero_rate_adam(variables: list) -> object:
    """Adam with a zero learning rate, built for ``variables``: an update that costs what a
    training step's does while the weights stay as they are."""
    import keras

    optimizer = keras.optimizers.Adam(learning_rate=0.0)
    optimizer.build(variables)
    return optimizer


def _step_state(model: object, device: str | None = None) -> tuple[object, list, object]:
    """(the model, or a copy built on ``device``; its trainable variables; a zero-rate Adam built
    there for them). The step's state (:class:`WholeStep`) is those variables, then the optimizer's."""
    import tensorflow as tf

    with tf.device(device) if device else contextlib.nullcontext():
        here = _copy_model(model) if device else model
        variables = list(here.trainable_variables)  # type: ignore[attr-defined]
        return here, variables, _zero_rate_adam(variables)


def _whole_step(model: object, batch_size: int, microbatches: int = 1,
                device: str | None = None) -> WholeStep | None:
    """One training step of the whole model, traced: its micro-batches one after the other,
    gradients, an Adam update with a zero learning rate; on this process's device, or on
    ``device`` (a copy of the model built there, its input already there). None when it does not
    fit or does not run there."""
    import tensorflow as tf

    m = max(1, microbatches)
    shape = tuple(model.input_shape[1:])  # type: ignore[attr-defined]
    try:
        here, variables, optimizer = _step_state(model, device)
        layers = model_layers(here)
        with tf.device(device) if device else contextlib.nullcontext():
            x = tf.random.normal((max(m, batch_size - batch_size % m), *shape))

        @tf.function
        def whole(t):  # noqa: ANN001, ANN202
            with tf.device(device) if device else contextlib.nullcontext():
                totals, grads_of = [], []
                for part in tf.split(t, m):
                    with tf.GradientTape() as tape:
                        h = part
                        for layer in layers:
                            h = layer(h, training=True)
                        loss = tf.reduce_sum(h)
                    grads_of.append(tape.gradient(loss, variables))
                    totals.append(loss)
                summed = [tf.add_n(list(g)) if m > 1 else g[0] for g in zip(*grads_of, strict=True)]
                optimizer.apply_gradients(zip(summed, variables, strict=True))
                return tf.add_n(totals)

        noop = tf.function(noop_call(tf, device))
        whole(x).numpy()  # trace and warm up
        noop(x).numpy()
    except (tf.errors.ResourceExhaustedError, tf.errors.UnavailableError, MemoryError):
        return None
    return WholeStep(whole, x, noop, [*variables, *optimizer.variables])


def _whole_step_there(reference: WholeStep, model: object, device: str) -> WholeStep | None:
    """The ``reference`` step (traced once, here) run on ``device``: a copy of the model and its
    optimizer built there, and the trace's captured variables swapped for the copy's, so that every
    op of the step runs there on that device's variables (a call under ``tf.device`` places the
    function's ops there; the variables' ops go where the variables are). Tracing the deep
    model's step again for each stage task took ~1 CPU-second each; the copy and its first call
    here ~0.35.
    None when the swap cannot be made (the trace captured a variable that is not the step's
    state, or TensorFlow's function calls changed): the caller traces on the device then."""
    import tensorflow as tf

    try:
        concrete = reference.call.get_concrete_function(reference.x)
        captured = concrete.captured_inputs
        call_flat = concrete._call_flat  # noqa: SLF001 - calls a trace with other captured inputs
    except (AttributeError, TypeError, ValueError):
        return None
    try:
        _here, variables, optimizer = _step_state(model, device)
        state = [*variables, *optimizer.variables]
        with tf.device(device):
            x = tf.identity(reference.x)
    except (tf.errors.ResourceExhaustedError, tf.errors.UnavailableError, MemoryError):
        return None
    if len(state) != len(reference.state) or any(
            a.shape != b.shape or a.dtype != b.dtype for a, b in zip(state, reference.state, strict=True)):
        return None
    swap = {id(old.handle): new.handle for old, new in zip(reference.state, state, strict=True)}
    if any(c.dtype == tf.resource and id(c) not in swap for c in captured):
        return None  # a variable of the reference's would be read or updated from the device
    inputs = [swap.get(id(c), c) for c in captured]

    def call(t):  # noqa: ANN001, ANN202
        with tf.device(device):
            return call_flat([t], inputs)

    noop = tf.function(noop_call(tf, device))
    try:
        call(x).numpy()
        noop(x).numpy()
    except (tf.errors.ResourceExhaustedError, tf.errors.UnavailableError, MemoryError,
            TypeError, ValueError, tf.errors.InvalidArgumentError):  # (the last three: calls took other inputs)
        return None
    return WholeStep(call, x, noop, state)


def _copy_model(model: object) -> object:
    """A fresh copy of ``model`` built under the caller's device scope (a Keras model or a Stack)."""
    import keras

    from ddlctl.modelparallel.stack import Stack

    return model.clone() if isinstance(model, Stack) else keras.models.clone_model(model)


def _timed(call, x) -> float:  # noqa: ANN001
    start = time.perf_counter()
    call(x).numpy()
    return time.perf_counter() - start


def reference_step(model: object, batch_size: int, microbatches: int = 1) -> WholeStep | None:
    """The whole model's training step on this process's device (:func:`_whole_step`), traced
    once for :func:`profile` and :func:`device_speeds` both (a trace of a deep model's step with
    4 micro-batches took 2 s of the chief's 20 s of measuring); None when it does not run here."""
    return _whole_step(model, batch_size, microbatches)


def whole_step_time(model: object, batch_size: int, microbatches: int = 1, repeats: int = 3,
                    device: str | None = None, built: WholeStep | None = None) -> float | None:
    """One training step of the whole model (:func:`_whole_step`, or ``built`` by it already),
    timed in one call, less a no-op call's time (medians of ``repeats``); None when it does not fit
    or does not run there."""
    built = built or _whole_step(model, batch_size, microbatches, device)
    if built is None:
        return None
    whole, x, noop, _state = built
    step = statistics.median(_timed(whole, x) for _ in range(max(3, repeats))) - \
        statistics.median(_timed(noop, x) for _ in range(max(5, repeats)))
    return step if step > 0 else None


def device_speeds(model: object, devices: list[str], batch_size: int, microbatches: int = 1,
                  repeats: int = 5, reference: WholeStep | None = None) -> list[float] | None:
    """Each device's speed relative to this process's device for this model: the whole model's
    step timed here over the same step timed on the device (:func:`_whole_step`), so the speed
    is that of the work the stages will do (small matrix products at micro-batch size, the
    optimizer), not of a large matrix product: under a CPU quota with one thread per op the two
    differed by up to 1.6x. Timed in rounds, each round every device and the reference once (a
    busy moment, or a drift, then touches one round, not one device), each less its no-op call;
    each device's speed is the median of its per-round ratios to the reference. None when some
    device cannot run the whole model (its memory). ``reference``: this process's step as
    :func:`reference_step` built it (else built here); each device runs that trace
    (:func:`_whole_step_there`), else one of its own."""
    reference = reference or _whole_step(model, batch_size, microbatches)
    if reference is None:
        return None
    built = [reference, *(_whole_step_there(reference, model, device)
                          or _whole_step(model, batch_size, microbatches, device) for device in devices)]
    if any(b is None for b in built):
        return None
    idle = [statistics.median(_timed(noop, x) for _ in range(5)) for _whole, x, noop, _state in built]
    ratios: list[list[float]] = [[] for _ in devices]
    for _ in range(max(3, repeats)):
        times = [max(1e-9, _timed(whole, x) - overhead)
                 for (whole, x, _noop, _state), overhead in zip(built, idle, strict=True)]
        for j, there in enumerate(times[1:]):
            ratios[j].append(times[0] / there)
    return [statistics.median(r) for r in ratios]


def noop_call(tf, device: str | None = None) -> Callable:  # noqa: ANN001
    """A function that does next to nothing with its tensor (on ``device``): timed, it is the
    round trip of a call (dispatch and wait) to leave out of a measured one."""
    def noop(t):  # noqa: ANN001, ANN202
        with tf.device(device) if device else contextlib.nullcontext():
            return tf.reduce_sum(tf.reshape(t, [-1])[:1])

    return noop


def _call_overhead(tf, x, repeats: int) -> float:  # noqa: ANN001
    """The time of a call that does next to nothing (dispatch and wait): left out of each layer's.
    The fastest of several: a busy moment of the machine only adds (their median, taken in one,
    exceeded a dense layer's Adam update under load, which then measured 0)."""
    call = tf.function(noop_call(tf))
    call(x).numpy()
    return min(_timed(call, x) for _ in range(max(5, repeats)))


def _layer_step(tf, layer, variables: list, optimizer, m: int, input_grad: bool) -> Callable:  # noqa: ANN001
    """One step of one layer (for ``tf.function``): the micro-batches one after the other, as a
    pipeline step runs them, their weight gradients summed, then the optimizer's update: what a
    stage does per layer. ``input_grad``: also the gradient of the layer's input (every layer after
    the first with weights: the layers before it need it)."""

    def step(t):  # noqa: ANN001, ANN202
        outputs, input_grads, weight_grads = [], [], []
        for part in tf.split(t, m):
            with tf.GradientTape() as tape:
                tape.watch(part)
                y = layer(part, training=True)
                total = tf.reduce_sum(y)
            grads = tape.gradient(total, [part, *variables] if input_grad else [*variables])
            outputs.append(y)
            # something to wait for (the update below runs in any case: tf.function runs stateful ops)
            input_grads.append(tf.reduce_sum(grads[0]) if input_grad else tf.reduce_sum(y[..., :1]))
            weight_grads.append(grads[1:] if input_grad else grads)
        if optimizer is not None:
            summed = [tf.add_n(list(g)) if m > 1 else g[0] for g in zip(*weight_grads, strict=True)]
            optimizer.apply_gradients(zip(summed, variables, strict=True))
        return tf.concat(outputs, 0), tf.add_n(input_grads)

    return step
