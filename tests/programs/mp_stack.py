"""A model-parallel program whose model is a list of callables (``ddlctl.modelparallel.Stack``),
not a Keras model: closures over ``tf.Variable`` s, a ``tf.Module``, a Keras layer and a stateless
function. ``build()`` is what ``ddlctl partition --model mp_stack:build`` profiles; run as a program
it plans with ``mp.plan`` (``--partition``'s plan, else greedy measured in place), trains the
stages, trains the same Stack on the chief alone as a reference, and writes ``placement.json``."""

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

STEPS, BATCH, MICRO = 30, 64, 2


def dense(n_in: int, n_out: int, relu: bool = True):  # noqa: ANN201
    """A closure over its own weights, created inside the factory (so on the piece's stage)."""
    def make():  # noqa: ANN202
        w = tf.Variable(tf.random.normal((n_in, n_out), stddev=(2 / n_in) ** 0.5), name="w")
        b = tf.Variable(tf.zeros((n_out,)), name="b")

        def call(h):  # noqa: ANN001, ANN202
            y = tf.matmul(h, w) + b
            return tf.nn.relu(y) if relu else y
        return call
    return make


class Residual(tf.Module):
    """A tf.Module piece: h + relu(h @ w)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = tf.Variable(tf.random.normal((width, width), stddev=0.05))

    def __call__(self, h):  # noqa: ANN001, ANN204
        return h + tf.nn.relu(tf.matmul(h, self.w))


def build():  # noqa: ANN201
    """The model: 16 inputs -> 4 logits, five pieces."""
    import keras

    import ddlctl.modelparallel as mp

    return mp.Stack([dense(16, 64), lambda: keras.layers.Dense(64, activation="relu"), lambda: Residual(64),
                     lambda: (lambda h: h * 0.5), dense(64, 4, relu=False)],
                    input_shape=(16,), names=["embed", "dense", "residual", "scale", "head"])


def main() -> None:
    import keras

    import ddlctl
    import ddlctl.modelparallel as mp

    devices = mp.connect()
    keras.utils.set_random_seed(7)
    stack = build()
    planned = mp.plan(stack, devices, BATCH, MICRO)
    pipeline = mp.Pipeline.from_model(stack, devices, planned.counts, microbatches=MICRO)
    # the same Stack (same initial weights) as one stage on the chief itself: the reference
    alone = mp.Pipeline.from_model(stack, ["/job:chief/replica:0/task:0/device:CPU:0"], [len(stack.layers)],
                                   microbatches=MICRO)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 4, 16)).astype("float32")
    y = (x[:, :4].argmax(axis=1)).astype("int32")  # learnable: the largest of the first four inputs
    ddlctl.set_total_steps(STEPS)
    losses, reference = [], []
    for step in range(STEPS):
        at = (step % 4) * BATCH
        with ddlctl.step(samples=BATCH):
            losses.append(pipeline.train_step(x[at:at + BATCH], y[at:at + BATCH]))
        reference.append(alone.train_step(x[at:at + BATCH], y[at:at + BATCH]))
    print(f"plan {planned.counts} ({planned.how}); losses {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    pipeline.save_stages(x[:BATCH], y[:BATCH], planned)  # the report's stages table
    task_dir = Path(os.environ["DDLCTL_TASK_DIR"])
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "placement.json").write_text(json.dumps(
        {"counts": planned.counts, "how": planned.how, "losses": losses, "reference": reference,
         "stages": pipeline.placement(), "matmul_ops": pipeline.op_devices(x[:BATCH], y[:BATCH])}))


if __name__ == "__main__":
    main()
