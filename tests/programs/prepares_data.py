"""An MWMS program that reads its data set before it begins: worker:1 for ``PREP_S`` seconds before it
creates the strategy (so before it listens on its port) and for ``PREP2_S`` (default: the same)
before its first step; worker:0 waits for it, idle (in the strategy's creation, then in the first
all-reduce). The reading is a loop over a 1 MiB file (what a program reading shards from a disk
does, with little CPU)."""

import os
import time

import numpy as np

import ddlctl

SECONDS = float(os.environ.get("PREP_S", "12"))
SECONDS_BEFORE_STEPPING = float(os.environ.get("PREP2_S", SECONDS))
ME = os.environ["DDLCTL_TASK"]
DATA = os.path.join(os.environ.get("DDLCTL_TASK_DIR") or ".", "shard.bin")


def read_data_set(seconds: float) -> int:
    with open(DATA, "wb") as out:
        out.write(os.urandom(1 << 20))
    read, until = 0, time.time() + seconds
    while time.time() < until:
        with open(DATA, "rb") as shard:
            read += len(shard.read())
        time.sleep(0.02)
    return read


if ME == "worker:1":
    print(f"{ME} read {read_data_set(SECONDS) >> 20} MiB before listening", flush=True)

import tensorflow as tf  # noqa: E402 (as a program that prepares first would)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
if ME == "worker:1":
    print(f"{ME} read {read_data_set(SECONDS_BEFORE_STEPPING) >> 20} MiB before its first step", flush=True)
with strategy.scope():
    weight = tf.Variable(1.0)


@tf.function
def step(x):
    def replica(x):
        weight.assign_sub(0.01 * tf.reduce_mean(x))
        return tf.reduce_mean(x)

    return strategy.reduce("SUM", strategy.run(replica, args=(x,)), axis=None)


for _ in range(5):
    with ddlctl.step(samples=8):
        step(tf.constant(np.ones(8, np.float32)))
print(f"{ME} done", flush=True)
