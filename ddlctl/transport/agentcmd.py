"""How a host agent is started and told to start a task: its command line (with the run id and
this launch's key), the environment of ddlctl's own Python processes, a task's start command."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import LaunchError
from ddlctl.planning.plan import TaskSpec

#: Folder with the sitecustomize that installs the model.fit hook and the stack dumper.
AUTOLOAD_DIR = Path(__file__).resolve().parents[1] / "task" / "instrument" / "autoload"


def own_python_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ddlctl's own Python processes on this machine: this ddlctl first on
    ``PYTHONPATH`` (it need not be installed), no empty entry (Python reads one as the current
    directory) and :data:`envvars.SAFE_PATH` (nothing from the working directory either)."""
    environ = os.environ if environ is None else environ
    package_root = str(Path(__file__).resolve().parents[2])
    path = [package_root, *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_root)]
    return {**environ, "PYTHONPATH": os.pathsep.join(path), envvars.SAFE_PATH: "1"}


def task_command(spec: TaskSpec, grace_s: float, pythonpath: Sequence[str]) -> dict[str, object]:
    """What the agent needs to start ``spec`` (sent over the agent's stdin, never in argv)."""
    paths = list(pythonpath)
    if spec.kind == "agent":  # the telemetry agent needs ddlctl's code, not the instrumentation
        paths = paths[1:]
    return {"argv": list(spec.argv), "env": dict(spec.env), "unset": list(spec.unset_env),
            "cwd": spec.workdir, "cwd_default": spec.host.workdir is None and spec.kind != "agent",
            "task_dir": spec.task_dir, "grace": grace_s, "pythonpath": paths,
            "mkdirs": [spec.task_dir], "port": spec.port or 0,
            "cpu_quota": spec.host.cpu_quota if spec.kind != "agent" else None,
            "cpus": list(spec.host.cpus) if spec.host.cpus and spec.kind != "agent" else None}


def no_python(host: Host, python: str) -> LaunchError:
    """The error for a host without the Python ddlctl was told to use there."""
    return LaunchError(f"{host.label}: Python {python!r} not found on the host",
                       f"install Python 3.10+ there, or set python= for this host ({host.source})")


def agent_argv(python: str, run_id: str, ports: int | None) -> list[str]:
    """The command that starts a host agent of run ``run_id`` and this launch (with ``ports``: its
    hello carries the quick probe). Run and launch are on its command line for ``killrun``, which
    cannot read a sealed agent's environment."""
    return [python, "-m", "ddlctl.host.agent", "--run", run_id, "--launch", launch_key(),
            *([] if ports is None else ["--ports", str(ports)])]


#: This process's launch key (made once, at import: host agents are opened from several threads at once).
_LAUNCH_KEY = secrets.token_hex(8)


def launch_key() -> str:
    """This launch's key (:data:`ddlctl.contract.envvars.LAUNCH`): the same for every host agent it starts."""
    return _LAUNCH_KEY
