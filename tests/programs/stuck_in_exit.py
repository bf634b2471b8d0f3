"""A program that trains (``STEPS`` steps timed with ``ddlctl.step``, declared with
``ddlctl.set_total_steps`` unless ``DECLARE=0``), prints ``TRAINED``, and never finishes exiting:
at interpreter shutdown a buffered file is flushed into a pipe nobody reads, so the main thread
blocks with no Python frame left (as TensorFlow's teardown can spin after the coordination
leader is gone). ``RAISE=1``: the program ends in an uncaught exception instead of normally.
``NATIVE=1``: it blocks after Python has shut down instead (a C ``atexit`` function that pauses,
as a C++ library's destructors can), where faulthandler no longer takes SIGUSR2. ``THREAD=1``: a
thread not started as a daemon never ends, so Python waits for it (``threading._shutdown``)."""

import ctypes
import os
import threading
import time

import ddlctl

STEPS = int(os.environ.get("STEPS", "20"))
if os.environ.get("DECLARE", "1") == "1":
    ddlctl.set_total_steps(STEPS)
for _ in range(STEPS):
    with ddlctl.step(samples=8):
        time.sleep(0.02)
print("TRAINED", flush=True)



def prefetch() -> None:
    while True:  # never told to stop
        time.sleep(0.5)


if os.environ.get("THREAD") == "1":
    threading.Thread(target=prefetch).start()
    raise SystemExit(0)
if os.environ.get("NATIVE") == "1":
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)  # runs after Py_Finalize
    raise SystemExit(0)
_read_end, _write_end = os.pipe()  # the read end stays open and unread
stuck = os.fdopen(_write_end, "wb", buffering=1 << 20)
stuck.write(b"x" * 200_000)  # more than a pipe holds: flushed (and blocked on) when freed at exit
if os.environ.get("RAISE") == "1":
    raise RuntimeError("the evaluation after training failed")
