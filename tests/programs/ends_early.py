"""MWMS: worker 1 is given fewer batches than worker 0 (200) and ends cleanly, exit code 0, after
``sys.argv[1]`` steps (default 5): worker 0 goes on to a step whose all-reduce worker 1 never joins
(TensorFlow then fails it). With 0, worker 1 ends before it creates the strategy, as a program
that lets the first worker alone train does: worker 0 waits for it to join the cluster."""

import json
import os
import sys

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
steps = (int(sys.argv[1]) if len(sys.argv) > 1 else 5) if index == 1 else 200
if steps == 0:
    print("not the first worker: nothing to do here", flush=True)
    sys.exit(0)

import tensorflow as tf  # noqa: E402

import ddlctl  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    weight = tf.Variable(1.0)


@tf.function
def step():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", weight * 1.0))


for _ in range(steps):
    with ddlctl.step(samples=8):
        step()
print(f"worker {index}: my batches are done after {steps} steps", flush=True)
