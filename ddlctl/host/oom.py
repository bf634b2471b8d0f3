"""Whether a task that died of SIGKILL was killed by the kernel's out-of-memory killer: the kernel
log says so by pid ("Out of memory: Killed process 1234 (python) ... anon-rss:...kB", or "Memory
cgroup out of memory: ..." for a group's limit), readable through ``/dev/kmsg`` by root (and by
everyone where ``kernel.dmesg_restrict`` is 0); else ``/proc/vmstat``'s ``oom_kill`` counter,
readable by everyone, says whether the OOM killer killed anything on the host while the task
ran. Standard library only: the host agent runs it from the code bundle."""

from __future__ import annotations

import os
import re
import time

KMSG = "/dev/kmsg"
VMSTAT = "/proc/vmstat"
_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\).*?anon-rss:(\d+)kB")


def oom_kills(path: str = VMSTAT) -> int | None:
    """The host's count of processes the OOM killer has killed since boot; None when unknown."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def kernel_records(path: str = KMSG) -> list[str] | None:
    """The kernel log's records still in its buffer (``PRIO,SEQ,USEC,FLAGS;MESSAGE``); None when
    it cannot be read (not root where ``dmesg_restrict`` is set)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records: list[str] = []
    try:
        for _ in range(1_000_000):  # (bounded: the kernel's buffer holds far fewer records)
            try:
                record = os.read(fd, 8192)  # (one record a read)
            except BlockingIOError:
                break
            except BrokenPipeError:  # (records overwritten while reading: go on with the next)
                continue
            except OSError:
                break
            if not record:
                break
            records.append(record.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return records


def killed_in_log(records: list[str], pid: int, since_us: int) -> str | None:
    """What the kernel log says of the OOM killer killing ``pid`` at or after ``since_us``
    (microseconds of the kernel's monotonic clock: a pid reused since an older kill is not
    taken for it); None when it does not."""
    found = None
    for record in records:
        head, _, message = record.partition(";")
        fields = head.split(",")
        match = _KILLED.search(message)
        if match is None or int(match.group(1)) != pid or len(fields) < 3 or not fields[2].isdigit():
            continue
        if int(fields[2]) >= since_us:
            group = "cgroup" in message.split("Killed process")[0]  # ("Memory cgroup out of memory: ...")
            where = "its memory group's limit" if group else "the host's memory"
            rss = int(match.group(3)) * 1024
            found = f"the kernel's OOM killer, for {where}: it held {rss / 2**20:,.0f} MiB when killed"
    return found


def monotonic_us() -> int:
    """Now on the clock the kernel log stamps its records with (CLOCK_MONOTONIC), in microseconds."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def oom_evidence(pid: int, since_us: int, kills_before: int | None, kmsg: str = KMSG,
                 vmstat: str = VMSTAT) -> str | None:
    """Why a task ``pid`` that died of SIGKILL (started at ``since_us``, when the host had counted
    ``kills_before`` OOM kills) was probably the OOM killer's: the kernel log naming it, else more
    OOM kills on the host than at its start; None when neither says so."""
    records = kernel_records(kmsg)
    if records is not None:
        named = killed_in_log(records, pid, since_us - 1_000_000)
        if named is not None:
            return named
        if records:  # the log was read and does not name it: not the OOM killer's
            return None
    kills = oom_kills(vmstat)
    if kills is not None and kills_before is not None and kills > kills_before:
        return (f"the kernel's OOM killer killed {kills - kills_before} process(es) on this host while it ran "
                "(/proc/vmstat; the kernel log, which would name them, is not readable here)")
    return None
