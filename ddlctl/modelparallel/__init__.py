"""Model parallelism for programs ddlctl launches with ``--strategy model``.

The cluster: one ``tf.distribute.Server`` per device (job ``worker``) and your program as the
chief (client). ``TF_CONFIG`` names them all. In the program::

    import ddlctl.modelparallel as mp

    devices = mp.connect()                       # port-checks every stage, then connects
    counts = mp.plan(model, devices, batch_size=64, microbatches=4).counts   # --partition's, else planned
    pipeline = mp.Pipeline.from_model(model, devices, counts, microbatches=4)
    for images, labels in dataset:
        loss = pipeline.train_step(images, labels)

``Pipeline`` places each stage's layers (copies of the model's layers, built under the stage's
device scope, so their variables live there) and trains them in one ``tf.function`` per step:
the batch is split into micro-batches; the forward pass runs stage by stage; the backward pass runs
per stage, in reverse, inside each stage's device scope (a plain ``tape.gradient`` over every
variable would run the backward pass on the client: measured), with the stage input behind
``tf.stop_gradient`` and the gradient of the next stage passed in as ``output_gradients``; each
stage's optimizer (its slots on that stage's device) applies the averaged gradients. TensorFlow's
dataflow executor runs stage *i* of micro-batch *k+1* while stage *i+1* works on micro-batch *k*;
control dependencies keep each stage's micro-batches in order (see ``_train_step``).

``model`` is a Keras model or a :class:`Stack`: a list of callables (factories of Keras layers,
``tf.Module`` s or plain functions, each built under its stage's device scope).

Keras 3 ``model.fit`` runs on the client only: a model-parallel program trains through
``train_step``.
"""

from ddlctl.modelparallel.connect import connect, measure_link
from ddlctl.modelparallel.pipeline import Checkpoints, Pipeline, plan, variable_device
from ddlctl.modelparallel.stack import Stack

__all__ = ["Checkpoints", "Pipeline", "Stack", "connect", "measure_link", "plan", "variable_device"]
