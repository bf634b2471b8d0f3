"""Where a run's cluster comes from: a hosts file, a template, a Slurm allocation, or this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlctl.cluster.hostfile import load_hosts
from ddlctl.cluster.model import Cluster, local_cluster
from ddlctl.cluster.template import LaunchDefaults, load_template
from ddlctl.errors import ConfigError

if TYPE_CHECKING:
    from ddlctl.slurm.allocation import Allocation

#: Workers of the implicit localhost cluster (no --hosts, no --template).
DEFAULT_LOCAL_WORKERS = 2


def load_cluster(hosts: str | None, template: str | None,
                 local_slots: int = DEFAULT_LOCAL_WORKERS,
                 allocation: Allocation | None = None, python: str | None = None
                 ) -> tuple[Cluster, LaunchDefaults, bool]:
    """The cluster from --hosts or --template, the Slurm ``allocation``, or this machine; and
    whether it is implicit."""
    if hosts and template:
        raise ConfigError("give --hosts or --template, not both")
    if allocation is not None:
        if hosts or template:
            raise ConfigError(f"--slurm takes the cluster from the allocation (job {allocation.job_id}): "
                              f"drop {'--hosts' if hosts else '--template'}")
        from ddlctl.slurm.allocation import allocation_cluster

        return allocation_cluster(allocation, python), LaunchDefaults(), False
    if python:
        raise ConfigError("--python applies with --slurm", "set python= per host in the hosts file instead")
    if hosts:
        return load_hosts(hosts), LaunchDefaults(), False
    if template:
        loaded = load_template(template)
        return loaded.cluster, loaded.defaults, False
    return local_cluster(slots=local_slots), LaunchDefaults(), True
