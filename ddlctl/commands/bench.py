"""``ddlctl check --bench``: measured device speeds and links, saved as a cluster profile.

Per host, through its host agent (so ``cpu_quota=`` applies as it does to training tasks): the
matrix-multiply throughput of each device in the host's own TensorFlow (GPUs, else the CPU); the
controller-to-host link over the transport (round trip of an agent request; bandwidth of an 8 MiB
file written to and read back from the host); and, for every pair of hosts, a direct TCP link
(median ping round trip, bandwidth of a 32 MiB send) between two measurement tasks, the path
TensorFlow's own traffic takes. Devices are measured on all hosts at once (hosts that share a
machine then compete, as their tasks will while training).

The profile file (JSON, ``--save FILE``) is what ``launch --balance speed --speeds FILE`` reads, so
later runs need not measure again::

    {"kind": "ddlctl-cluster-profile", "version": 1, "created": ..., "source": "hosts.txt",
     "hosts": {"node1": {"speed": 171.5, "devices": [{"device": ..., "kind": "cpu", "gflops": ...}],
                         "latency_s": ..., "to_host_bytes_per_s": ..., "from_host_bytes_per_s": ...}},
     "links": [{"from": "node1", "to": "node2", "latency_s": ..., "bandwidth_bytes_per_s": ...}]}

``speed`` is the mean GFLOP/s of the host's devices (one device's speed: what a worker on it gets).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddlctl.contract.errors import ConfigError, LaunchError

PROFILE_KIND = "ddlctl-cluster-profile"
LINK_FILE_BYTES = 8 << 20
TASK_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HostProfile:
    """One host's measured figures."""

    speed: float  # mean GFLOP/s per device
    devices: tuple[dict, ...] = ()
    latency_s: float | None = None  # controller -> host agent round trip
    to_host_bytes_per_s: float | None = None
    from_host_bytes_per_s: float | None = None
    tensorflow: str | None = None


@dataclass(frozen=True)
class ClusterProfile:
    """Every host's figures and the host-to-host links."""

    hosts: Mapping[str, HostProfile]
    links: tuple[dict, ...] = ()
    source: str = ""
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict[str, object]:
        return {"kind": PROFILE_KIND, "version": 1, "created": self.created, "source": self.source,
                "hosts": {label: {**asdict(h), "devices": list(h.devices)} for label, h in self.hosts.items()},
                "links": list(self.links)}


def save_profile(profile: ClusterProfile, path: str | Path) -> None:
    """Write the profile as JSON (a clear error naming the path when that fails)."""
    try:
        Path(path).expanduser().write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    except OSError as exc:
        raise ConfigError(f"--save {path}: cannot write it: {exc.strerror or exc}") from None


def load_profile(path: str | Path) -> ClusterProfile:
    """Read a profile saved by ``ddlctl check --bench --save``; errors name the file and the fault."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the cluster profile: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})", "save one with: ddlctl check --bench --save FILE") from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND or not isinstance(data.get("hosts"), dict):
        raise ConfigError(f"{path}: not a ddlctl cluster profile", "save one with: ddlctl check --bench --save FILE")
    hosts = {}
    for label, raw in data["hosts"].items():
        try:
            speed = float(raw["speed"])
            if not speed > 0:
                raise ValueError
            hosts[label] = HostProfile(**{**raw, "speed": speed, "devices": tuple(raw.get("devices") or ())})
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: host {label!r} has no valid speed (a number > 0)") from None
    return ClusterProfile(hosts=hosts, links=tuple(data.get("links") or ()), source=str(data.get("source", "")),
                          created=str(data.get("created", "")))


def relative_speeds(profile: ClusterProfile, reference: str | None = None,
                    reference_gflops: float | None = None) -> dict[str, float]:
    """Each host's speed relative to ``reference_gflops`` (a device measured with the same kernel),
    else to host ``reference``'s (when the profile has it), else to the fastest."""
    speeds = [h.speed for h in profile.hosts.values()]
    base = reference_gflops or (profile.hosts[reference].speed if reference in profile.hosts else max(speeds))
    return {label: host.speed / base for label, host in profile.hosts.items()}


def typical_link(profile: ClusterProfile) -> tuple[float, float] | None:
    """(bandwidth bytes/s, latency s): the median of the measured host-to-host links, if any."""
    links = [link for link in profile.links if link.get("bandwidth_bytes_per_s") and link.get("latency_s") is not None]
    if not links:
        return None
    return (statistics.median(float(link["bandwidth_bytes_per_s"]) for link in links),
            statistics.median(float(link["latency_s"]) for link in links))


# -- measuring -------------------------------------------------------------------------------------


def _spec(host, name: str, argv: list[str], folder: str, like: Tasks | None):  # noqa: ANN001, ANN202
    from ddlctl.planning.plan import TaskSpec

    python = like.python(host) if like else host.python or (sys.executable if host.is_local else "python3")
    return TaskSpec(name=name, role="bench", index=0, host=host, port=None, kind="program",
                    argv=(python, "-m", "ddlctl.task.devbench", *argv),
                    env={"PYTHONUNBUFFERED": "1", **(like.env if like else {})},
                    unset_env=("TF_CONFIG",), workdir=host.workdir or (os.getcwd() if host.is_local else "~"),
                    task_dir=f"{folder}/{name.replace(':', '-')}", gpus=None, tf_config=None)


@dataclass(frozen=True)
class Tasks:
    """What a launch's tasks are started with (``launch --bench`` measures through the launch's own
    host agents): their environment and each host's Python. The device measurement, given them, is
    forked from the zygote the tasks then use (one TensorFlow import per host for both)."""

    env: Mapping[str, str]
    python: Callable[[object], str]  # Host -> the Python its tasks run under


class _Running:
    """A measurement task on a host and what it printed."""

    def __init__(self, session, spec) -> None:  # noqa: ANN001
        self.session = session
        self.task = session.start(spec, 2.0)
        self.output = b""

    def drain(self) -> None:
        while (chunk := self.task.read()):
            self.output += chunk

    def lines(self) -> list[dict]:
        self.drain()
        found = []
        for line in self.output.decode("utf-8", "replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def wait(self, timeout: float = TASK_TIMEOUT_S) -> dict:
        """The task's last JSON line once it exits (an error naming the host otherwise)."""
        self.session.wait_for(lambda: self.task.poll() is not None, timeout)
        status = self.task.poll()
        found = self.lines()
        if status is None or not status.ok or not found:
            if status is None:
                self.task.force_kill()
            tail = self.output.decode("utf-8", "replace").strip().splitlines()[-3:]
            what = "did not finish" if status is None else status.describe()
            raise LaunchError(f"{self.session.host.label}: measurement {self.task.spec.name} {what}"
                              + (": " + " | ".join(tail) if tail else ""))
        return found[-1]


def _controller_link(session, folder: str) -> dict[str, float]:  # noqa: ANN001
    trips = []
    for _ in range(5):
        start = time.perf_counter()
        session.list_files(folder)
        trips.append(time.perf_counter() - start)
    data = os.urandom(LINK_FILE_BYTES)
    path = f"{folder}/link.bin"
    start = time.perf_counter()
    session.write_file(path, data)
    to_host = len(data) / (time.perf_counter() - start)
    start = time.perf_counter()
    back = session.read_file(path)
    from_host = len(back) / (time.perf_counter() - start)
    if back != data:
        raise LaunchError(f"{session.host.label}: the test file came back different")
    return {"latency_s": statistics.median(trips), "to_host_bytes_per_s": to_host, "from_host_bytes_per_s": from_host}


def measure(sessions: Mapping[str, object], hosts, folders: Mapping[str, str], seconds: float,  # noqa: ANN001
            each: Callable, like: Tasks | None = None) -> ClusterProfile:
    """Measure ``hosts`` through their agents' ``sessions`` (``folders``: a scratch folder per host;
    ``each``: runs a function on every host in parallel, like ``fanout.each_host``; ``like``: the
    tasks whose environment and Python the measurements take)."""
    from ddlctl.planning.plan import address_of
    from ddlctl.transport.fanout import all_or_fail

    def devices(host) -> dict:  # noqa: ANN001
        return _Running(sessions[host.label], _spec(host, "bench:devices", ["devices", "--seconds", f"{seconds:g}"],
                                                    folders[host.label], like)).wait()

    def link(host) -> dict:  # noqa: ANN001
        return _controller_link(sessions[host.label], folders[host.label])

    measured = all_or_fail(each(hosts, devices), "measure the devices of", lambda _r: None)
    linked = all_or_fail(each(hosts, link), "measure the link to", lambda _r: None)
    links = []
    for i, source in enumerate(hosts):
        for target in hosts[i + 1:]:
            server = _Running(sessions[target.label], _spec(target, f"bench:serve-{i}", ["serve"],
                                                             folders[target.label], like))
            sessions[target.label].wait_for(lambda s=server: any("port" in d for d in s.lines())
                                            or s.task.poll() is not None, 60.0)
            ports = [d["port"] for d in server.lines() if "port" in d]
            if not ports:
                server.wait(1.0)  # raises with what it said
            client = _Running(sessions[source.label], _spec(
                source, f"bench:connect-{i}", ["connect", f"{address_of(target)}:{ports[0]}"], folders[source.label],
                like))
            result = client.wait()
            server.wait()
            links.append({"from": source.label, "to": target.label, "latency_s": result["latency_s"],
                          "bandwidth_bytes_per_s": result["bandwidth_bytes_per_s"]})
    profiles = {}
    for host in hosts:
        found = measured[host.label]
        speeds = [d["gflops"] for d in found["devices"]]
        profiles[host.label] = HostProfile(speed=sum(speeds) / len(speeds), devices=tuple(found["devices"]),
                                           tensorflow=found.get("tensorflow"), **linked[host.label])
    return ClusterProfile(hosts=profiles, links=tuple(links))


def measure_through(sessions: Mapping[str, object], hosts, run_id: str, scratch: Path,  # noqa: ANN001
                    seconds: float = 1.0, like: Tasks | None = None, keep: bool = False) -> ClusterProfile:
    """Measure ``hosts`` through host agents already started (``sessions``) in scratch folders of
    their own - under ``scratch`` on this machine, under ``REMOTE_ROOT/bench/RUN_ID`` on another
    (hosts may share a machine, or a home directory) - removed again afterwards (``keep``: those on
    this machine stay, a folder per measurement task with its output and ``pid.json``, less the
    link's test file)."""
    from ddlctl.planning.plan import REMOTE_ROOT
    from ddlctl.transport.fanout import each_host

    folders = {h.label: str(scratch / f"work-{i}") if h.is_local else f"{REMOTE_ROOT}/bench/{run_id}/{i}"
               for i, h in enumerate(hosts)}
    try:
        for host in hosts:
            sessions[host.label].write_file(f"{folders[host.label]}/.keep", b"")  # the scratch folder exists
        return measure(sessions, list(hosts), folders, seconds, each_host, like)
    finally:
        for host in hosts:
            if not host.is_local:  # nothing of the measurement stays on the host
                with contextlib.suppress(OSError):
                    sessions[host.label].prune(f"{REMOTE_ROOT}/bench/{run_id}")
            elif keep:
                Path(folders[host.label], "link.bin").unlink(missing_ok=True)
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def bench(hosts_file: str | None, template: str | None, ssh: object | None, seconds: float,
          allocation: object | None = None) -> ClusterProfile:
    """Reach every host of the cluster (or every node of a Slurm ``allocation``, through srun),
    start its agent and measure it (nothing left behind)."""
    from ddlctl.cluster.addresses import with_reachable_addresses
    from ddlctl.cluster.source import load_cluster
    from ddlctl.contract.runfolder import new_run_id
    from ddlctl.transport.fleet import (
        connection_source_address,
        make_transports,
        open_sessions,
        with_ssh_addresses,
    )

    cluster, _, _ = load_cluster(hosts_file, template, 1, allocation)  # type: ignore[arg-type]
    run_id = new_run_id("bench")
    scratch = Path(tempfile.mkdtemp(prefix="ddlctl-bench-"))
    transports = make_transports(cluster, ssh, allocation)  # type: ignore[arg-type]
    sessions: dict = {}
    try:
        cluster = with_ssh_addresses(cluster, transports)
        cluster = with_reachable_addresses(cluster, connection_source_address(transports))
        sessions = open_sessions(transports, cluster.hosts, run_id, scratch / "agents", {})
        profile = measure_through(sessions, cluster.hosts, run_id, scratch / "work", seconds)
        return ClusterProfile(hosts=profile.hosts, links=profile.links, source=cluster.source)
    finally:
        for session in sessions.values():
            session.shutdown()
            session.close()
        for transport in transports.values():
            transport.close()
        shutil.rmtree(scratch, ignore_errors=True)
