"""A custom training loop timed with ``ddlctl.step`` (no Keras)."""

import tensorflow as tf

import ddlctl

weight = tf.Variable(1.0)


@tf.function
def train_step(x):
    weight.assign_sub(0.01 * x)


for _ in range(25):
    with ddlctl.step(samples=8):
        train_step(tf.constant(1.0))
print("CUSTOM_DONE", float(weight.numpy()), flush=True)
