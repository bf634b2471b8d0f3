"""A program of one's own that checkpoints when ddlctl asks it to stop (``ddlctl.should_stop()``):
it records a step every 0.1 s, up to its first argument's count; asked to stop, it writes the step
it reached to ``stopped.json`` in its task folder (its "checkpoint") and exits 143. Without
TensorFlow: what is tested is the hook."""

import json
import os
import sys
import time

import ddlctl

for count in range(1, int(sys.argv[1]) + 1):
    with ddlctl.step(samples=1):
        time.sleep(0.1)
    if ddlctl.should_stop():
        with open(os.path.join(os.environ["DDLCTL_TASK_DIR"], "stopped.json"), "w") as handle:
            json.dump({"step": count}, handle)
        print(f"checkpoint at step {count}: stopping", flush=True)
        sys.exit(143)
