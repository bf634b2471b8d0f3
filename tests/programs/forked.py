"""A TensorFlow task that says how it was started (tests/system/test_prefork.py): whether TensorFlow was
imported before its first line, its argv, folder, sys.path[0], __name__, task, random state,
parent, temporary folder, stdin and the objects its collector has frozen; then ``exit CODE``,
``raise``, ``import`` (prefork_helper, from PYTHONPATH), ``malloc`` (the page faults of repeated
allocations, tests/programs/malloc_faults.py) or ``sleep``."""

import gc
import json
import os
import random
import sys
import tempfile
import time

already = "tensorflow" in sys.modules
import tensorflow as tf  # noqa: E402

print(json.dumps({"already": already, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "name": __name__, "task": os.environ.get("DDLCTL_TASK"), "random": random.random(),
                  "pid": os.getpid(), "ppid": os.getppid(), "tmp": tempfile.gettempdir(),
                  "stdin": sys.stdin.read(), "sum": float(tf.reduce_sum(tf.ones((3, 3)))),
                  "frozen": gc.get_freeze_count(), "collector": gc.isenabled()}), flush=True)
mode = sys.argv[1]
if mode == "import":  # a module of a folder PYTHONPATH names relative to the task's folder
    import prefork_helper

    print(json.dumps({"helper": prefork_helper.__file__, "path": sys.path}), flush=True)
    sys.exit(7)
if mode == "malloc":  # the zygote's malloc settings are the task's
    import malloc_faults

    print(json.dumps(malloc_faults.two_rounds()))
    sys.exit(0)
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise RuntimeError("boom from the forked task")
time.sleep(600)  # (ended by the test with SIGTERM: at 60 s it ended on its own before the
#   test looked at it, on a loaded CI machine where the test took 80 s)
