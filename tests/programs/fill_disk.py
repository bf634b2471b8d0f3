"""A task whose disk fills while it runs (no TensorFlow): it records steps, prints ``LINES`` lines,
fills the disk of its task folder with a file of its own, records and prints as much again (ddlctl
must neither stop it nor lose what it prints), then writes its "checkpoint" into the full disk and
dies of Python's ``OSError: [Errno 28] No space left on device``."""

import os
import sys
import time
from pathlib import Path

import ddlctl

LINES = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
folder = Path(os.environ["DDLCTL_TASK_DIR"])


def work(first: int) -> None:
    for _ in range(first, first + 3):
        with ddlctl.step(samples=1):
            time.sleep(0.01)
    for i in range(first * 1000, first * 1000 + LINES):
        print(f"line {i} " + "x" * 60, flush=True)


work(1)
# FILL_AFTER_LOG=1 (a task of this machine, whose folder holds the output.log ddlctl writes): the
# disk fills once these lines are in it (on a loaded machine ddlctl's writes came after the
# filler's: an empty output.log, though the lines came before). A remote task's output is not
# written on its host.
log, last = folder / "output.log", f"line {1000 + LINES - 1} ".encode()
deadline = time.monotonic() + 60
while os.environ.get("FILL_AFTER_LOG") and time.monotonic() < deadline \
        and not (log.exists() and last in log.read_bytes()):
    time.sleep(0.05)
filler = os.open(folder / "filler.bin", os.O_WRONLY | os.O_CREAT, 0o600)
try:
    while True:
        os.write(filler, b"\0" * 65536)
except OSError as exc:
    print(f"the disk is full: {exc.strerror}", flush=True)
finally:
    os.close(filler)
time.sleep(0.5)  # (ddlctl's next write of this task's output meets the full disk)
work(4)
print("the end of the output", flush=True)
(folder / "checkpoint.bin").write_bytes(b"\1" * 65536 * 4)
