"""What each strategy is, stated once: every layer asks this table instead of comparing names.

Pure data, standard library only (the host side and the tasks read it too).
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def program_lockstep(self) -> bool:
        """Its workers are the program's own processes and step together (mwms): one that ends
        early, or never joins, leaves the others waiting for ever."""
        return self.lockstep and not self.servers


TABLE: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ps", multi_host=True, servers=True, leader="chief:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="ParameterServerStrategy"),
    Strategy("mwms", multi_host=True, servers=False, leader="worker:0", lockstep=True, group_restart=True,
             batch_split=True, tf_class="MultiWorkerMirroredStrategy"),
    Strategy("model", multi_host=True, servers=True, leader="chief:0", lockstep=True, group_restart=False,
             batch_split=False, tf_class=None),
    Strategy("mirrored", multi_host=False, servers=False, leader="worker:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="MirroredStrategy"),
    Strategy("central_storage", multi_host=False, servers=False, leader="worker:0", lockstep=False,
             group_restart=False, batch_split=False, tf_class="CentralStorageStrategy"),
    Strategy("one_device", multi_host=False, servers=False, leader="worker:0", lockstep=False, group_restart=False,
             batch_split=False, tf_class="OneDeviceStrategy"),
)}

STRATEGIES: tuple[str, ...] = tuple(TABLE)
MULTI_HOST_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if s.multi_host)
SINGLE_HOST_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if not s.multi_host)
#: Strategies whose worker tasks are ``tf.distribute.Server`` processes driven by the chief.
SERVER_STRATEGIES: tuple[str, ...] = tuple(n for n, s in TABLE.items() if s.servers)


def strategy(name: str) -> Strategy:
    """The facts of ``name`` (a KeyError names the unknown strategy)."""
    return TABLE[name]
