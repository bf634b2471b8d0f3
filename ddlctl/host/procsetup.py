"""How the host agent's processes are tied to it (Linux ``prctl``): a task in its own process group,
its CPU quota group and CPUs, dying with its parent; the agent adopting its tasks' orphans. Used by
plain starts (before exec), by the zygote and by the tasks it forks. Standard library only."""

from __future__ import annotations

import os
import signal

from ddlctl.host import cgroup

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

_prctl = None  # libc's prctl, looked up once (in the agent: not in every forked child before exec)


def libc_prctl():  # noqa: ANN201 - a ctypes function, or None where there is none
    """libc's ``prctl`` (looked up once), or None."""
    global _prctl
    if _prctl is None:
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def die_with_parent(prctl=None) -> None:  # noqa: ANN001 - libc_prctl(), looked up before a fork
    """SIGKILL this process when its parent ends."""
    prctl = prctl or libc_prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def seal() -> bool:
    """Make this process not dumpable (``PR_SET_DUMPABLE 0``): another process of the same user - a
    task - can then neither ptrace it, read or write its memory (``/proc/PID/mem``,
    ``process_vm_writev``), open its descriptors through ``/proc/PID/fd`` nor read its environment;
    only a process with ``CAP_SYS_PTRACE`` can. Signals still reach it; its command line and state
    stay readable (which is how ``killrun`` and ``stop`` find it). Whether it is sealed. A process it
    starts is dumpable again once it execs (the kernel resets the flag)."""
    prctl = libc_prctl()
    return prctl is not None and prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def become_subreaper() -> bool:
    """Make this process the parent of its orphaned descendants; whether it is."""
    prctl = libc_prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def own_group_and_limits(cgroup_procs: str | None = None, cpus: set[int] | None = None) -> None:
    """In a task: its own process group, its CPU quota group (``cgroup.procs`` path) and CPUs."""
    os.setpgid(0, 0)
    if cgroup_procs:
        cgroup.join(cgroup_procs)
    if cpus:
        os.sched_setaffinity(0, cpus)
