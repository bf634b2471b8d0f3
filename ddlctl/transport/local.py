"""Local transport: tasks are subprocesses of this machine, each behind a watchdog."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.errors import LaunchError
from ddlctl.planning.plan import TaskSpec
from ddlctl.runtime.probe import free_ports
from ddlctl.transport.base import ExitStatus

#: Folder with the sitecustomize that installs the model.fit hook (``--auto-steps``).
AUTOLOAD_DIR = Path(__file__).resolve().parents[1] / "instrument" / "autoload"


def watchdog_argv(python: str, grace_s: float, pidfile: str | None, argv: tuple[str, ...]) -> list[str]:
    """The command line that runs ``argv`` under ddlctl's watchdog."""
    cmd = [python, "-m", "ddlctl.runtime.watchdog", "--grace", f"{grace_s:g}"]
    if pidfile:
        cmd += ["--pidfile", pidfile]
    return [*cmd, "--", *argv]


class LocalProcess:
    """A task started with :class:`subprocess.Popen`; output is one combined pipe."""

    def __init__(self, spec: TaskSpec, popen: subprocess.Popen[bytes]) -> None:
        self.spec = spec
        self.popen = popen
        assert popen.stdout is not None and popen.stdin is not None
        self._out = popen.stdout.fileno()
        os.set_blocking(self._out, False)

    def fileno(self) -> int:
        return self._out

    def read(self) -> bytes | None:
        try:
            return os.read(self._out, 65536)
        except BlockingIOError:
            return None

    def poll(self) -> ExitStatus | None:
        rc = self.popen.poll()
        return None if rc is None else ExitStatus.from_returncode(rc)

    def send(self, sig: str) -> None:
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write(sig.encode() + b"\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # watchdog already gone

    def force_kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def pids(self) -> dict[str, object]:
        return {"watchdog_pid": self.popen.pid, "watchdog_pgid": self.popen.pid}

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


class LocalTransport:
    """Runs tasks on this machine."""

    def __init__(self, host: Host, python: str | None = None) -> None:
        self.host = host
        # The watchdog needs ddlctl: run it with the controller's own interpreter.
        self.python = python or sys.executable

    def free_ports(self, count: int) -> list[int]:
        return free_ports(count)

    def start(self, spec: TaskSpec, grace_s: float) -> LocalProcess:
        workdir = Path(spec.workdir)
        if not workdir.is_dir():
            raise LaunchError(f"{spec.name} on {self.host.label}: working directory "
                              f"{spec.workdir!r} does not exist",
                              f"create it or fix workdir= ({self.host.source})")
        task_dir = Path(spec.task_dir)
        task_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in spec.unset_env:
            env.pop(key, None)
        env.update(spec.env)
        if spec.env.get("DDLCTL_AUTO_STEPS") == "1":
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AUTOLOAD_DIR), env.get("PYTHONPATH")) if p)
        argv = watchdog_argv(self.python, grace_s, str(task_dir / "pid.json"), spec.argv)
        try:
            popen = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                cwd=workdir, env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LaunchError(f"{spec.name} on {self.host.label}: cannot start the watchdog "
                              f"({self.python}): {exc}") from None
        return LocalProcess(spec, popen)

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts from ``ddlctl.runtime.probe`` run by the host's Python (this ddlctl on its path);
        with ``quick_ports``, the cheap launch-time probe that also picks that many free ports."""
        python = self.host.python or self.python
        extra = [] if quick_ports is None else ["--quick", str(quick_ports)]
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": package_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:
            done = subprocess.run([python, "-m", "ddlctl.runtime.probe", *extra], capture_output=True, text=True,
                                  timeout=60, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"{self.host.label}: cannot run {python!r}: {exc}",
                              f"fix python= for this host ({self.host.source})") from None
        if done.returncode != 0:
            raise LaunchError(f"{self.host.label}: {python!r} failed to run the host probe: "
                              f"{done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)

    def port_open(self, port: int) -> bool:
        try:
            with socket.create_connection(("localhost", port), timeout=0.5):
                return True
        except OSError:
            return False

    def close(self) -> None:
        pass
