"""Host probe: ``python -m ddlctl.host.probe`` prints one JSON object about this host.

Run by ``ddlctl check`` and before ``ddlctl launch`` on every host, with the host's own Python:
Python version, installed TensorFlow / tf-keras / ddlctl versions (from package metadata, without
importing TensorFlow), CPUs, GPUs via NVML, and whether free TCP ports can be bound.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import sys
import time
from dataclasses import asdict

from ddlctl.contract.diskspace import free_bytes
from ddlctl.contract.rundir import REMOTE_ROOT
from ddlctl.host.ports import free_ports

#: The distributions that install the ``tensorflow`` package, as their folders in site-packages name them.
_TF_DIST = re.compile(r"(?:tensorflow|tensorflow_cpu|tensorflow_macos|tensorflow_intel|tf_nightly)-([^-]+)\.dist-info$",
                      re.IGNORECASE)


def tensorflow_version() -> str | None:
    """The version of the TensorFlow this Python imports, from its distribution's folder beside it
    (no import of TensorFlow, nor of importlib.metadata: 50 ms at every agent start); "present"
    when it cannot be told, None when there is none."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin or "")) if spec.origin else None
    try:
        names = sorted(os.listdir(site)) if site else []
    except OSError:
        names = []
    versions = [m.group(1) for m in map(_TF_DIST.match, names) if m]
    return versions[0] if len(versions) == 1 else "present"


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


def nvidia_devices(dev: str = "/dev") -> int:
    """How many ``/dev/nvidiaN`` device files there are: the NVIDIA GPUs this host (or container)
    holds, read without NVML."""
    try:
        return sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def quick_probe(ports: int) -> dict[str, object]:
    """What ``launch`` needs, as cheaply as possible (one process start per host): Python,
    whether TensorFlow is importable (without importing it), and free ports for the tasks."""
    try:
        chosen = free_ports(ports)
        ports_ok = True
    except OSError:
        chosen, ports_ok = [], False
    devices = nvidia_devices()
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "tensorflow": tensorflow_version(),
        "gpu_devices": devices,
        "cuda_missing": missing_cuda_libraries() if devices else None,  # (launch warns, as check does)
        "ports": chosen,
        "ports_ok": ports_ok,
        "disk_free": free_bytes(os.path.expanduser(REMOTE_ROOT)),
    }


#: What TensorFlow (2.15 to 2.21) loads to use a GPU: NVIDIA's pip package of it (what
#: ``tensorflow[and-cuda]`` installs), else the library on the loader's path.
CUDA_LIBRARIES = (("nvidia-cuda-runtime-cu12", "libcudart.so.12"), ("nvidia-cudnn-cu12", "libcudnn.so.9"))


def missing_cuda_libraries() -> list[str]:
    """The libraries of :data:`CUDA_LIBRARIES` this Python's TensorFlow would not find."""
    import ctypes

    missing = []
    for package, library in CUDA_LIBRARIES:
        if installed(package):
            continue
        try:
            ctypes.CDLL(library)
        except OSError:
            missing.append(library)
    return missing


def probe() -> dict[str, object]:
    """Facts about this host, as plain JSON-ready data."""
    from ddlctl.host.nvml import inventory

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
        "cuda_missing": missing_cuda_libraries() if gpus.gpus else None,
        "driver": gpus.driver,
        "gpu_note": gpus.note,
        "ports_ok": can_bind_ports(),
        "user": _me(),
        "logged_in": logged_in_users(),
        "disk_free": free_bytes(os.path.expanduser(REMOTE_ROOT)),
        "time": time.time(),  # (check puts it beside this machine's: a clock that is off is said)
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
