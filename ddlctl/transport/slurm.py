"""Slurm transport: each node's host agent runs as one ``srun`` job step of the allocation.

The agent's step holds every CPU and GPU the job has on its node (``--overlap`` lets probe steps
run beside it); the agent starts, watches and restarts that node's tasks inside its step, exactly
as it does over SSH, so Slurm accounts for every process and ``scancel`` (proctrack) kills them
all. The step's stdin and stdout are the agent's stream; its stderr (srun's and slurmstepd's
messages too) goes to the run's ``agents/`` folder. ddlctl's code reaches nodes the same way as SSH
hosts (a content-addressed zip under ``~/.ddlctl``), so no shared file system is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.cluster.slurm import Allocation, Node, describe_job_end, job_state
from ddlctl.contract import envvars
from ddlctl.contract.errors import HostGoneError, LaunchError
from ddlctl.transport.remote import (
    NEED_CODE_EXIT,
    RUN_BUNDLED,
    UPLOAD_BUNDLE,
    bundle_path,
    bundled_agent_argv,
    code_bundle,
    start_bundled_agent,
    upload_args,
)
from ddlctl.transport.session import HostSession
from ddlctl.transport.streams import PipeStream


def step_name(run_id: str) -> str:
    """The name of a run's agent steps (``ddlctl stop`` finds them by it, reconnections included)."""
    return f"ddlctl-{run_id}"


def srun_argv(job_id: str, node: Node, argv: Sequence[str], run_id: str | None = None) -> list[str]:
    """The ``srun`` command that runs ``argv`` as one task of a new step of job ``job_id`` on
    ``node`` (pure). With ``run_id``: the host agent's step of that run, which gets every CPU and
    GPU the job has there (its children are the training tasks); otherwise a one-CPU step (probes,
    uploads). ``--overlap`` lets the steps share the node; ``--cpu-bind=none`` keeps a task plugin
    from pinning the agent (and so every task it starts) to one core."""
    whole_node = run_id is not None
    command = ["srun", f"--jobid={job_id}", f"--nodelist={node.name}", "--nodes=1", "--ntasks=1", "--overlap",
               "--quiet", f"--job-name={step_name(run_id) if run_id else 'ddlctl-probe'}"]
    if whole_node:
        command += [f"--cpus-per-task={max(1, node.cpus)}", "--cpu-bind=none"]
        if node.gpus:
            command.append(f"--gres=gpu:{node.gpus}")
    else:
        command.append("--cpus-per-task=1")
    return command + list(argv)


def no_srun() -> LaunchError:
    """The error for a machine without Slurm's client commands."""
    return LaunchError("--slurm: srun is not on PATH", "run ddlctl where the Slurm client commands are installed")


class SrunStream(PipeStream):
    """An agent's ``srun`` process as a stream; ``abandon`` cancels its step (a stopped agent
    takes no signal from srun, so the step is killed through Slurm)."""

    def __init__(self, popen: subprocess.Popen[bytes], stderr_path: Path, env: Mapping[str, str],
                 job_id: str, offset: int = 0) -> None:
        super().__init__(popen, stderr_path)
        self.step: str | None = None
        self.env = dict(env)
        self.job_id = job_id
        self._offset = offset  # the log is per node and outlives steps: this step's part starts here

    def errors(self) -> str:
        assert self.stderr_path is not None
        with contextlib.suppress(OSError), self.stderr_path.open("rb") as handle:
            handle.seek(self._offset)
            return handle.read()[-2000:].decode("utf-8", "replace")
        return ""

    def abandon(self) -> None:
        if self.step:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", "--quiet", "--signal=KILL", self.step], env=self.env,
                               capture_output=True, timeout=15)
        super().abandon()

    def ended(self) -> str:
        """Why the step ended as Slurm tells it (the job's state when it has ended, what slurmstepd
        or srun said), for messages."""
        said = [line.strip() for line in self.errors().splitlines()
                if "CANCELLED" in line or "srun: error" in line or "DUE TO" in line or "slurmstepd" in line]
        parts = said[-1:]
        with contextlib.suppress(Exception):  # a message, never a new failure
            state, _, _ = job_state(self.job_id, self.env, timeout=5)
            deadline = time.monotonic() + 2.0
            while state == "COMPLETING" and time.monotonic() < deadline:  # its final state comes soon
                time.sleep(0.2)
                state, _, _ = job_state(self.job_id, self.env, timeout=5)
            if state not in ("RUNNING", "SUSPENDED"):
                parts.insert(0, describe_job_end(self.job_id, state))
        return "; ".join(parts)


class SlurmTransport:
    """Runs one node's tasks through srun job steps of ``allocation``."""

    def __init__(self, host: Host, allocation: Allocation, env: Mapping[str, str] | None = None) -> None:
        self.host = host
        self.allocation = allocation
        self.node = allocation.node(host.name)
        self.env = dict(os.environ if env is None else env)
        self._bundle: str | None = None

    @property
    def python(self) -> str:
        return self.host.python or "python3"

    def _srun(self, argv: Sequence[str], data: bytes = b"", timeout: float = 60.0) -> tuple[int, bytes, str]:
        """Run a short command in a one-CPU step on the node: (exit status, stdout, stderr)."""
        try:
            done = subprocess.run(srun_argv(self.allocation.job_id, self.node, argv), input=data,
                                  capture_output=True, timeout=timeout, env=self.env, start_new_session=True)
        except FileNotFoundError:
            raise no_srun() from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{self.host.label}: srun did not finish within {timeout:g}s "
                              f"(job {self.allocation.job_id})") from None
        return done.returncode, done.stdout, done.stderr.decode("utf-8", "replace")

    def ensure_bundle(self) -> str:
        """Put ddlctl's code zip on the node unless this exact version is there; its path."""
        _, data = code_bundle()
        status, out, err = self._srun(["sh", "-c", UPLOAD_BUNDLE, "sh", *upload_args(data, self.python)],
                                      data=data, timeout=120)
        if status != 0 or not out.startswith(b"/"):
            raise LaunchError(f"{self.host.label}: cannot copy ddlctl's code to {bundle_path()} through srun: "
                              f"{err.strip()[-300:]}", "check the disk and permissions of ~/.ddlctl on that node")
        self._bundle = out.decode()
        return self._bundle

    def check_job(self) -> None:
        """Raise :class:`HostGoneError` when the allocation has ended (nothing can start again)."""
        state, _, _ = job_state(self.allocation.job_id, self.env, timeout=15)
        if state not in ("RUNNING", "SUSPENDED", "COMPLETING"):
            raise HostGoneError(describe_job_end(self.allocation.job_id, state))

    def open_session(self, run_id: str, log_dir: Path, ports: int | None = None) -> HostSession:
        """Start this node's agent as a job step; with ``ports``, its hello carries the launch-time
        probe (free ports on that node). The code bundle is uploaded, and the agent started again,
        when the node does not have it yet."""
        log_dir.mkdir(parents=True, exist_ok=True)
        stderr_path = log_dir / f"hostagent-{self.host.label.replace('/', '_')}.log"
        streams: list[SrunStream] = []

        def start() -> tuple[SrunStream, Callable[[], bool]]:
            argv = srun_argv(self.allocation.job_id, self.node, bundled_agent_argv(self.python, run_id, ports),
                             run_id)
            offset = stderr_path.stat().st_size if stderr_path.exists() else 0
            with open(stderr_path, "ab") as stderr:
                try:
                    popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                             env=self.env, close_fds=True, start_new_session=True)
                except FileNotFoundError:
                    raise no_srun() from None
            streams.append(SrunStream(popen, stderr_path, self.env, self.allocation.job_id, offset))

            def needs_code() -> bool:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(5)
                return popen.returncode == NEED_CODE_EXIT

            return streams[-1], needs_code

        try:
            session, self._bundle = start_bundled_agent(self.host, self.python, start, self.ensure_bundle,
                                                        self._bundle, require_bundle=False)
        except LaunchError as exc:
            if "not found on the host" in exc.message:
                raise LaunchError(f"{self.host.label}: Python {self.python!r} not found on node {self.node.name} "
                                  f"(job {self.allocation.job_id}): give the nodes' Python with --python PATH",
                                  "--python PATH") from None
            raise LaunchError(f"{exc.message} [srun step on node {self.node.name} of job "
                              f"{self.allocation.job_id}]", exc.hint) from None
        streams[-1].step = (session.hello or {}).get("slurm_step")
        return session

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts from ``ddlctl.host.probe`` run by the node's Python in a step of the job."""
        extra = [] if quick_ports is None else ["--quick", str(quick_ports)]
        argv = ["sh", "-c", RUN_BUNDLED, "sh", bundle_path(), "env", f"{envvars.SAFE_PATH}=1", self.python, "-m",
                "ddlctl.host.probe", *extra]
        status, out, err = self._srun(argv)
        if status == NEED_CODE_EXIT:
            self.ensure_bundle()
            status, out, err = self._srun(argv)
        if status == 127 or "No such file" in err:
            raise LaunchError(f"{self.host.label}: Python {self.python!r} not found on node {self.node.name}",
                              "give the nodes' interpreter with --python (ddlctl runs its own by default)")
        lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
        if status == 0 and lines:
            with contextlib.suppress(ValueError):
                return json.loads(lines[-1])
        raise LaunchError(f"{self.host.label}: the host probe failed through srun (exit {status}): "
                          f"{err.strip()[-300:]}")

    def free_ports(self, count: int) -> list[int]:
        return [int(p) for p in self.probe(quick_ports=count)["ports"]]  # type: ignore[union-attr]

    def address(self) -> str | None:
        return None

    def source_address(self) -> str | None:
        return None

    def reopen(self, run_id: str, log_dir: Path) -> HostSession:
        """A new agent step on the node, while the job still runs (HostGoneError once it has ended)."""
        self.check_job()
        return self.open_session(run_id, log_dir)

    def close(self) -> None:
        pass


def slurm_transports(hosts: Sequence[Host], allocation: Allocation) -> dict[str, SlurmTransport]:
    """One transport per node of the allocation."""
    return {host.label: SlurmTransport(host, allocation) for host in hosts}
