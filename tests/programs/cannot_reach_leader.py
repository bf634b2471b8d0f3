"""MWMS: worker 1 cannot reach the coordination leader (its TF_CONFIG names a port nobody listens
on, as a firewall between hosts or a host name that does not resolve there would make it): both
wait in TensorFlow for ever, worker 0 saying it waits for worker 1 to connect."""

import json
import os

config = json.loads(os.environ["TF_CONFIG"])
if config["task"]["index"] == 1:
    host, _port = config["cluster"]["worker"][0].rsplit(":", 1)
    config["cluster"]["worker"][0] = f"{host}:1"  # nothing listens there
    os.environ["TF_CONFIG"] = json.dumps(config)

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # worker 1 never gets past this
print("joined", flush=True)
