"""The TCP ports a launch chooses for its tasks on a host (run there: by the host probe,
:mod:`ddlctl.host.probe`, and by the host agent for a restart's fresh ports). Standard library
only.

A port is free only until someone else binds it, and a task binds its port only once TensorFlow
has started (seconds, more under load). So ports are picked below the kernel's ephemeral range
(outgoing connections take theirs from it) and claimed on the host for :data:`CLAIM_S` (an empty
file per port), which other launches respect.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import stat
import time

#: The lowest port :func:`free_ports` picks from below the kernel's ephemeral range.
LOWEST_PORT = 10000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections (``low, high``), None if unknown."""
    try:
        with open(path) as handle:
            low, high = (int(v) for v in handle.read().split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


#: How long a port :func:`free_ports` chose stays claimed against other launches on the host (its
#: task binds it once TensorFlow has started: seconds, more under load).
CLAIM_S = 120.0


def claims_folder() -> str:
    """Where :func:`free_ports` records the ports it chose, one empty file per port (this user's)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"ddlctl-ports-{os.getuid()}")


def claim(port: int, folder: str | None = None, now: float | None = None) -> bool:
    """Claim ``port`` for a launch on this host: False when another launch claimed it less than
    :data:`CLAIM_S` ago (its task may not have bound it yet: two launches that chose the same free
    port would both start a task on it, and the second job's tasks would talk to the first's)."""
    folder = folder or claims_folder()
    now = time.time() if now is None else now
    path = os.path.join(folder, str(port))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not private_folder(folder):
            return True  # planted by someone else (its name is predictable): the bind check alone
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
            os.utime(path, (now, now), follow_symlinks=False)
            return True
        except FileExistsError:
            if now - os.lstat(path).st_mtime < CLAIM_S:
                return False
            # an old claim: its task bound the port long ago, or never will (a link is not followed)
            os.utime(path, (now, now), follow_symlinks=False)
            return True
    except OSError:
        return True  # no folder to keep claims in: the bind check alone


def private_folder(folder: str) -> bool:
    """Whether ``folder`` is a real folder (not a link) of this user's that nobody else may write."""
    info = os.lstat(folder)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


#: :func:`prune_claims` clears old claims once the folder holds more than this many.
PRUNE_AT = 1000


def prune_claims(folder: str | None = None, now: float | None = None) -> int:
    """Remove the claims older than :data:`CLAIM_S` from ``folder`` once it holds more than
    :data:`PRUNE_AT` (one file per port ever chosen would otherwise pile up); how many went."""
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(folder or claims_folder()))
    except OSError:
        return 0
    if len(entries) <= PRUNE_AT:
        return 0
    removed = 0
    for entry in entries:
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime >= CLAIM_S:
                os.unlink(entry.path)
                removed += 1
    return removed


def free_ports(count: int, ephemeral: tuple[int, int] | None = None, tries: int = 500,
               folder: str | None = None) -> list[int]:
    """``count`` distinct free TCP ports (all held open until chosen), picked at random below the
    kernel's ephemeral range (``ephemeral``, default :func:`ephemeral_range`) when it leaves room:
    every outgoing connection of any process on the host takes its local port from that range
    and could take a chosen port before its task binds it. Ports the kernel picks make up what
    random picks cannot (a busy or unknown range). Each port is claimed (:func:`claim`, in
    ``folder``) so that another launch on the host does not choose it meanwhile: in the test
    suite two jobs started side by side once chose the same port, and the second's tasks
    reached the first's task, which died of it (SIGSEGV)."""
    sockets: list[socket.socket] = []
    low_high = ephemeral or ephemeral_range()
    prune_claims(folder)

    def take(port: int) -> None:
        sock = socket.socket()
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            return
        if claim(sock.getsockname()[1], folder):
            sockets.append(sock)
        else:
            sock.close()

    try:
        pool = random.Random()  # not the program's seeded one
        room = low_high is not None and low_high[0] - LOWEST_PORT >= 1000
        for _ in range(tries):
            if len(sockets) == count:
                break
            take(pool.randrange(LOWEST_PORT, low_high[0]) if room else 0)  # type: ignore[index]
        while len(sockets) < count:  # what is left: the kernel's choice, claimed or not
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("", 0))  # a host that cannot bind at all raises here (can_bind_ports: False)
            claim(sock.getsockname()[1], folder)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
