"""The whole model's step traced once here and run on another device with that device's copy of
the model (``profile_model._whole_step_there``): this process's CPU split in two logical devices.
Prints one JSON line of what the test checks."""

import json
import os
import sys

import tensorflow as tf

[cpu] = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from ddlctl.modelparallel.profile import _whole_step, _whole_step_there  # noqa: E402

model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
reference = _whole_step(model, 8, microbatches=2)
there = _whole_step_there(reference, model, "/device:CPU:1")
if there is None:
    print(json.dumps({"there": None}), flush=True)
    sys.exit(0)
trainable = len(model.trainable_variables)
for mine, theirs in zip(there.state[:trainable], reference.state[:trainable], strict=True):
    mine.assign(theirs)  # the same weights: the same step's loss (the learning rate is 0: they stay)


def iterations(step):  # noqa: ANN001, ANN201 - Adam's count of its updates
    [count] = [v for v in step.state[trainable:] if v.name == "iteration"]
    return int(count.numpy())


before = [iterations(step) for step in (reference, there)]
losses = [float(there.call(there.x).numpy()) for _ in range(3)]
after = [iterations(step) for step in (reference, there)]
print(json.dumps({
    "there": True,
    "devices": sorted({v.handle.device for v in there.state}),
    "reference_devices": sorted({v.handle.device for v in reference.state}),
    "iterations_before": before, "iterations_after": after,
    "losses": losses, "reference_loss": float(reference.call(there.x).numpy()),
}), flush=True)
sys.stdout.flush()
os._exit(0)
