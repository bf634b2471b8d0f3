"""What each strategy is, stated once: every layer asks this table instead of comparing names.

Pure data, standard library only (the host side and the tasks read it too).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Recovery(enum.Enum):
    """What a lost training task takes with it (``supervise/policy.py`` decides by this)."""

    ROLES = "roles"  # ps: a worker restarts alone and rejoins, the chief alone, a ps everyone
    EVERYONE = "everyone"  # model: every stage holds part of the model
    GROUP = "group"  # mwms: the whole worker group, never one worker into a running group
    PROCESS = "process"  # a single-host strategy: its one process


@dataclass(frozen=True)
class Strategy:
    """Facts about one ``--strategy``."""

    name: str
    multi_host: bool  # tasks on several hosts, each with a TF_CONFIG cluster
    servers: bool  # its worker (and ps) tasks are tf.distribute.Server processes driven by the chief
    leader: str  # the task that leads TensorFlow's coordination service (and reports progress)
    lockstep: bool  # every worker takes every step together: a worker that stops stops the others
    group_restart: bool  # a lost worker restarts the whole group (never one worker into a running group)
    batch_split: bool  # each step's batch is split over the workers (--balance speed can weigh the split)
    tf_class: str | None  # the tf.distribute class the built-in workload uses (None: ddlctl's pipeline)
    recovery: Recovery
    has_ps: bool = False  # it has ps tasks (--ps N)
    asynchronous: bool = False  # a coordinator hands each step to whichever worker is free
    stages: bool = False  # its workers are stages of one model that the chief places (--partition, --speeds)
    elastic: bool = False  # workers can leave and come back (--min-workers), one per GPU if asked
    one_device: bool = False  # it uses one device of its host
    #: The role of the program's own processes that must join the cluster themselves (mwms: the
    #: workers; ps: the chief, whose workers and ps tasks are ddlctl's servers); None: none joins.
    joining_role: str | None = None
    keras3_fit_fails: bool = False  # Keras 3's model.fit fails under it (tf-keras needed)

    @property
    def program_lockstep(self) -> bool:
        """Its workers are the program's own processes and step together (mwms): one that ends
        early, or never joins, leaves the others waiting for ever."""
        return self.lockstep and not self.servers


TABLE: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ps", multi_host=True, servers=True, leader="chief:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="ParameterServerStrategy", recovery=Recovery.ROLES, has_ps=True,
             asynchronous=True, elastic=True, joining_role="chief", keras3_fit_fails=True),
    Strategy("mwms", multi_host=True, servers=False, leader="worker:0", lockstep=True, group_restart=True,
             batch_split=True, tf_class="MultiWorkerMirroredStrategy", recovery=Recovery.GROUP, elastic=True,
             joining_role="worker", keras3_fit_fails=True),
    Strategy("model", multi_host=True, servers=True, leader="chief:0", lockstep=True, group_restart=False,
             batch_split=False, tf_class=None, recovery=Recovery.EVERYONE, stages=True),
    Strategy("mirrored", multi_host=False, servers=False, leader="worker:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="MirroredStrategy", recovery=Recovery.PROCESS),
    Strategy("central_storage", multi_host=False, servers=False, leader="worker:0", lockstep=False,
             group_restart=False, batch_split=False, tf_class="CentralStorageStrategy", recovery=Recovery.PROCESS),
    Strategy("one_device", multi_host=False, servers=False, leader="worker:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="OneDeviceStrategy", recovery=Recovery.PROCESS, one_device=True),
)}

STRATEGIES: tuple[str, ...] = tuple(TABLE)
MULTI_HOST_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if s.multi_host)
SINGLE_HOST_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if not s.multi_host)
#: Strategies whose worker tasks are ``tf.distribute.Server`` processes driven by the chief.
SERVER_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if s.servers)


def strategy(name: str) -> Strategy:
    """The facts of ``name`` (a KeyError names the unknown strategy)."""
    return TABLE[name]


#: What a name the table does not know is: every fact false (for code that asks before the name is checked).
UNKNOWN = Strategy("?", multi_host=False, servers=False, leader="worker:0", lockstep=False, group_restart=False,
                   batch_split=False, tf_class=None, recovery=Recovery.PROCESS)


def facts_of(name: str | None) -> Strategy:
    """The facts of ``name``, or :data:`UNKNOWN`'s."""
    return TABLE.get(name or "", UNKNOWN)
