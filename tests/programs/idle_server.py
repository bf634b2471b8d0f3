"""A task that behaves as a cluster member without TensorFlow, for tests of what happens around a
job (stop, Ctrl-C, scancel, a killed controller): it listens on its own TF_CONFIG address (if it has one), as a
TensorFlow server does, and records a step every 0.1 s through ``ddlctl.step``, forever, or as many
steps as its first argument says, or (``--until PATH``) until that file exists."""

import itertools
import json
import os
import socket
import sys
import time

import ddlctl

if os.environ.get("TF_CONFIG"):  # (a single-host strategy's task has no cluster: it only steps)
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
    server = socket.socket(socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))
    server.listen()
    print(f"{os.environ['DDLCTL_TASK']} listening at {port}", flush=True)
until = sys.argv[2] if sys.argv[1:2] == ["--until"] else None
for _ in range(int(sys.argv[1])) if len(sys.argv) > 1 and not until else itertools.count():
    if until and os.path.exists(until):
        break
    with ddlctl.step(samples=1):
        time.sleep(0.1)
