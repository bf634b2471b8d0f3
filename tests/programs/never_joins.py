"""worker:1 never opens its port; worker:0 listens on its own (as its TensorFlow server would) and
waits for the peer forever. worker:0 listens at once, without importing TensorFlow, so that only
worker:1 can be missing however loaded the machine is (importing TensorFlow takes 5-15 s here)."""

import json
import os
import socket
import time

if os.environ["DDLCTL_TASK"] == "worker:1":
    time.sleep(3600)
config = json.loads(os.environ["TF_CONFIG"])
port = int(config["cluster"]["worker"][config["task"]["index"]].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", port))
server.listen()
print("listening; waiting for the peer", flush=True)
time.sleep(3600)
