"""Every task prints the same warning, a line of its own, and the same last line."""

import os
import time

task = os.environ["DDLCTL_TASK"]
time.sleep(0.05 * int(task.split(":")[1]))  # not quite at once, as real tasks
print("WARNING: the same warning from every task", flush=True)
print(f"only {task} says this", flush=True)
print("done", flush=True)
