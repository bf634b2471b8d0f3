"""``--private-network``: a local-only job in a network namespace of its own (Linux).

TensorFlow's gRPC server binds ``0.0.0.0:PORT`` whatever address its ``TF_CONFIG`` gives
(``grpc_server_lib.cc``), and serves anyone who connects, unauthenticated: on a machine shared
with other users, any of them can drive a job's servers. When every task runs on this machine,
the controller can move itself, before it starts any process, into a new network namespace whose
only interface is its own loopback: the host agents and tasks it starts inherit it, talk to the
controller over pipes as always, and their servers cannot be reached from outside it.

As root a network namespace is enough (``unshare(CLONE_NEWNET)``); otherwise a user namespace
comes with it (the user mapped to itself, which Linux allows where unprivileged user namespaces
are: most distributions), giving the capability to bring the loopback up and nothing outside.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Sequence

from ddlctl.cluster.model import Host
from ddlctl.contract.errors import ConfigError, LaunchError

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def check_private_network(hosts: Sequence[Host], slurm: bool, metrics: str | None) -> None:
    """``--private-network`` applies to a job whose every host is this machine (pure)."""
    if slurm:
        raise ConfigError("--private-network is for jobs on this machine alone, not a Slurm allocation",
                          "leave --private-network out; keep the nodes on a private network")
    remote = [h.label for h in hosts if not h.is_local]
    if remote:
        raise ConfigError(f"--private-network is for jobs on this machine alone: {', '.join(remote)} "
                          f"{'is' if len(remote) == 1 else 'are'} reached over the network",
                          "leave --private-network out; keep the hosts on a private network or behind a firewall")
    if metrics:
        raise ConfigError("--private-network and --metrics-port: the metrics port would be inside the job's "
                          "own network, where no Prometheus can reach it", "leave one of them out")


def enter_private_network() -> None:
    """Move this process (and so everything it starts from now on) into a new network namespace
    with only its loopback, up. Raises :class:`LaunchError` where Linux refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        hint = ("run as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
                "or user.max_user_namespaces > 0)" if code in (errno.EPERM, errno.ENOSPC, errno.EUSERS)
                else "leave --private-network out")
        raise LaunchError(f"--private-network: Linux refused a network namespace of the job's own: "
                          f"{os.strerror(code)}", hint)
    if flags & CLONE_NEWUSER:  # the user stays itself inside (no root in the files it writes)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    loopback_up()


def loopback_up() -> None:
    """Bring ``lo`` up in this network namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
