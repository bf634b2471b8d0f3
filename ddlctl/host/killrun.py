"""Kill every process of one run on this host: ``python -m ddlctl.host.killrun RUN_ID [LAUNCH]``
(with ``LAUNCH``, only that launch's: what a launch leaves behind on a host whose agent was killed).

A process belongs to the run when its environment holds ``DDLCTL_RUN_ID=<run id>`` (ddlctl sets
it for every task), or when it is a host agent whose command line says ``--run <run id>`` (an agent
is sealed: its environment is not readable by the user's other processes): never a name pattern, so
other people's jobs on the same host are untouched, and only processes we may signal (our own) are
killed. Standard library only,
and nothing of ddlctl's own: ``ddlctl stop`` runs this file's text as ``python -c`` on hosts where
ddlctl is not installed (an import of ``ddlctl.contract.envvars`` broke that: ModuleNotFoundError). Prints
the killed pids as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable

#: ``ddlctl.contract.envvars.RUN_ID`` and ``.LAUNCH`` (not imported: see above; test_stop.py checks they agree)
RUN_ID = "DDLCTL_RUN_ID"
LAUNCH = "DDLCTL_LAUNCH"
#: In a host agent's command line.
AGENT = "ddlctl.host.agent"
#: How long processes found dying are waited for before what is left is taken for leftovers.
DYING_WAIT_S = 5.0
_PF_EXITING = 0x4  # (``/proc/PID/stat``'s flags: in do_exit)


def run_processes(run_id: str, launch: str | None = None) -> list[int]:
    """Pids whose environment carries ``DDLCTL_RUN_ID=run_id`` (and ``DDLCTL_LAUNCH=launch``
    when given), and, where the environment cannot be read (a sealed host agent), those whose
    command line is the run's host agent's (:func:`agent_of`); this process excluded. One pass."""
    needles = [f"{RUN_ID}={run_id}".encode()] + ([f"{LAUNCH}={launch}".encode()] if launch else [])
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except PermissionError:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    agent = agent_of(handle.read(1 << 16))
            except OSError:
                continue
            if agent is not None and agent[0] == run_id and launch in (None, agent[1]):
                found.append(int(entry))
            continue
        except OSError:
            continue
        if all(needle in environ for needle in needles):
            found.append(int(entry))
    return found


def agent_of(cmdline: bytes) -> tuple[str, str] | None:
    """(run id, launch key) of a host agent's command line (``/proc/PID/cmdline``: ``PYTHON -m
    ddlctl.host.agent --run RUN_ID --launch KEY ...``), or None for any other process."""
    args = cmdline.decode("utf-8", "replace").split("\0")
    for i in range(len(args) - 1):
        if args[i] == "-m" and args[i + 1] == AGENT:
            options = dict(zip(args[i + 2::2], args[i + 3::2], strict=False))
            if options.get("--run"):
                return options["--run"], options.get("--launch", "")
            return None
    return None


def agents_of(run_id: str, launch: str | None = None, other_launch: bool = False) -> list[int]:
    """Pids of the host agents here of run ``run_id`` (of ``launch`` when given; with
    ``other_launch``, of any launch but it), by their command lines."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                agent = agent_of(handle.read(1 << 16))
        except OSError:
            continue
        if agent is None or agent[0] != run_id:
            continue
        if launch is None or (agent[1] != launch if other_launch else agent[1] == launch):
            found.append(int(entry))
    return found


def command_of(pid: int, limit: int = 60) -> str:
    """The command line of ``pid`` (its first ``limit`` characters; "" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:limit]
    except OSError:
        return ""


def dying(pid: int) -> bool:
    """Whether ``pid`` is on its way out, needing no kill: gone, a zombie, exiting, or with a SIGKILL
    pending - as a task is between its host agent's death (the kernel sends the task its parent-death
    SIGKILL once the agent's files are closed, so after ddlctl saw the agent's end) and its next
    turn on a CPU, which a loaded machine may give it seconds later (CI saw such a task taken for a
    daemon it had left)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as handle:
            status = dict(line.split(":", 1) for line in handle if ":" in line)
        with open(f"/proc/{pid}/stat", "rb") as handle:
            flags = int(handle.read().rpartition(b")")[2].split()[6])
    except (OSError, ValueError, IndexError):
        return True
    if status.get("State", "").strip()[:1] in ("Z", "X") or flags & _PF_EXITING:
        return True
    pending = 0
    for key in ("SigPnd", "ShdPnd"):
        with contextlib.suppress(ValueError):
            pending |= int(status.get(key, "0").strip(), 16)
    return bool(pending & (1 << (signal.SIGKILL - 1)))


def undying(find: Callable[[], list[int]], wait_s: float = DYING_WAIT_S) -> list[int]:
    """The pids ``find()`` gives once those dying (:func:`dying`) have gone, waited for up to
    ``wait_s`` (one still dying then is left out: its SIGKILL is pending)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = find()
        going = {pid for pid in pids if dying(pid)}
        if not going or time.monotonic() >= deadline:
            return [pid for pid in pids if pid not in going]
        time.sleep(0.02)


def kill_run(run_id: str, launch: str | None = None) -> list[int]:
    """SIGKILL the run's processes (and their process groups); the pids killed. With ``launch``,
    that launch's leftovers: a host agent of it still running is spared (it ends its own). Processes
    already dying are waited for, not killed or named."""
    pids = undying(lambda: run_processes(run_id, launch))
    spared = {pid for pid in pids if launch and AGENT in command_of(pid, 1 << 16)}
    spared_groups = set()
    for pid in spared:
        with contextlib.suppress(OSError):
            spared_groups.add(os.getpgid(pid))
    killed = []
    for pid in (p for p in pids if p not in spared):
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group not in spared_groups:
                os.killpg(group, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        killed.append(pid)
    return killed


def script() -> str:
    """This file's text: what ``python -c`` runs on a host (for ddlctl's side, which has the file)."""
    with open(__file__, encoding="utf-8") as handle:
        return handle.read()


if __name__ == "__main__":
    if len(sys.argv) > 2:  # a launch's leftovers: named, for ddlctl to say what it ended
        commands = {pid: command_of(pid) for pid in run_processes(sys.argv[1], sys.argv[2])}
        print(json.dumps([[pid, commands.get(pid, "")] for pid in kill_run(sys.argv[1], sys.argv[2])]))
    else:
        print(json.dumps(kill_run(sys.argv[1])))
