"""The fleet of a run: every host reached through its transport, one host agent session each.

Connecting (SSH connections opened in parallel, srun steps, local subprocesses), starting the host
agents, reconnecting to a host after a loss, bringing the remote tasks' files back and closing
everything live here, for every transport.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import signal
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract import envvars
from ddlctl.contract.diskspace import write_failure
from ddlctl.contract.errors import LaunchError
from ddlctl.planning.plan import REMOTE_ROOT, Plan, TaskSpec
from ddlctl.transport.agentcmd import launch_key
from ddlctl.transport.base import Transport
from ddlctl.transport.fanout import all_or_fail, each_host
from ddlctl.transport.local import LocalTransport
from ddlctl.transport.session import HostSession

if TYPE_CHECKING:
    from ddlctl.cluster.slurm import Allocation
    from ddlctl.transport.options import SshOptions


def make_transports(cluster: Cluster, ssh: SshOptions | None,
                    allocation: Allocation | None = None) -> dict[str, Transport]:
    """One transport per host: local subprocesses, srun steps of a Slurm ``allocation``, or one SSH
    connection per remote host (opened in parallel; one error message names every host that could
    not be reached)."""
    if allocation is not None:
        from ddlctl.transport.slurm import slurm_transports

        return dict(slurm_transports(cluster.hosts, allocation))
    transports: dict[str, Transport] = {h.label: LocalTransport(h) for h in cluster.hosts if h.is_local}
    remote = [h for h in cluster.hosts if not h.is_local]
    if remote:
        from ddlctl.transport.options import SshOptions
        from ddlctl.transport.ssh import SshTransport, connect_all

        connections = connect_all(remote, ssh or SshOptions())
        transports.update({label: SshTransport(conn, ssh) for label, conn in connections.items()})
    return transports


def with_ssh_addresses(cluster: Cluster, transports: dict[str, Transport]) -> Cluster:
    """Record each SSH host's real address (``HostName`` from ~/.ssh/config) for TF_CONFIG."""
    hosts = []
    for host in cluster.hosts:
        transport = transports.get(host.label)
        address = transport.address() if transport is not None else None
        if address is not None and address != host.name:
            host = dataclasses.replace(host, address=address)
        hosts.append(host)
    return dataclasses.replace(cluster, hosts=tuple(hosts))


def connection_source_address(transports: dict[str, Transport]) -> str | None:
    """This machine's address on its SSH connection to the first remote host (what that host sees)."""
    for transport in transports.values():
        address = transport.source_address()
        if address is not None:
            return address
    return None


@dataclass
class Connected:
    """Every host of a run as reached: its transport (probes, files) and its host agent's session."""

    transports: dict[str, Transport]
    sessions: dict[str, HostSession] = field(default_factory=dict)
    allocation: Allocation | None = None  # --slurm: the job the tasks run in

    def close(self) -> None:
        """Ask every agent to stop its tasks and leave; release the connections."""
        for session in self.sessions.values():
            session.shutdown()
            session.close()
        for transport in self.transports.values():
            transport.close()


def open_sessions(transports: Mapping[str, Transport], hosts: Sequence[Host], run_id: str, log_dir: Path,
                  ports: Mapping[str, int]) -> dict[str, HostSession]:
    """One host agent per host, started in parallel, each saying in its hello whether the host can
    run tasks and which ``ports[label]`` ports are free there (one process start per host). One
    error names every host whose agent did not start (the others are closed again)."""
    results = each_host(hosts, lambda host: transports[host.label].open_session(run_id, log_dir,
                                                                                 ports.get(host.label, 0)))
    return all_or_fail(results, "start ddlctl's host agent on", HostSession.close)


def reconnector(plan: Plan, transports: dict[str, Transport]):  # noqa: ANN201
    """A function that reaches a host whose connection was lost again and starts a new agent there."""

    def reconnect(label: str) -> HostSession:
        return transports[label].reopen(plan.run_id, Path(plan.run_dir) / "agents")

    return reconnect


def reopen_lost(plan: Plan, transports: Mapping[str, Transport], sessions: dict[str, HostSession]) -> dict[str, str]:
    """Once the job has ended: a new agent on each SSH host whose agent's session was lost and not
    reconnected (the agent killed, the connection dropped), to bring its task folders back; put
    in ``sessions``. The hosts that could not be reached, with why (their files are said missing)."""
    lost = [host for host in plan.hosts if (session := sessions.get(host.label)) is not None and session.lost
            and _sweepable(transports, host.label)]
    reached = each_host(lost, lambda host: transports[host.label].reopen(plan.run_id, Path(plan.run_dir) / "agents"))
    sessions.update({label: session for label, session in reached.items() if isinstance(session, HostSession)})
    return {label: error.message for label, error in reached.items() if isinstance(error, LaunchError)}


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (a stream read as it arrives)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        while not self.rest:
            piece = next(self.chunks, None)
            if piece is None:
                return 0
            self.rest = piece
        size = min(len(buffer), len(self.rest))
        buffer[:size] = self.rest[:size]
        self.rest = self.rest[size:]
        return size


def collect_remote_files(plan: Plan, sessions: Mapping[str, HostSession]) -> list[str]:
    """Bring remote tasks' step, result, error and pid files into the local run directory, through
    the host agents (one tar each, every host in parallel, no process started); once every host's
    files are back, remove the run's folder on the hosts (its checkpoints stay there). Hosts may
    share a home folder (NFS): nothing is removed while any host's files are missing. A host that
    cannot be reached, or whose files this machine's disk cannot take, keeps them: a sentence for
    each such host is returned (none half-copied is left here)."""
    tasks_of: dict[str, list[TaskSpec]] = {}
    for task in plan.tasks:
        if not task.host.is_local and task.host.label in sessions:
            tasks_of.setdefault(task.host.label, []).append(task)
    hosts = [h for h in plan.hosts if h.label in tasks_of]
    if not hosts:
        return []
    local_root = Path(plan.run_dir) / "tasks"

    def collect(host: Host) -> None:
        tasks = {t.dir_name: t.task_dir for t in tasks_of[host.label]}
        stream = ChunkReader(sessions[host.label].pack_chunks(tasks))
        with tarfile.open(fileobj=stream, mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:  # as the agent writes the tar: no file is held whole
                folder, _, name = member.name.partition("/")
                if not member.isfile() or folder not in tasks or not name or "/" in name or name in (".", ".."):
                    continue  # only plain files of the asked folders, whatever the host sent
                source = archive.extractfile(member)
                if source is not None:
                    (local_root / folder).mkdir(parents=True, exist_ok=True)
                    try:
                        with open(local_root / folder / name, "wb") as target:
                            shutil.copyfileobj(source, target, 1 << 20)
                    except OSError as exc:  # (this machine's disk is full: nothing half-copied stays)
                        (local_root / folder / name).unlink(missing_ok=True)
                        raise LaunchError(write_failure(local_root / folder / name, exc)) from None

    remote_run = f"{REMOTE_ROOT}/runs/{plan.run_id}"
    failed = {label: r for label, r in each_host(hosts, collect).items() if isinstance(r, LaunchError)}
    if not failed:
        each_host(hosts, lambda host: sessions[host.label].prune(remote_run, keep=("checkpoints",)))
    return [f"the files of {label}'s task folders did not come back "
            f"({error.message}): they stay in {remote_run} there" for label, error in failed.items()]


def end_leftovers(plan: Plan) -> str | None:
    """The job has ended and this machine's host agents with it: a process here that still carries
    the run's id is a leftover (a daemon a task started outside its process group, whose host agent
    was killed before it could end it). SIGKILL them; a sentence naming them, or None."""
    if not any(host.is_local for host in plan.cluster.hosts):
        return None
    from ddlctl.host.killrun import undying
    from ddlctl.host.procs import command_line, processes_with

    ended = []
    # (its task folders here are the run's own: another run given the same --run-id is not touched;
    # its tasks, dying with their agent, may not have had their turn on a CPU yet: waited for)
    folder = f"{envvars.TASK_DIR}={Path(plan.run_dir).expanduser()}/"
    for pid in undying(lambda: processes_with([f"{envvars.RUN_ID}={plan.run_id}"], starting=folder)):
        command = command_line(pid, 60)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        ended.append(f"{pid} ({command})")
    if not ended:
        return None
    return (f"ended {len(ended)} process(es) of this run still running on this machine after its tasks and host agents "
            f"had ended (started by a task outside its process group): {', '.join(ended)}")


def end_remote_leftovers(plan: Plan, transports: Mapping[str, Transport], lost: Sequence[str],
                         unreached: Mapping[str, str]) -> list[str]:
    """Once the job has ended: on each remote host of ``lost`` (its agent's session ended
    unexpectedly: the agent killed, the connection dropped), SIGKILL what this launch left running
    there (a task's daemon started outside its process group, which only its agent could end).
    ``unreached``: hosts just found unreachable, with why (not tried again). A sentence per host
    where something was ended or that could not be reached."""
    lost_labels = set(lost)
    remote = [host for host in plan.cluster.hosts if host.label in lost_labels and _sweepable(transports, host.label)]

    def sweep(host: Host) -> str | None:
        problem = unreached.get(host.label)
        if problem is None:
            try:
                ended = transports[host.label].end_leftovers(plan.run_id, launch_key())  # type: ignore[attr-defined]
            except LaunchError as exc:
                problem = exc.message
            else:
                return (f"ended {len(ended)} process(es) of this run still running on {host.label} after its host "
                        f"agent was lost (started by a task outside its process group): {', '.join(ended)}") \
                    if ended else None
        return (f"could not reach {host.label} to end what this run may have left running there ({problem}): "
                f"ddlctl stop {plan.run_dir}")

    return [line if isinstance(line, str) else line.message for line in each_host(remote, sweep).values() if line]


def _sweepable(transports: Mapping[str, Transport], label: str) -> bool:
    """Whether ``label``'s transport can reach its host again after its agent is lost (SSH)."""
    return hasattr(transports.get(label), "end_leftovers")
