"""worker:1 fails with a traceback and exit code 7; every other task ignores SIGTERM (like MWMS)."""

import os
import signal
import sys
import time
import traceback

task = os.environ["DDLCTL_TASK"]
print(f"{task} up", flush=True)
if task == "worker:1":
    time.sleep(1.0)
    try:
        raise RuntimeError("disk full on purpose")
    except RuntimeError:
        traceback.print_exc()
    sys.stderr.flush()
    os._exit(7)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(0.2)
