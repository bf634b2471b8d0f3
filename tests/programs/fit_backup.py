"""model.fit under MWMS with BackupAndRestore in ddlctl's checkpoint folder: a group restart
resumes from the backup, also with another number of workers (``--min-workers``). Prints each
epoch's start with the restart and the number of workers, so a test can see where and how it
resumed. ``FIT_EPOCHS``: epochs to train (default 4), of :data:`STEPS_PER_EPOCH` steps."""

import json
import os
import time

import numpy as np
import tensorflow as tf

keras = tf.keras
#: Steps of an epoch, each at least 30 ms: an epoch takes seconds (a test can kill a worker in the
#: middle of one) at little CPU (150 steps of 10 ms: the elastic fit test took 60 CPU-s, now 35).
STEPS_PER_EPOCH = 50
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def dataset():
    rng = np.random.default_rng(0)
    x = rng.random((1024, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()


class EpochLog(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
        print(f"EPOCH_BEGIN {epoch} restart={os.environ.get('DDLCTL_RESTART_COUNT')} workers={workers}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.03)


with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(8,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
backup = keras.callbacks.BackupAndRestore(os.environ["DDLCTL_CHECKPOINT_DIR"], save_freq="epoch")
history = model.fit(dataset(), epochs=int(os.environ.get("FIT_EPOCHS", "4")), steps_per_epoch=STEPS_PER_EPOCH,
                    verbose=0, callbacks=[backup, EpochLog()])
print("FIT_DONE " + json.dumps({"epochs_run": len(history.history["loss"])}), flush=True)
