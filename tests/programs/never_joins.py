"""worker:1 never creates its strategy, so its port never opens; worker:0 waits for it."""

import os
import time

if os.environ["DDLCTL_TASK"] == "worker:1":
    time.sleep(3600)
import tensorflow as tf  # noqa: E402

tf.distribute.MultiWorkerMirroredStrategy()
print("unreachable: the peer never joined", flush=True)
