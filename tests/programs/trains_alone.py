"""A program written for one machine (MirroredStrategy) started by ``ddlctl launch -s mwms``: each
worker trains, on its own copy of the model; none joins the cluster of TF_CONFIG."""

import tensorflow as tf

import ddlctl

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    weight = tf.Variable(1.0)


@tf.function
def step():
    return strategy.run(lambda: weight.assign_sub(0.01))


for _ in range(30):
    with ddlctl.step(samples=8):
        step()
print("TRAINED_ALONE", float(weight.numpy()), flush=True)
