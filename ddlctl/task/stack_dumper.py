"""Stack dumps on request: a Python task started by ddlctl registers :mod:`faulthandler` on
SIGUSR2, writing every thread's stack to ``$DDLCTL_TASK_DIR/stacks-<pid>.txt``.

The file's existence tells the host agent that this process may be sent SIGUSR2 (for any other
process the signal's default action would kill it): it is created under another name and renamed
once the handler is registered. Standard library only; never raises.
"""

from __future__ import annotations

import os

from ddlctl.contract import envvars

_fd: int | None = None  # a raw descriptor, open for the process's lifetime: faulthandler writes to it


def install() -> bool:
    """Register the SIGUSR2 stack dumper for this process (once); whether it is registered.

    faulthandler is given a raw file descriptor, not a file object: a file object can be closed
    while Python shuts down (seen: a ``__main__`` holding a function, so its globals are freed late
    by the garbage collector, had ddlctl's stacks file closed before a flush that blocked), and
    then a process stuck in its exit dumps nothing (or into whatever file took the number)."""
    global _fd
    task_dir = os.environ.get(envvars.TASK_DIR)
    if _fd is not None or not task_dir:
        return _fd is not None
    try:
        import faulthandler
        import signal

        os.makedirs(task_dir, exist_ok=True)
        path = os.path.join(task_dir, f"stacks-{os.getpid()}.txt")
        # the file appears under its name only once the handler is registered: the agent signals
        # any process whose file exists, and SIGUSR2's default action ends a process (CI saw a
        # task die so, preempted between the open and the register, counted as "ended on its own")
        fd = os.open(path + ".new", os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        faulthandler.register(signal.SIGUSR2, file=fd, all_threads=True, chain=False)
        _fd = fd
        os.replace(path + ".new", path)
        return True
    except (OSError, ValueError, RuntimeError, AttributeError):
        return False
