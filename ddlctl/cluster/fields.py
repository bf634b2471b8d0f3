"""Validation of host fields, shared by the hosts-file parser and the YAML template loader.

Both front ends hand over raw values (strings from a hosts file, YAML scalars from a template)
together with a ``file:line`` location; every error names that location and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ddlctl.cluster.model import ROLES, Host
from ddlctl.contract.errors import ConfigError

#: Keys a host accepts besides its name, with what each expects (used in error messages).
HOST_KEYS: dict[str, str] = {
    "user": "a login name",
    "slots": "an integer >= 1 (worker tasks on this host; default: gpus, or 1)",
    "gpus": "an integer >= 0",
    "port": "an SSH port between 1 and 65535",
    "roles": f"a comma-separated subset of {','.join(ROLES)}",
    "python": "the Python interpreter to run tasks with on this host",
    "workdir": "the directory tasks start in on this host",
    "speed": "a number > 0: each device's speed relative to the others (model-parallel planning; default 1)",
    "memory": "each device's memory, e.g. 16GiB, 512MiB or 8GB (model-parallel planning; default: unlimited)",
    "cpu_quota": "a number of CPUs >= 0.01 that each task on this host may use, enforced with a cgroup CPU quota "
                 "(emulates a slower machine; needs a writable cgroup cpu controller, e.g. root); the task's "
                 "TensorFlow ops then use that many threads, rounded up (TF_NUM_INTRAOP_THREADS, unless set)",
    "cpus": "the CPUs each task on this host is pinned to, e.g. 1, 0-3 or 0,2, numbers 0-8191 (CPU affinity: "
            "emulates a machine "
            "of its own on a shared one; TensorFlow then sizes its thread pools to them)",
}

_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 2**10, "M": 1000**2, "MB": 1000**2, "MIB": 2**20,
          "G": 1000**3, "GB": 1000**3, "GIB": 2**30, "T": 1000**4, "TB": 1000**4, "TIB": 2**40}


def parse_memory(value: object, where: str) -> int:
    """``16GiB``, ``512MiB``, ``8GB``, ``1.5T`` or a number of bytes -> bytes."""
    match = _MEMORY_RE.match(str(value)) if not isinstance(value, bool) else None
    unit = (match.group(2) or "").upper() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"{where}: memory={value!r} is not a memory size", f"memory must be {HOST_KEYS['memory']}")
    return int(float(match.group(1)) * _UNITS[unit])


def _positive(value: object, key: str, where: str, low: float = 0.0) -> float:
    try:
        number = float(str(value)) if not isinstance(value, bool) else 0.0
    except ValueError:
        number = 0.0
    if not number > 0 or number < low or number == float("inf"):
        raise ConfigError(f"{where}: {key}={value!r} is not valid", f"{key} must be {HOST_KEYS[key]}")
    return number

_USER_RE = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_IPV6_RE = re.compile(r"^[0-9A-Fa-f:.]+$")


def split_target(text: str, where: str) -> tuple[str | None, str]:
    """Split ``[user@]host`` into its parts, validating both (``[::1]`` style IPv6 allowed)."""
    user: str | None = None
    host = text
    if "@" in text:
        user, _, host = text.rpartition("@")
        if not _USER_RE.match(user):
            raise ConfigError(f"{where}: invalid user name {user!r} in {text!r}",
                              "a user name is letters, digits, '.', '_' or '-'")
    if host.startswith("[") and host.endswith("]") and _IPV6_RE.match(host[1:-1]):
        host = host[1:-1]
    elif not _HOST_RE.match(host) and not _IPV6_RE.match(host):
        raise ConfigError(f"{where}: invalid host name {host!r}",
                          "expected a host name, an IPv4 address or an [IPv6] address")
    return user, host


def _int(value: object, key: str, where: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{where}: {key}={value!r} is not valid", f"{key} must be {HOST_KEYS[key]}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{where}: {key}={value!r} is not an integer",
                          f"{key} must be {HOST_KEYS[key]}") from None
    if number < low or (high is not None and number > high):
        raise ConfigError(f"{where}: {key}={number} is out of range", f"{key} must be {HOST_KEYS[key]}")
    return number


def _roles(value: object, where: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).split(",")
    roles = tuple(str(r).strip() for r in items if str(r).strip())
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise ConfigError(f"{where}: roles={value!r} is not valid",
                          f"roles must be {HOST_KEYS['roles']}")
    return tuple(dict.fromkeys(roles))


#: CPU numbers a host may name (Linux's largest NR_CPUS): cpus=0-9999999 took 15 s and 714 MiB.
MAX_CPUS = 8192


def parse_cpus(value: object, where: str) -> tuple[int, ...]:
    """``1``, ``0-3``, ``0,2`` or ``0-1,4`` (a YAML list of numbers too) -> sorted CPU numbers."""
    items = value if isinstance(value, list) else str(value).split(",")
    cpus: set[int] = set()
    for item in items:
        first, dash, last = str(item).strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            low, high = 0, -1
        if isinstance(item, bool) or low < 0 or high < low or high >= MAX_CPUS:
            raise ConfigError(f"{where}: cpus={value!r} is not valid", f"cpus must be {HOST_KEYS['cpus']}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def _text(value: object, key: str, where: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value) == "":
        raise ConfigError(f"{where}: {key}= needs a value", f"{key} must be {HOST_KEYS[key]}")
    return str(value)


def make_host(name: str, user: str | None, fields: Mapping[str, object], where: str) -> Host:
    """Build a validated :class:`Host` from raw ``fields`` (keys from :data:`HOST_KEYS`)."""
    unknown = sorted(set(fields) - set(HOST_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}",
                          "expected one of: " + ", ".join(HOST_KEYS))
    if "user" in fields:
        if user is not None:
            raise ConfigError(f"{where}: user given twice (user@host and user=)")
        user, _ = split_target(f"{_text(fields['user'], 'user', where)}@x", where)
    gpus = _int(fields["gpus"], "gpus", where, 0) if "gpus" in fields else 0
    slots = _int(fields["slots"], "slots", where, 1) if "slots" in fields else max(1, gpus)
    return Host(
        name=name,
        user=user,
        slots=slots,
        gpus=gpus,
        port=_int(fields["port"], "port", where, 1, 65535) if "port" in fields else 22,
        roles=_roles(fields["roles"], where) if "roles" in fields else (),
        python=_text(fields["python"], "python", where) if "python" in fields else None,
        workdir=_text(fields["workdir"], "workdir", where) if "workdir" in fields else None,
        speed=_positive(fields["speed"], "speed", where) if "speed" in fields else 1.0,
        memory_bytes=parse_memory(fields["memory"], where) if "memory" in fields else None,
        cpu_quota=_positive(fields["cpu_quota"], "cpu_quota", where, 0.01) if "cpu_quota" in fields else None,
        cpus=parse_cpus(fields["cpus"], where) if "cpus" in fields else None,
        source=where,
    )


def check_unique(hosts: list[Host]) -> None:
    """Refuse the same host (name and SSH port) listed twice, naming both places."""
    seen: dict[tuple[str, int], Host] = {}
    for host in hosts:
        key = (host.name, host.port)
        if key in seen:
            raise ConfigError(
                f"{host.source}: host {host.label!r} is already listed at {seen[key].source}",
                "list each machine once and give it slots=N for several tasks",
            )
        seen[key] = host
