"""Causing faults for real in a running ddlctl job: signals to a task, counted by its step file."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from ddlctl.contract.rundir import TASK_PID
from ddlctl.testing.run import ROOT, ddlctl_cmd


def step_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def task_pid(run_dir: Path, task: str) -> int:
    return int(json.loads((run_dir / "tasks" / task / TASK_PID).read_text())["task_pid"])


def wait_for(predicate, timeout: float, what: str):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Job:
    """``ddlctl launch ARGS`` in the background, with its run directory and output."""

    def __init__(self, runs: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.runs = runs
        self.out = open(runs.parent / "ddlctl.out", "wb")  # noqa: SIM115
        self.err_path = runs.parent / "ddlctl.err"
        self.err = open(self.err_path, "wb")  # noqa: SIM115
        full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
        self.proc = subprocess.Popen(ddlctl_cmd("launch", "--runs-dir", str(runs), *args), stdout=self.out,
                                     stderr=self.err, env=full_env, cwd=ROOT)
        self.run_dir = wait_for(lambda: next((p for p in runs.iterdir() if p.is_dir()), None), 60, "the run directory")

    def steps(self, task: str) -> int:
        return step_count(self.run_dir / "tasks" / task / "steps.jsonl")

    def wait_steps(self, task: str, count: int, timeout: float = 180) -> None:
        wait_for(lambda: self.steps(task) >= count or self.proc.poll() is not None, timeout,
                 f"{task} to record {count} steps")
        assert self.proc.poll() is None, self.stderr()[-3000:]

    def kill(self, task: str, sig: int) -> float:
        os.kill(task_pid(self.run_dir, task), sig)
        return time.time()

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its host agents see their input end and kill every task
            self.proc.wait()
            raise
        finally:
            self.out.close()
            self.err.close()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def outcome(self) -> dict:
        return json.loads((self.run_dir / "outcome.json").read_text())
