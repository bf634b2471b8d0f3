"""Stack dumps on request: a Python task started by ddlctl registers :mod:`faulthandler` on
SIGUSR2, writing every thread's stack to ``$DDLCTL_TASK_DIR/stacks-<pid>.txt``.

The file's existence tells the host agent that this process may be sent SIGUSR2 (for any other
process the signal's default action would kill it). Standard library only; never raises.
"""

from __future__ import annotations

import os

from ddlctl import envvars

_handle = None  # kept open for the process's lifetime: faulthandler writes to its descriptor


def install() -> bool:
    """Register the SIGUSR2 stack dumper for this process (once); whether it is registered."""
    global _handle
    task_dir = os.environ.get(envvars.TASK_DIR)
    if _handle is not None or not task_dir:
        return _handle is not None
    try:
        import faulthandler
        import signal

        os.makedirs(task_dir, exist_ok=True)
        _handle = open(os.path.join(task_dir, f"stacks-{os.getpid()}.txt"), "a")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR2, file=_handle, all_threads=True, chain=False)
        return True
    except (OSError, ValueError, RuntimeError, AttributeError):
        return False
