"""A model-parallel program of a user's own: a functional Keras model placed on the stage tasks
through ``ddlctl.modelparallel`` (no ``model.fit``), trained with ``ddlctl.step`` records.
Prints the placement, the first and last loss, and writes ``placement.json`` in its task folder."""

import json
import os
from pathlib import Path

import keras
import numpy as np

import ddlctl
import ddlctl.modelparallel as mp

STEPS, BATCH = 30, 64
devices = mp.connect()
keras.utils.set_random_seed(7)
inputs = keras.Input((16,))
h = keras.layers.Dense(64, activation="relu", name="embed")(inputs)
h = keras.layers.Dense(64, activation="relu", name="hidden_a")(h)
h = keras.layers.Dense(64, activation="relu", name="hidden_b")(h)
outputs = keras.layers.Dense(4, name="head")(h)
model = keras.Model(inputs, outputs)
counts = [2, 2] if len(devices) == 2 else [4 - len(devices) + 1] + [1] * (len(devices) - 1)
pipeline = mp.Pipeline.from_model(model, devices, counts, microbatches=2)
rng = np.random.default_rng(0)
x = rng.normal(size=(BATCH * 4, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int32")  # learnable: the largest of the first four inputs
ddlctl.set_total_steps(STEPS)
losses = []
for step in range(STEPS):
    at = (step % 4) * BATCH
    with ddlctl.step(samples=BATCH):
        losses.append(pipeline.train_step(x[at:at + BATCH], y[at:at + BATCH]))
placement = pipeline.placement()
print(f"losses {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
for stage in placement:
    print(f"stage {stage['device']}: {stage['layers']} on {stage['variable_devices']}", flush=True)
Path(os.environ["DDLCTL_TASK_DIR"]).mkdir(parents=True, exist_ok=True)
(Path(os.environ["DDLCTL_TASK_DIR"]) / "placement.json").write_text(json.dumps(
    {"losses": losses, "stages": placement, "matmul_ops": pipeline.op_devices(x[:BATCH], y[:BATCH])}))
