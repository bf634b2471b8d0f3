"""A user program that trains with ``model.fit`` under the strategy ddlctl chose.

Keras 3's model.fit fails under ps and mwms; ddlctl sets TF_USE_LEGACY_KERAS=1 so that
``tf.keras`` is tf-keras (Keras 2), where it works.
"""

import json
import os

import numpy as np
import tensorflow as tf

keras = tf.keras
strategy_name = os.environ["DDLCTL_STRATEGY"]
if strategy_name == "ps":
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()


def dataset_fn(input_context=None):
    rng = np.random.default_rng(0)
    x = rng.random((512, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0).batch(32).repeat()


with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
data = keras.utils.experimental.DatasetCreator(dataset_fn) if strategy_name == "ps" else dataset_fn()
history = model.fit(data, epochs=3, steps_per_epoch=20, verbose=2)
hooked = bool(getattr(type(model).fit, "_ddlctl_step_timer", False))  # ddlctl's model.fit hook installed
print("FIT_DONE " + json.dumps({"keras": keras.__name__, "strategy": strategy_name, "hooked": hooked,
                                "loss": [float(v) for v in history.history["loss"]]}), flush=True)
