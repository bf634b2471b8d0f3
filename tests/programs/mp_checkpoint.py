"""A Stack pipeline's checkpoints, in one process (two stages on this process's CPU): train,
save, train on; a fresh pipeline (other initial weights) restores and must continue with the same
losses, optimizer slots included. Prints JSON: the step restored and the losses of both."""

import json
import sys
import tempfile

import keras
import numpy as np
from mp_stack import build

import ddlctl.modelparallel as mp

devices = ["/job:localhost/replica:0/task:0/device:CPU:0"] * 2
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int32")
folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()

keras.utils.set_random_seed(1)  # (tf.random.set_seed does not reach Keras 3's initializers)
first = mp.Pipeline.from_model(build(), devices, [2, 3], microbatches=2)
saver = first.checkpoints(folder)
for _ in range(3):
    first.train_step(x, y)
saver.save(3)
continued = [first.train_step(x, y) for _ in range(2)]

keras.utils.set_random_seed(2)  # other initial weights
fresh = mp.Pipeline.from_model(build(), devices, [2, 3], microbatches=2)
untrained = fresh.train_step(x, y)  # one step on its own weights (not restored yet)
second = mp.Pipeline.from_model(build(), devices, [2, 3], microbatches=2)
restored = second.checkpoints(folder).restore()
resumed = [second.train_step(x, y) for _ in range(2)]
print(json.dumps({"restored": restored, "continued": continued, "resumed": resumed, "untrained": untrained}))
