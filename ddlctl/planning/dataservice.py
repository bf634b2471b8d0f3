"""The tf.data service's tasks in a plan (``--data-workers N``, hosts with ``roles=data``): one
dispatcher and the data workers, started before the trainers, with ports planned like every other.

* Where: the data workers go to the hosts that name the ``data`` role, round-robin (else, with
  ``--data-workers N``, to the hosts that accept any role: this machine without a hosts file); the
  dispatcher to the first of them. How many: ``--data-workers N``, else one a data host's slot.
* What they run: ``python -m ddlctl.task.dataservice`` (:mod:`ddlctl.task.dataservice`), a
  fault-tolerant dispatcher journalling in its task folder (``journal/``: it restarts from it) and
  ``WorkerServer``s that register with it. They are not members of the cluster spec (no TF_CONFIG).
* What the trainers get: ``DDLCTL_DATA_SERVICE=grpc://host:port`` (the dispatcher), which
  :func:`ddlctl.task.data.distribute` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import PlanError
from ddlctl.planning.request import LaunchRequest, Placement

#: The roles of the data service's tasks (servers, never members of the cluster spec).
DATA_ROLES = ("dispatcher", "data")


def data_hosts(cluster: Cluster, request: LaunchRequest) -> list[Host]:
    """The hosts data workers go to: those naming ``roles=data``, else (``--data-workers N``) those
    that accept any role."""
    explicit = [h for h in cluster.hosts if "data" in h.roles]
    if explicit or not request.data_workers:
        return explicit
    return [h for h in cluster.hosts if not h.roles]


def data_placements(cluster: Cluster, request: LaunchRequest) -> list[Placement]:
    """The dispatcher and the data workers (none when no data worker is asked for or declared)."""
    hosts = data_hosts(cluster, request)
    count = request.data_workers if request.data_workers is not None else sum(h.slots for h in hosts)
    if count < 0:
        raise PlanError(f"--data-workers must be 0 or more (got {count})")
    if not count:
        return []
    if not hosts:
        raise PlanError(f"--data-workers {count}: no host in {cluster.source or 'the cluster'} takes data workers",
                        "give some hosts roles=data (or leave a host without roles=)")
    return [Placement("dispatcher", 0, hosts[0], ()),
            *(Placement("data", i, hosts[i % len(hosts)], ()) for i in range(count))]


def data_argv(python: str) -> tuple[str, ...]:
    return (python, "-m", "ddlctl.task.dataservice")


def service_address(placements: Sequence[Placement], ports: Mapping[str, int], address_of) -> str | None:  # noqa: ANN001
    """``grpc://host:port`` of the plan's dispatcher (None: no data service)."""
    for p in placements:
        if p.role == "dispatcher":
            return f"grpc://{address_of(p.host)}:{ports.get(p.name, 0)}"
    return None


def data_env(placement: Placement, own: str, service: str | None) -> dict[str, str]:
    """What a task needs of the data service (``own``: its ``host:port``): a dispatcher or data
    worker its address (``DDLCTL_DATA_ADDRESS``: the port it binds, the address it gives), a data
    worker its dispatcher's too, a trainer the service's."""
    if service is None:
        return {}
    if placement.role in DATA_ROLES:
        env = {envvars.DATA_ADDRESS: own, "CUDA_VISIBLE_DEVICES": ""}
        if placement.role == "data":
            env[envvars.DATA_DISPATCHER] = service.removeprefix("grpc://")
        return env
    return {envvars.DATA_SERVICE: service}
