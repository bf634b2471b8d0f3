"""Host probe: ``python -m ddlctl.runtime.probe`` prints one JSON object about this host.

Run by ``ddlctl check`` and before ``ddlctl launch`` on every host, with the host's own Python:
Python version, installed TensorFlow / tf-keras / ddlctl versions (from package metadata, without
importing TensorFlow), CPUs, GPUs via NVML, and whether free TCP ports can be bound.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from dataclasses import asdict


def installed(*names: str) -> str | None:
    """Version of the first installed distribution among ``names``."""
    from importlib import metadata  # only when asked: it is slow to import

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def logged_in_users() -> list[str] | None:
    """Names of the users logged in on this host (the system's login records: ``psutil``, else
    ``who``), sorted, each once; None when neither can tell."""
    try:
        import psutil

        return sorted({u.name for u in psutil.users() if u.name})
    except ImportError:
        pass
    import subprocess

    try:
        done = subprocess.run(["who"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({line.split()[0] for line in done.stdout.splitlines() if line.split()}) \
        if done.returncode == 0 else None


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
    import time

    folder = folder or claims_folder()
    now = time.time() if now is None else now
    path = os.path.join(folder, str(port))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.utime(path, (now, now))
            return True
        except FileExistsError:
            if now - os.stat(path).st_mtime < CLAIM_S:
                return False
            os.utime(path, (now, now))  # an old claim: its task bound the port long ago, or never will
            return True
    except OSError:
        return True  # no folder to keep claims in: the bind check alone


#: :func:`prune_claims` clears old claims once the folder holds more than this many.
PRUNE_AT = 1000


def prune_claims(folder: str | None = None, now: float | None = None) -> int:
    """Remove the claims older than :data:`CLAIM_S` from ``folder`` once it holds more than
    :data:`PRUNE_AT` (one file per port ever chosen would otherwise pile up); how many went."""
    import time

    folder = folder or claims_folder()
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
        if len(entries) <= PRUNE_AT:
            return 0
        for entry in entries:
            try:
                if now - entry.stat().st_mtime >= CLAIM_S:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
    except OSError:
        return removed
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
    import random

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


def can_bind_ports(count: int = 2) -> bool:
    """Whether ``count`` TCP ports can be bound here now (nothing claimed: nothing will use them)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.socket())
            sockets[-1].bind(("", 0))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def quick_probe(ports: int) -> dict[str, object]:
    """What ``launch`` needs, as cheaply as possible (one process start per host): Python,
    whether TensorFlow is importable (without importing it), and free ports for the tasks."""
    import importlib.util

    try:
        chosen = free_ports(ports)
        ports_ok = True
    except OSError:
        chosen, ports_ok = [], False
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "tensorflow": "present" if importlib.util.find_spec("tensorflow") else None,
        "ports": chosen,
        "ports_ok": ports_ok,
    }


def probe() -> dict[str, object]:
    """Facts about this host, as plain JSON-ready data."""
    from ddlctl.telemetry.nvml import inventory

    gpus = inventory()
    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "tensorflow": installed("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos"),
        "tf_keras": installed("tf-keras", "tf_keras"),
        "ddlctl_installed": installed("ddlctl"),
        "cpus": os.cpu_count(),
        "gpus": [asdict(g) for g in gpus.gpus],
        "driver": gpus.driver,
        "gpu_note": gpus.note,
        "ports_ok": can_bind_ports(),
        "user": _me(),
        "logged_in": logged_in_users(),
    }


def _me() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def main(argv: list[str]) -> None:
    """``probe`` (full, for ``ddlctl check``) or ``probe --quick N`` (launch: N free ports)."""
    if argv[:1] == ["--quick"]:
        print(json.dumps(quick_probe(int(argv[1]))))
    else:
        print(json.dumps(probe()))


if __name__ == "__main__":
    main(sys.argv[1:])
