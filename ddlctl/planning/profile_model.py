"""Measuring a Keras model for the partition planner: per layer, forward+backward time on this
machine (the reference device, speed 1), parameter + optimizer bytes, output activation bytes.

Imports TensorFlow (only ``ddlctl partition`` and the model strategy use it).
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable

from ddlctl.errors import ConfigError
from ddlctl.planning.partition import Layer

#: Adam keeps two slots per parameter: parameters + optimizer state = 3 x the parameters.
OPTIMIZER_SLOTS = 2


def load_model_factory(spec: str) -> Callable[[], object]:
    """``module:function`` (a function returning a Keras model) or a built-in workload name."""
    from ddlctl.workloads import WORKLOADS, models

    if spec in WORKLOADS:
        return getattr(models, spec)
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ConfigError(f"--model {spec!r} is not MODULE:FUNCTION",
                          "e.g. --model mymodels:build (a function that returns a Keras model), or "
                          "--workload " + "|".join(WORKLOADS))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--model {spec!r}: cannot import {module_name}: {exc}",
                          "run from the folder that holds it, or add it to PYTHONPATH") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ConfigError(f"--model {spec!r}: {module_name} has no function {function!r}")
    return factory


def model_layers(model: object) -> list:
    """The layers that compute, in order (an Input layer is not one)."""
    return [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]  # type: ignore[attr-defined]


def profile(model: object, batch_size: int, repeats: int = 7) -> list[Layer]:
    """Each layer's forward+backward time (median of ``repeats`` after a warm-up, whole batch),
    parameter + optimizer bytes and output activation bytes, feeding it the previous layer's
    output on a random batch."""
    from ddlctl.runtime.tfenv import quiet_tensorflow_logs

    quiet_tensorflow_logs()
    import numpy as np
    import tensorflow as tf

    shape = tuple(model.input_shape[1:])  # type: ignore[attr-defined]
    x = tf.random.normal((batch_size, *shape))
    measured = []
    for layer in model_layers(model):

        @tf.function
        def forward_backward(t, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = layer(t, training=True)
                total = tf.reduce_sum(y)
            return y, tape.gradient(total, [t, *layer.trainable_variables])

        y, _ = forward_backward(x)  # trace and warm up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, grads = forward_backward(x)
            _ = [g.numpy() for g in grads[:1]]  # wait for the work to finish
            times.append(time.perf_counter() - start)
        params = sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in layer.trainable_variables)
        act = int(y.shape.num_elements()) * y.dtype.size
        measured.append(Layer(layer.name, statistics.median(times), params * (1 + OPTIMIZER_SLOTS), act))
        x = y
    return measured
