"""model.fit under MWMS with BackupAndRestore in ddlctl's checkpoint folder: a group restart
resumes from the backup. Prints each epoch's start, so a test can see where it resumed."""

import json
import os
import time

import numpy as np
import tensorflow as tf

keras = tf.keras
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def dataset():
    rng = np.random.default_rng(0)
    x = rng.random((1024, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()


class EpochLog(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"EPOCH_BEGIN {epoch} restart={os.environ.get('DDLCTL_RESTART_COUNT')}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.01)  # an epoch takes seconds: a test can kill a worker in the middle of one


with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(64, activation="relu", input_shape=(8,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
backup = keras.callbacks.BackupAndRestore(os.environ["DDLCTL_CHECKPOINT_DIR"], save_freq="epoch")
history = model.fit(dataset(), epochs=4, steps_per_epoch=150, verbose=0, callbacks=[backup, EpochLog()])
print("FIT_DONE " + json.dumps({"epochs_run": len(history.history["loss"])}), flush=True)
