"""Local transport: this machine's host agent is a subprocess; probes run the local Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.contract.errors import LaunchError
from ddlctl.host.ports import free_ports
from ddlctl.transport.session import HostSession, open_local_session, own_python_env


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
