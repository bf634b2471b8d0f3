"""Every task prints the same warning, a line of its own, and the same last line.

With a folder as its argument, every task first waits there for the others (a file per task), so
that the lines leave the tasks within the collapse window whatever the machine's load: three
Python processes started one after the other came up more than 0.5 s apart on a loaded CI machine,
and then each task's warning was rightly shown on its own."""

import os
import sys
import time
from pathlib import Path

task = os.environ["DDLCTL_TASK"]
index = int(task.split(":")[1])
if len(sys.argv) > 1:
    folder = Path(sys.argv[1])
    (folder / f"ready-{index}").touch()
    deadline = time.monotonic() + 60
    while len(list(folder.glob("ready-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
time.sleep(0.05 * index)  # not quite at once, as real tasks
print("WARNING: the same warning from every task", flush=True)
print(f"only {task} says this", flush=True)
print("done", flush=True)
