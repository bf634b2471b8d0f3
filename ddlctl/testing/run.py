"""Run the real ``ddlctl`` command and find the processes a run left behind (tests and benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from ddlctl.host.killrun import agents_of

#: The source checkout this package runs from (the tests and benchmarks run ddlctl there).
ROOT = Path(__file__).resolve().parents[2]



def ddlctl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddlctl", *args]


def run_ddlctl(*args: str, timeout: float = 300, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ddlctl ARGS`` to completion, capturing stdout and stderr separately."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(ddlctl_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or ROOT, env=full_env)


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``DDLCTL_RUN_ID=run_id`` (tasks) or whose command
    line is a host agent's of that run (sealed, its environment is not ours to read)."""
    found, agents = [], set(agents_of(run_id))
    for proc in psutil.process_iter(["pid"]):
        try:
            ours = proc.pid in agents or proc.environ().get("DDLCTL_RUN_ID") == run_id
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def only_run_dir(root: Path) -> Path:
    """The single run directory created under ``root``."""
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]
