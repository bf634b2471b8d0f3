"""MWMS: worker 1 is given fewer batches (5 steps) than worker 0 (200) and ends cleanly, exit code
0; worker 0 goes on to step 6, whose all-reduce worker 1 never joins (TensorFlow then fails it)."""

import json
import os

import tensorflow as tf

import ddlctl

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
steps = 5 if index == 1 else 200
with strategy.scope():
    weight = tf.Variable(1.0)


@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", weight * 1.0))


for _ in range(steps):
    with ddlctl.step(samples=8):
        step()
print(f"worker {index}: my batches are done after {steps} steps", flush=True)
