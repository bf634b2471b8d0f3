"""Pre-flight checks: can each host run a task? Used by ``ddlctl check`` and before ``launch``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import ddlctl
from ddlctl.cluster.model import Host
from ddlctl.contract.diskspace import LOW_SPACE_BYTES, size_words
from ddlctl.contract.errors import ConfigError, LaunchError
from ddlctl.contract.hostclock import CLOCK_SAID_S, SYNCHRONISE, how_far
from ddlctl.contract.rundir import REMOTE_ROOT
from ddlctl.transport.base import Transport

MIN_PYTHON = (3, 10)


@dataclass(frozen=True)
class HostReport:
    """One host's pre-flight result: reachable or why not, and the probe's facts."""

    host: str
    source: str
    error: str | None = None
    facts: Mapping[str, object] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # warnings about the host among the others (see tensorflow_mismatch)
    spec: Host | None = None  # the host as the hosts file or template describes it (roles, slots, cpus)

    @property
    def reachable(self) -> bool:
        return self.error is None

    @property
    def problems(self) -> list[str]:
        """What makes the host unusable, each with what to do."""
        if self.error:
            return [self.error]
        return host_problems(self.facts)

    @property
    def usable(self) -> bool:
        return not self.problems

    @property
    def warnings(self) -> list[str]:
        """What does not stop a run here but the user should know."""
        return [*host_warnings(self.facts), *self.notes] if self.reachable else []

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "source": self.source, "reachable": self.reachable,
                "usable": self.usable, "problems": self.problems, "warnings": self.warnings, "error": self.error,
                "controller_ddlctl": ddlctl.__version__, **self.facts}


def host_problems(facts: Mapping[str, object]) -> list[str]:
    """Problems found in a probe's facts (pure)."""
    problems = []
    python = str(facts.get("python", "0"))
    executable = facts.get("executable", "python3")
    if tuple(int(p) for p in python.split(".")[:2] if p.isdigit()) < MIN_PYTHON:
        problems.append(f"Python {python} at {executable} is too old: ddlctl needs 3.10 or newer")
    if not facts.get("tensorflow"):
        problems.append(f"TensorFlow is not installed for {executable}: run "
                        f"'{executable} -m pip install tensorflow' there, or set python= to one that has it")
    if facts.get("ports_ok") is False:
        problems.append("cannot bind free TCP ports")
    return problems


def host_warnings(facts: Mapping[str, object]) -> list[str]:
    """Warnings from a probe's facts (pure): a clock that is off; little free space where runs keep
    their files there; other users logged in, who could reach the servers."""
    warnings = []
    offset = facts.get("clock_offset")  # [least, most] the host's clock can be ahead of this machine's
    if isinstance(offset, list) and len(offset) == 2 and (min(offset) >= CLOCK_SAID_S or max(offset) <= -CLOCK_SAID_S):
        ahead = sum(offset) / 2
        warnings.append(f"its clock is {how_far(ahead)} (to {(offset[1] - offset[0]) / 2:.1f}s): a job puts its step "
                        f"times and samples on this machine's clock for the report, but {SYNCHRONISE}")
    missing, gpus = facts.get("cuda_missing"), facts.get("gpus")  # (gpus: check's NVML; launch's: device files)
    count = len(gpus) if isinstance(gpus, list) else facts.get("gpu_devices")
    if isinstance(missing, list) and missing and isinstance(count, int) and count > 0 and facts.get("tensorflow"):
        executable = facts.get("executable", "python3")
        warnings.append(f"its TensorFlow will not use its {count} GPU(s): {' and '.join(missing)} not found for "
                        f"{executable} (TensorFlow trains on the CPU then): run '{executable} -m pip install "
                        "\"tensorflow[and-cuda]\"' there")
    free = facts.get("disk_free")
    if isinstance(free, int) and free < LOW_SPACE_BYTES:
        warnings.append(f"only {size_words(free)} free on the disk of {REMOTE_ROOT} (a run's task folders, output "
                        "and checkpoints on an SSH or Slurm host): a full disk ends checkpoints and step records")
    logged_in = facts.get("logged_in")
    others = sorted(set(logged_in) - {facts.get("user")}) if isinstance(logged_in, list) else []
    if not others:
        return warnings
    return [*warnings, f"other users are logged in ({', '.join(others)}): the TensorFlow servers of a run here accept "
            "any connection to their ports, unauthenticated (see docs/security.md: a private network, a firewall "
            "or a network namespace of the run's own)"]


def tensorflow_mismatch(versions: Mapping[str, object], releases_only: bool = False) -> str | None:
    """A sentence when the hosts (label -> the TensorFlow version its Python imports; None or
    "present" when unknown: left out) do not all have the same TensorFlow (pure);
    ``releases_only``: only when they differ in more than a patch (2.21.0 and 2.21.1 agree)."""
    hosts_of: dict[str, list[str]] = {}
    for host, version in versions.items():
        if isinstance(version, str) and version != "present":
            hosts_of.setdefault(version, []).append(host)
    if len({".".join(v.split(".")[:2]) if releases_only else v for v in hosts_of}) < 2:
        return None
    parts = "; ".join(f"{version} on {', '.join(hosts)}"
                      for version, hosts in sorted(hosts_of.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    return (f"TensorFlow differs across the hosts ({parts}): the servers of one job must run the same TensorFlow "
            "(its ops and protocol change between versions)")


def with_mismatch(reports: Sequence[HostReport]) -> list[HostReport]:
    """``reports``, each reachable one noting :func:`tensorflow_mismatch` when there is one."""
    import dataclasses

    mismatch = tensorflow_mismatch({r.host: r.facts.get("tensorflow") for r in reports if r.reachable})
    if mismatch is None:
        return list(reports)
    return [dataclasses.replace(r, notes=(*r.notes, mismatch)) if r.reachable else r for r in reports]


def probe_transports(transports: Mapping[str, Transport], hosts: Sequence[Host],
                     quick_ports: Mapping[str, int] | None = None) -> list[HostReport]:
    """Probe every host in parallel; a host whose probe fails gets a report with its error.
    With ``quick_ports`` (host label -> port count), the launch-time probe, which also picks ports."""
    def one(host: Host) -> HostReport:
        count = None if quick_ports is None else quick_ports.get(host.label, 0)
        try:
            asked = time.time()
            facts = transports[host.label].probe(count)
            if isinstance(facts.get("time"), (int, float)):  # the host's clock, between our asking and its answer
                facts["clock_offset"] = [float(facts["time"]) - time.time(), float(facts["time"]) - asked]
            return HostReport(host.label, host.source, facts=facts, spec=host)
        except LaunchError as exc:
            return HostReport(host.label, host.source, error=exc.message, spec=host)
        except Exception as exc:  # noqa: BLE001 - a broken host is a report line, not a traceback
            return HostReport(host.label, host.source, error=f"{host.label}: probe failed: {exc}", spec=host)

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def require_usable(reports: Sequence[HostReport]) -> None:
    """Raise one :class:`LaunchError` naming every unusable host and why."""
    bad = [r for r in reports if not r.usable]
    if bad:
        lines = [f"{r.host} ({r.source}): {'; '.join(r.problems)}" for r in bad]
        raise LaunchError(f"{len(bad)} host(s) cannot run tasks:\n  " + "\n  ".join(lines),
                          "'ddlctl check' shows every host's Python, TensorFlow and GPUs")


def require_one_tensorflow(hosts: Sequence[Host], reports: Sequence[HostReport]) -> None:
    """Raise :class:`LaunchError` when the hosts of one job (``reports``: their probes; a local host
    without ``python=`` runs this Python) have different TensorFlow releases."""
    if len(hosts) < 2:
        return
    from ddlctl.host.probe import tensorflow_version

    probed = {r.host: r.facts.get("tensorflow") for r in reports}
    mine = tensorflow_version() if any(h.is_local and not h.python for h in hosts) else None
    mismatch = tensorflow_mismatch({h.label: probed.get(h.label, mine) for h in hosts}, releases_only=True)
    if mismatch is not None:
        raise LaunchError(mismatch, "install one TensorFlow version on every host (`python -m pip install "
                          "tensorflow==VERSION` where it differs), or give python= in the hosts file an "
                          "interpreter that has it; `ddlctl check` shows each host's")


def require_own_run_id(run_id: str, elsewhere: Mapping[str, Sequence]) -> None:
    """Refuse a run id that processes of another launch carry on a host (``elsewhere``: host ->
    [pid, command] its agent found): two launches of one id would end each other's processes and
    share their folders on remote hosts."""
    found = {host: found for host, found in elsewhere.items() if found}
    if not found:
        return
    where = "; ".join(f"{host}: " + ", ".join(f"pid {pid} ({command})" for pid, command in processes)
                      for host, processes in sorted(found.items()))
    raise ConfigError(f"run id {run_id} is in use: processes of another launch with it still run ({where})",
                      f"choose another --run-id (or leave it out: each run gets a fresh one); if they are "
                      f"leftovers of an ended run, `ddlctl stop {run_id}` ends them")
