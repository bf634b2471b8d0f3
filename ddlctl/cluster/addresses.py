"""Addresses every task can reach: the one rule for TF_CONFIG host names when hosts mix.

TensorFlow gives every task the same cluster spec, so each address in it must work from every
host. ``localhost`` only works when every task is on this machine: in a cluster that also has
remote hosts, this machine's tasks are written down under the address this machine uses to reach
them (the source address of its SSH connection, or of its route to the first remote host).
"""

from __future__ import annotations

import dataclasses
import socket

from ddlctl.cluster.model import Cluster
from ddlctl.contract.errors import ConfigError


def mixes_local_and_remote(cluster: Cluster) -> bool:
    """Whether some hosts are this machine and others are reached over SSH."""
    return any(h.is_local for h in cluster.hosts) and not all(h.is_local for h in cluster.hosts)


def with_reachable_addresses(cluster: Cluster, local_address: str | None) -> Cluster:
    """``cluster`` with this machine's hosts given ``local_address`` when remote hosts must reach
    them (pure). Without an address for such a mix: a clear error naming the entry to change."""
    if not mixes_local_and_remote(cluster):
        return cluster
    remote_on_loopback = all((h.address or h.name).startswith("127.") for h in cluster.hosts if not h.is_local)
    loopback = local_address is not None and (local_address.startswith("127.") or local_address == "::1")
    if not local_address or (loopback and not remote_on_loopback):  # a loopback address works only here
        entry = next(h for h in cluster.hosts if h.is_local)
        raise ConfigError(
            f"{entry.source or entry.name}: {entry.name!r} runs tasks that the remote hosts must reach, but no "
            "address of this machine that they can reach was found",
            "write this machine's host name or IP address instead of localhost (it is then reached over SSH)")
    return dataclasses.replace(cluster, hosts=tuple(
        dataclasses.replace(h, address=local_address) if h.is_local else h for h in cluster.hosts))


def route_source_address(hostname: str, port: int = 22) -> str | None:
    """This machine's address on its route to ``hostname`` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.connect(address)
                return sock.getsockname()[0]
        except OSError:
            continue
    return None
