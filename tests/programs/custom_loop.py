"""A custom training loop timed with ``ddlctl.step`` (no Keras): 25 steps, or ``argv[1]`` steps of
at least ``argv[2]`` seconds each."""

import sys
import time

import tensorflow as tf

import ddlctl

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 25
least_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
weight = tf.Variable(1.0)


@tf.function
def train_step(x):
    weight.assign_sub(0.01 * x)


for _ in range(steps):
    with ddlctl.step(samples=8):
        train_step(tf.constant(1.0))
        time.sleep(least_s)
print("CUSTOM_DONE", float(weight.numpy()), flush=True)
