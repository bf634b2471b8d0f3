"""Where a run's cluster comes from: a hosts file, a template, a Slurm allocation, or this machine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ddlctl.cluster.hostfile import load_hosts
from ddlctl.cluster.model import Cluster, local_cluster
from ddlctl.cluster.template import LaunchDefaults, load_template
from ddlctl.contract.errors import ConfigError

if TYPE_CHECKING:
    from ddlctl.cluster.slurm import Allocation

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
        from ddlctl.cluster.slurm import allocation_cluster

        return allocation_cluster(allocation, python), LaunchDefaults(), False
    if python:
        raise ConfigError("--python applies with --slurm", "set python= per host in the hosts file instead")
    if hosts:
        return load_hosts(hosts), LaunchDefaults(), False
    if template:
        loaded = load_template(template)
        return loaded.cluster, loaded.defaults, False
    return local_cluster(slots=local_slots, gpus=local_gpus()), LaunchDefaults(), True


def local_gpus(environ: Mapping[str, str] = os.environ, dev: str = "/dev") -> int:
    """The NVIDIA GPUs of this machine that its tasks may use: one per ``/dev/nvidiaN`` device
    file (a container holds those of its own GPUs), at most as many as ``CUDA_VISIBLE_DEVICES``
    names when it is set (CUDA stops at its first entry that is not a GPU: ``-1`` hides them all).
    The implicit cluster of this machine declares them, as ``gpus=`` does on a hosts-file line:
    its workers get their own (``CUDA_VISIBLE_DEVICES``), not all of them each."""
    from ddlctl.host.probe import nvidia_devices

    found = nvidia_devices(dev)
    if not found:
        return 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    named = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        named += 1
    return min(found, named)
