"""The cluster description: plain, validated data."""

from __future__ import annotations

from dataclasses import dataclass

#: Task roles a host can be restricted to with ``roles=``.
ROLES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator", "data")

#: Host names that run through the local transport (no SSH).
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Host:
    """One machine of the cluster.

    ``slots`` is how many worker tasks the host takes; ``gpus`` how many GPUs it has (0: none or
    unknown); ``roles`` restricts which task roles may be placed there (empty: any role).
    ``speed`` and ``memory_bytes`` describe each of its devices (a GPU, or a slot on a CPU host)
    for model-parallel planning: relative speed and memory (None: unlimited). ``cpu_quota`` caps the
    CPUs each of its tasks may use (a cgroup CPU quota: emulates a slower machine; None: no cap), and
    ``cpus`` pins them to those CPU numbers (emulates a machine of its own; None: anywhere).
    ``source`` is ``file:line`` of the description it came from, for error messages.
    """

    name: str
    user: str | None = None
    slots: int = 1
    gpus: int = 0
    port: int = 22
    roles: tuple[str, ...] = ()
    python: str | None = None
    workdir: str | None = None
    source: str = ""
    address: str | None = None  # network address when ``name`` is an ~/.ssh/config alias
    speed: float = 1.0
    memory_bytes: int | None = None
    cpu_quota: float | None = None
    cpus: tuple[int, ...] | None = None

    @property
    def is_local(self) -> bool:
        """True when tasks on this host run as local subprocesses rather than over SSH."""
        return self.name in LOCAL_NAMES

    @property
    def label(self) -> str:
        """Short name used in task prefixes and tables (:func:`host_label`)."""
        return host_label(self.name, self.user, self.port)

    def accepts(self, role: str) -> bool:
        """Whether a task of ``role`` may run here."""
        return not self.roles or role in self.roles


@dataclass(frozen=True)
class Cluster:
    """An ordered list of hosts; the first host is where the chief goes by default."""

    hosts: tuple[Host, ...]
    source: str = ""

    @property
    def total_slots(self) -> int:
        """Worker slots over all hosts that accept workers."""
        return sum(h.slots for h in self.hosts if h.accepts("worker"))


def local_cluster(slots: int = 1, gpus: int = 0) -> Cluster:
    """The cluster used when neither ``--hosts`` nor ``--template`` is given: this machine."""
    return Cluster(hosts=(Host(name="localhost", slots=max(1, slots), gpus=gpus, source="<local>"),),
                   source="<this machine>")


def host_label(name: str, user: str | None = None, port: int = 22) -> str:
    """A host's short name (``user@host:port`` only when needed): how tasks, tables and plan.json
    name it."""
    base = f"{user}@{name}" if user else name
    return base if port == 22 else f"{base}:{port}"
