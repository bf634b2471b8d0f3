"""The fault vocabulary: why a task is at fault (:class:`Cause`), what ddlctl does about it
(:class:`Action`) and how much of the job a restart takes (:class:`Scope`). Written into
``outcome.json`` as their values, read back by the report. Standard library only.

They are ``str`` enums: a member equals its value (``Cause.HANG == "hang"``), so records written
as plain JSON strings compare as before."""

from __future__ import annotations

import enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10
    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """A str whose ``str()`` and format are its value (Python 3.11's ``enum.StrEnum``)."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(str(self), spec)


class Cause(StrEnum):
    """Why a task is at fault (``Fault.cause``; ``outcome.json``'s ``cause``)."""

    SIGNAL = "signal"  # killed by a signal from outside
    OOM = "oom"  # killed by the kernel's OOM killer
    PREEMPTED = "preempted"  # exit 42/143: PreemptionCheckpointHandler's "restart me"
    HANG = "hang"  # no progress past its threshold, or named unhealthy by a peer
    HOST_LOST = "host-lost"  # the connection to its host agent was lost
    PEER_RESTART = "peer-restart"  # TensorFlow lost results of a restarted peer
    DISK_FULL = "disk-full"
    DEVICE_OOM = "device-oom"  # out of GPU memory
    COLLECTIVE_MISMATCH = "collective-mismatch"  # workers ran different collectives
    TRACEBACK = "traceback"  # a Python exception in the program
    EXIT = "exit"  # any other exit
    ENDED_EARLY = "ended-early"  # exit 0 while its peers still needed it
    NOT_STARTED = "not-started"  # its host agent could not start it
    NO_MODULE = "no-module"  # its Python found no module to run
    PORT_IN_USE = "port-in-use"  # a restart event: a server's port taken before it bound
    GROW = "grow"  # a restart event: a host that left answers again
    PROFILER_CRASH = "profiler-crash"  # a restart event: TensorFlow's profiler crashed the task it captured


class Action(StrEnum):
    """What a :class:`~ddlctl.supervise.policy.Decision` tells the supervisor to do."""

    RESTART = "restart"
    CONTINUE = "continue"  # go on without the task (degraded, or an evaluator)
    FAIL = "fail"
    SHRINK = "shrink"  # --min-workers: the lost workers leave, the others go on


class Scope(StrEnum):
    """What a restart takes, narrowest first (a restart that takes in another fault takes the wider)."""

    NONE = ""
    TASK = "task"
    GROUP = "group"  # every worker of a synchronous group (mwms)
    ALL = "all"  # every task of the cluster spec


#: The scopes in order, narrowest first.
SCOPES: tuple[Scope, ...] = tuple(Scope)
