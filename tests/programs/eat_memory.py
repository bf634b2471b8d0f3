"""A task that runs out of memory for real: it joins the memory cgroup whose ``cgroup.procs`` is
its first argument (a limit the test set) and allocates, and writes, 16 MiB at a time until the
kernel's OOM killer kills it."""

import sys
import time

with open(sys.argv[1], "w") as procs:
    procs.write("0")  # (this process)
held = []
while True:
    held.append(bytearray(16 * 2**20))  # (zeroed: every page written)
    print(f"holding {16 * len(held)} MiB", flush=True)
    time.sleep(0.01)
