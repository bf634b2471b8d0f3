"""Kill every process of one run on this host: ``python -m ddlctl.runtime.killrun RUN_ID``.

A process belongs to the run when its environment holds ``DDLCTL_RUN_ID=<run id>`` (ddlctl sets
it for every task): never a name pattern, so other people's jobs on the same host are untouched,
and only processes whose environment we may read (our own) are considered. Standard library only,
and nothing of ddlctl's own: ``ddlctl stop`` runs this file's text as ``python -c`` on hosts where
ddlctl is not installed (an import of ``ddlctl.envvars`` broke that: ModuleNotFoundError). Prints
the killed pids as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

#: ``ddlctl.envvars.RUN_ID`` (not imported: see above; tests/test_stop.py checks they agree)
RUN_ID = "DDLCTL_RUN_ID"


def run_processes(run_id: str) -> list[int]:
    """Pids whose environment carries ``DDLCTL_RUN_ID=run_id`` (this process excluded)."""
    needle = f"{RUN_ID}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_run(run_id: str) -> list[int]:
    """SIGKILL the run's processes (and their process groups); the pids killed."""
    killed = []
    for pid in run_processes(run_id):
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        killed.append(pid)
    return killed


if __name__ == "__main__":
    print(json.dumps(kill_run(sys.argv[1])))
