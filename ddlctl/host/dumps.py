"""What a host agent gathers when ddlctl asks where tasks stand (a dump, for hang blame): each
task's processes and their states, the kernel wait channel of those blocked (state D), the CPU and
I/O they did so far, and the Python stacks their dumpers write on SIGUSR2 (what they added to
``stacks-<pid>.txt``, at most :data:`STACKS_MAX`). Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from ddlctl.contract.wire import Kind
from ddlctl.host.prefork import Zygote
from ddlctl.host.procs import group_processes, wait_channel, work_done
from ddlctl.host.tasks import Task

#: The most of a task's stacks sent per request.
STACKS_MAX = 1 << 20
#: How long the stacks are waited for once asked for (a dumper writes them at its next bytecode).
DUMP_WAIT_S = 1.5


def look_at(task: Task, zygote: Zygote | None) -> dict:
    """``task``'s processes, blocked wait channels, work so far; its dumpers asked for their stacks
    (the stacks files' sizes now: what is added is the answer). ``zygote``: the one asked to fork
    it, whose work is the task's while it still imports TensorFlow for it."""
    procs = group_processes(task.pgid) if task.status is None and task.popen is not None else []
    blocked = {pid: wait_channel(pid) for pid, state, _cmd in procs if state == "D"}
    offsets = {}
    for pid, _state, _cmd in procs:
        path = os.path.join(task.task_dir, f"stacks-{pid}.txt")
        if task.task_dir and os.path.exists(path):
            offsets[path] = os.path.getsize(path)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR2)
    importing = zygote is not None and zygote.proc is not None and zygote.proc.poll() is None
    # (not started yet: its zygote still imports TensorFlow for it; that process's work is its own)
    cpu_s, io_bytes = work_done([zygote.proc.pid] if importing else [pid for pid, _state, _cmd in procs])
    return {"procs": procs, "offsets": offsets, "wchan": blocked, "cpu_s": round(cpu_s, 2),
            "io_bytes": io_bytes, "at": round(time.monotonic(), 3), **({"forking": True} if importing else {})}


def dump_frame(name: str, entry: dict) -> dict:
    """The dump frame of task ``name`` from what :func:`look_at` saw and its stacks written since."""
    stacks = []
    for path, offset in entry["offsets"].items():
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            handle.seek(offset)  # (a task writes that file: what it added, up to a bound)
            stacks.append(handle.read(STACKS_MAX).decode("utf-8", "replace"))
    return {"k": Kind.DUMP, "task": name, "procs": entry["procs"], "stacks": "".join(stacks)[:STACKS_MAX],
            "wchan": entry.get("wchan") or {},
            **{key: entry[key] for key in ("cpu_s", "io_bytes", "at", "forking") if key in entry}}
