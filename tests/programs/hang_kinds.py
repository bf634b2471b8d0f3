"""An MWMS user program in which worker:1 hangs on purpose, as ``HANG_KIND`` says, at step
``HANG_AT`` (its peers are left waiting for it in the all-reduce). A comma-separated list gives
worker:1, worker:2, ... a kind each (``lock,spin,pipe``: three workers hung three ways at once,
worker:0 left waiting):

* ``lock``: a Keras callback waits on a lock that is never released (``model.fit``, tf-keras);
* ``spin``: a Keras callback spins in a busy loop (CPU at 100 %, at the lowest priority);
* ``pipe``: a Keras callback reads a pipe nobody writes;
* ``filter``: its input pipeline, from batch ``HANG_AT`` on, filters out every element of an endless
  dataset: tf.data spins in native code (a CPU busy) while the main thread waits in TensorFlow;
* ``local``: no hang of its own and no collective: every worker steps on its own (the test stops
  worker:1 with SIGSTOP; its peers keep stepping).
"""

import os
import threading
import time

import numpy as np
import tensorflow as tf

import ddlctl

KINDS = os.environ.get("HANG_KIND", "lock").split(",")
AT = int(os.environ.get("HANG_AT", "15"))
ME = os.environ["DDLCTL_TASK"]
INDEX = int(ME.split(":")[1])
KIND = KINDS[INDEX - 1] if 0 < INDEX <= len(KINDS) else ("local" if KINDS == ["local"] else None)
keras = tf.keras
strategy = tf.distribute.MultiWorkerMirroredStrategy()

if KIND == "local":
    weight = tf.Variable(1.0)

    @tf.function
    def local_step(x):
        weight.assign_sub(0.001 * x)

    for _ in range(100_000):
        with ddlctl.step(samples=8):
            local_step(tf.constant(1.0))
            time.sleep(0.02)
    raise SystemExit(0)

LOCK = threading.Lock()


def wait_forever_on_a_lock() -> None:
    LOCK.acquire()
    LOCK.acquire()  # never released: a deadlock in the user's own code


def spin_forever() -> None:
    # at the lowest priority: still a busy loop in user code (state R, 100 % of an idle CPU), but one
    # that leaves the CPU to the other processes of its host agent's session (the hang watch's
    # stacks). Not to the tests beside it: with kernel.sched_autogroup_enabled=1 the scheduler
    # shares the CPU fairly between sessions first, and nice orders processes only inside one
    os.nice(19)
    total = 0
    while True:
        total += 1


def read_a_pipe_nobody_writes() -> None:
    read_end, _write_end = os.pipe()
    os.read(read_end, 1)


class HangOnPurpose(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if KIND is not None and KIND != "filter" and batch == AT:
            print(f"{ME} hangs now ({KIND})", flush=True)
            {"lock": wait_forever_on_a_lock, "spin": spin_forever, "pipe": read_a_pipe_nobody_writes}[KIND]()


rng = np.random.default_rng(0)
x = rng.random((512, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
# the same pipeline on every worker (MWMS's collectives must match): only worker:1's limit is low
limit = tf.constant(AT if KIND == "filter" else 2**62, tf.int64)
data = data.enumerate().filter(lambda i, _batch: i < limit).map(lambda _i, batch: batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = data.with_options(options)
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(8,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=1, steps_per_epoch=10_000, verbose=0, callbacks=[HangOnPurpose()])
