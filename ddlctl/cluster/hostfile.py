"""Hosts files: one host per line, ``[user@]host [slots=N] [gpus=N] [port=P] [roles=..] ...``.

DeepSpeed / Horovod hostfiles (``node1 slots=4``) parse unchanged. ``#`` starts a comment; values
with spaces may be quoted (``workdir="/data/my runs"``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ddlctl.cluster.fields import HOST_KEYS, check_unique, make_host, split_target
from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract.errors import ConfigError

GRAMMAR = "[user@]host [slots=N] [gpus=N] [port=SSH_PORT] [roles=chief,worker,ps,evaluator] " \
          "[python=PATH] [workdir=PATH] [speed=X] [memory=SIZE] [cpu_quota=CPUS] [cpus=LIST]"


def parse_line(line: str, where: str) -> Host | None:
    """Parse one line; ``None`` for a blank or comment-only line."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc} in {line.strip()!r}", f"expected: {GRAMMAR}") from None
    if not tokens:
        return None
    target, *rest = tokens
    if "=" in target:
        raise ConfigError(f"{where}: line starts with {target!r}, expected a host name first",
                          f"expected: {GRAMMAR}")
    user, name = split_target(target, where)
    fields: dict[str, object] = {}
    for token in rest:
        key, sep, value = token.partition("=")
        if not sep:
            raise ConfigError(f"{where}: {token!r} is not key=value in {line.strip()!r}",
                              f"expected: {GRAMMAR}")
        if key not in HOST_KEYS or key == "user":
            raise ConfigError(f"{where}: unknown key {key!r} in {line.strip()!r}",
                              "expected one of: " + ", ".join(k for k in HOST_KEYS if k != "user"))
        if key in fields:
            raise ConfigError(f"{where}: {key}= given twice in {line.strip()!r}")
        fields[key] = value
    return make_host(name, user, fields, where)


def parse_hosts(text: str, source: str = "<hosts>") -> Cluster:
    """Parse the text of a hosts file into a :class:`Cluster` (errors name ``source:line``)."""
    hosts: list[Host] = []
    for number, line in enumerate(text.splitlines(), start=1):
        host = parse_line(line, f"{source}:{number}")
        if host is not None:
            hosts.append(host)
    if not hosts:
        raise ConfigError(f"{source}: no hosts listed", f"one host per line: {GRAMMAR}")
    check_unique(hosts)
    return Cluster(hosts=tuple(hosts), source=source)


def load_hosts(path: str | Path) -> Cluster:
    """Read and parse a hosts file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"hosts file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read hosts file {str(path)!r}: {exc}") from None
    return parse_hosts(text, str(path))
