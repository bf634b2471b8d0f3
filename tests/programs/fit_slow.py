"""``model.fit`` whose batches wait on their input (tf.data's sleep: slow steps at next to no CPU),
under the strategy ddlctl chose: ``epochs steps_per_epoch sleep_ms [validation_steps]``. Under ps
an epoch is one step record (Keras refuses batch callbacks there); with validation steps, each
first epoch ends with an evaluation as slow as its steps."""

import os
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

keras = tf.keras
epochs, steps, sleep_ms = (int(a) for a in sys.argv[1:4])
validation_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
if os.environ["DDLCTL_STRATEGY"] == "ps":
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()


def dataset_fn(input_context=None):
    rng = np.random.default_rng(0)
    x = rng.random((256, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    return data.apply(testing.sleep(sleep_ms * 1000))


with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(4, activation="relu", input_shape=(8,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ps = os.environ["DDLCTL_STRATEGY"] == "ps"
data = keras.utils.experimental.DatasetCreator(dataset_fn) if ps else dataset_fn()
# (validated after the first epoch only: with 2 epochs, that evaluation comes before the last step)
extra = {"validation_data": dataset_fn(), "validation_steps": validation_steps, "validation_freq": [1]} \
    if validation_steps else {}
model.fit(data, epochs=epochs, steps_per_epoch=steps, verbose=0, **extra)
print("FIT_SLOW_DONE", flush=True)
