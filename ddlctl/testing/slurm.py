"""A real Slurm cluster on this machine: one ``slurmctld`` and three ``slurmd`` (``n1``-``n3``).

Debian 12's Slurm 22.05 is built with ``MULTIPLE_SLURMD``: every node has ``NodeHostname`` = this
machine and a port of its own, and is started with ``slurmd -N nX``. Each node's ``NodeAddr`` is a
loopback address of its own (127.0.0.2, .3, .4): a node's address differs from its name, as on
many real clusters. Slurm 22.05 has no ``auth/slurm``, so a private ``munged`` (generated key,
socket in the temporary folder) authenticates; clients find it through ``SLURM_CONF``.
``proctrack/cgroup`` (cgroup v1 here) makes ``scancel`` kill every process of a step, also those
that left its process group. Nothing is installed or changed outside the temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NODES = ("n1", "n2", "n3")
ADDRESSES = {"n1": "127.0.0.2", "n2": "127.0.0.3", "n3": "127.0.0.4"}
CPUS_PER_NODE = 4


def unavailable_reason() -> str | None:
    """Why a Slurm cluster cannot be started here (None: it can)."""
    missing = [p for p in ("slurmctld", "slurmd", "srun", "sbatch", "salloc", "scontrol", "munged")
               if not (shutil.which(p) or Path(f"/usr/sbin/{p}").exists())]
    if missing:
        return ("Slurm is not installed (missing " + ", ".join(missing) + "): apt-get install "
                "--no-install-recommends slurmctld slurmd slurm-client munge")
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd runs jobs as their user)"
    if not Path("/sys/fs/cgroup/freezer").is_dir():
        return "proctrack/cgroup needs the cgroup v1 freezer controller (/sys/fs/cgroup/freezer)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    """The running cluster; ``env`` is what a client (srun, salloc, ddlctl) needs."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def start(self) -> None:
        root = self.root
        for sub in ("state", "log", *(f"spool-{n}" for n in NODES)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = root / "munge.sock"
        self._spawn([_binary("munged"), "--foreground", "--force", f"--socket={socket_path}",
                     f"--key-file={key}", f"--pid-file={root / 'munged.pid'}",
                     f"--log-file={root / 'log' / 'munged.log'}", f"--seed-file={root / 'munge.seed'}"],
                    "munged")
        self._wait(lambda: socket_path.exists(), "munged did not create its socket")
        host = socket.gethostname()
        ctl_port = _free_port()
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr={ADDRESSES[n]} Port={_free_port()} "
                          f"CPUs={CPUS_PER_NODE} State=UNKNOWN" for n in NODES)
        self.conf.write_text(f"""\
ClusterName=ddlctltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctl_port}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MessageTimeout=10
InactiveLimit=0
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")
        (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
                                          "ConstrainCores=no\nConstrainDevices=no\nConstrainRAMSpace=no\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NODELIST", "SLURM_JOB_NODELIST"):
            self.env.pop(name, None)
        self._spawn([_binary("slurmctld"), "-D", "-i"], "slurmctld")
        for node in NODES:
            self._spawn([_binary("slurmd"), "-D", "-N", node], f"slurmd-{node}")
        self._wait(self._nodes_idle, "the Slurm nodes did not become idle", timeout=30)

    def _spawn(self, argv: list[str], name: str) -> None:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - kept by the child
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                               env=env, start_new_session=True))
        log.close()

    def _wait(self, ready, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if ready():
                    return
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{what}: {dead} exited; logs in {self.root / 'log'}")
            time.sleep(0.1)
        raise RuntimeError(f"{what} within {timeout:g}s; logs in {self.root / 'log'}")

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in NODES)

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout)

    def jobs(self) -> list[str]:
        """Ids of the jobs still known and not finished."""
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return out.split()

    def cancel_all(self) -> None:
        """Cancel every job (between tests) and wait until the nodes are idle again."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--user=root")
            self._wait(lambda: not self.jobs() and self._nodes_idle(), "jobs did not end", timeout=60)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--user=root", timeout=10)
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, 9)
                process.wait(5)
