"""How to reach SSH hosts (the SSH flags), kept apart from the SSH code so that reading the flags
does not import paramiko (a local run never needs it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SshOptions:
    """How to connect: ``--ssh-key``, ``--ssh-user``, ``--connect-timeout``, host-key policy."""

    key_file: str | None = None
    user: str | None = None
    connect_timeout_s: float = 10.0
    accept_new_host_keys: bool = False
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = "~/.ssh/config"
    max_parallel: int = 32
