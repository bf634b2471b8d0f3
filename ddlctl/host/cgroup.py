"""A CPU quota for one task (host key ``cpu_quota=``): a cgroup of its own, so that one task runs
N times slower than another on the same machine, reproducibly (heterogeneity emulated for tests and
benchmarks; measured on 2 cores: 1 ms of CPU per 1, 2 and 4 ms periods gave speed ratios
1 : 1.76 : 3.49, where limiting threads gave no stable ratio). Short periods matter: with the default
100 ms period a task runs at full speed for a while, then stalls, and synchronous training sees
jitter instead of a slower device.

cgroup v1 (``/sys/fs/cgroup/cpu``) and v2 (``cpu.max``) are supported; creating a group needs a
writable hierarchy (root, or a delegated subtree). Runs inside the host agent (standard library only).

Also the CPUs a task is pinned to (host key ``cpus=``, CPU affinity, no privilege needed): two tasks
on CPUs of their own do not take each other's cores as tasks on separate machines would not.
"""

from __future__ import annotations

import contextlib
import math
import os

V1_ROOT = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"
MIN_PERIOD_US = 1000
MAX_PERIOD_US = 1_000_000


class QuotaError(OSError):
    """The quota cannot be set on this host (the message says why)."""


class CpusError(OSError):
    """The CPUs asked for are not this host's (the message says which it has)."""


def cpu_ranges(cpus) -> str:  # noqa: ANN001 - an iterable of ints
    """``0-3,6`` for CPUs 0, 1, 2, 3 and 6."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def check_cpus(cpus) -> set[int]:  # noqa: ANN001 - an iterable of ints
    """``cpus`` as a set, when this process may run on all of them; else :class:`CpusError`."""
    wanted, available = set(cpus), os.sched_getaffinity(0)
    if not wanted or not wanted <= available:
        raise CpusError(f"CPUs {cpu_ranges(wanted - available)} are not available here; tasks on this "
                        f"host may use CPUs {cpu_ranges(available)}")
    return wanted


def period_quota(cpus: float) -> tuple[int, int]:
    """(period, quota) in microseconds for ``cpus`` CPUs with the shortest period the kernel allows:
    1 ms of quota per ``1 / cpus`` ms below one CPU, ``cpus`` ms per 1 ms period above."""
    if not cpus > 0:
        raise ValueError(f"cpu quota must be > 0, got {cpus}")
    if cpus >= 1:
        return MIN_PERIOD_US, int(round(cpus * MIN_PERIOD_US))
    return min(MAX_PERIOD_US, int(round(MIN_PERIOD_US / cpus))), MIN_PERIOD_US


def intra_op_threads(cpus: float) -> int:
    """Threads one TensorFlow op should use in a task limited to ``cpus`` CPUs: no more than the
    CPUs it may use. TensorFlow sizes its pools by the machine's cores and knows nothing of CPU
    quotas; under a quota, more threads only burn it faster and wait for the next period together.
    Measured (model strategy, stage tasks at 0.6 / 0.6 / 0.3 CPUs on 2 cores): 1 thread instead of
    2 took a 4-micro-batch step from 242-253 ms to 176 ms."""
    return max(1, math.ceil(cpus - 1e-9))


def _v2() -> bool:
    try:
        with open(os.path.join(V2_ROOT, "cgroup.controllers")) as handle:
            return "cpu" in handle.read().split()
    except OSError:
        return False


def create(name: str, cpus: float) -> str:
    """Create the group ``ddlctl/<name>`` limited to ``cpus`` CPUs; its ``cgroup.procs`` path.
    Raises :class:`QuotaError` with a message that says what is missing."""
    period, quota = period_quota(cpus)
    if os.path.isdir(V1_ROOT):
        folder = os.path.join(V1_ROOT, "ddlctl", name)
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "cpu.cfs_period_us"), "w") as handle:
                handle.write(str(period))
            with open(os.path.join(folder, "cpu.cfs_quota_us"), "w") as handle:
                handle.write(str(quota))
        except OSError as exc:
            raise QuotaError(f"cannot set a CPU quota in {folder}: {exc.strerror or exc}") from None
        return os.path.join(folder, "cgroup.procs")
    if _v2():
        parent = os.path.join(V2_ROOT, "ddlctl")
        folder = os.path.join(parent, name)
        try:
            os.makedirs(folder, exist_ok=True)
            for level in (V2_ROOT, parent):
                with open(os.path.join(level, "cgroup.subtree_control"), "w") as handle:
                    handle.write("+cpu")
            with open(os.path.join(folder, "cpu.max"), "w") as handle:
                handle.write(f"{quota} {period}")
        except OSError as exc:
            raise QuotaError(f"cannot set a CPU quota in {folder}: {exc.strerror or exc}") from None
        return os.path.join(folder, "cgroup.procs")
    raise QuotaError("no cgroup cpu controller on this host (neither /sys/fs/cgroup/cpu nor cgroup v2 with cpu)")


def join(procs_path: str) -> None:
    """Move the calling process into the group (called in the task before exec)."""
    with open(procs_path, "w") as handle:
        handle.write(str(os.getpid()))


def remove(procs_path: str) -> None:
    """Remove the group once its processes are gone (best effort)."""
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(procs_path))
