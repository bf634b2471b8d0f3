"""Local transport: this machine's host agent is a subprocess; probes run the local Python."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import LaunchError
from ddlctl.host.ports import free_ports
from ddlctl.transport.agentcmd import AUTOLOAD_DIR, agent_argv, launch_key, own_python_env
from ddlctl.transport.session import HostSession
from ddlctl.transport.streams import SocketStream


class LocalTransport:
    """Runs tasks on this machine."""

    def __init__(self, host: Host, python: str | None = None) -> None:
        self.host = host
        # The host agent needs ddlctl: run it with the controller's own interpreter.
        self.python = python or sys.executable

    def free_ports(self, count: int) -> list[int]:
        return free_ports(count)

    def open_session(self, run_id: str, log_dir: Path, ports: int | None = None) -> HostSession:
        """Start this host's agent as a local subprocess (its stderr goes to ``log_dir``)."""
        try:
            return open_local_session(self.host, run_id, log_dir, self.python, ports)
        except OSError as exc:
            raise LaunchError(f"{self.host.label}: cannot start the ddlctl host agent ({self.python}): {exc}") from None

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts from ``ddlctl.host.probe`` run by the host's Python (this ddlctl on its path);
        with ``quick_ports``, the cheap launch-time probe that also picks that many free ports."""
        python = self.host.python or self.python
        extra = [] if quick_ports is None else ["--quick", str(quick_ports)]
        try:
            done = subprocess.run([python, "-m", "ddlctl.host.probe", *extra], capture_output=True, text=True,
                                  timeout=60, env=own_python_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"{self.host.label}: cannot run {python!r}: {exc}",
                              f"fix python= for this host ({self.host.source})") from None
        if done.returncode != 0:
            raise LaunchError(f"{self.host.label}: {python!r} failed to run the host probe: "
                              f"{done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)

    def address(self) -> str | None:
        return None

    def source_address(self) -> str | None:
        return None

    def reopen(self, run_id: str, log_dir: Path) -> HostSession:
        """A new local agent (the old one was cut off)."""
        return self.open_session(run_id, log_dir)

    def close(self) -> None:
        pass


def open_local_session(host: Host, run_id: str, log_dir: Path, python: str | None = None,
                       ports: int | None = None) -> HostSession:
    """Start a host agent on this machine (a subprocess in its own session)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = log_dir / f"hostagent-{host.label.replace('/', '_')}.log"
    # the agent's environment is its tasks' base
    env = {**own_python_env(), envvars.RUN_ID: run_id, envvars.LAUNCH: launch_key()}
    mine, theirs = socket.socketpair()  # (not pipes: see SocketStream)
    try:
        with open(stderr_path, "ab") as stderr:
            popen = subprocess.Popen(agent_argv(python or sys.executable, run_id, ports),
                                     stdin=theirs, stdout=theirs, stderr=stderr, env=env, close_fds=True)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    # ddlctl is importable by this interpreter: tasks need only the instrumentation folder.
    session = HostSession(host, SocketStream(popen, mine, stderr_path), [str(AUTOLOAD_DIR)],
                          python or sys.executable)
    session.await_hello()
    return session
