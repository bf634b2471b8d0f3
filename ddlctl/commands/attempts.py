"""A run that lives across several Slurm attempts of one job (``submit --requeue``): Slurm starts
the same batch script again after a preemption or ``scontrol requeue``, with the same ``--run-id``.
That launch goes on in the run's folder: the previous attempt's records (plan, outcome, summary,
the tasks' folders, telemetry...) move to ``attempts/<n>/``; the submission, the job's output
file and the checkpoints stay, and the tasks resume from the newest checkpoint.

Only a requeue of the run's own job continues it (``SLURM_RESTART_COUNT`` set and the job id the
one ``submit.json`` names); any other launch into a folder that holds a run is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.rundir import ATTEMPTS_DIR, OUTCOME_FILE

#: What stays in a run folder across attempts: the submission or the launch's options, the job's
#: output, the checkpoints.
KEPT = ("submit.sbatch", "submit.json", "launch.json", "checkpoints", ATTEMPTS_DIR)


def _count(env: Mapping[str, str], name: str) -> int:
    """A count Slurm or the batch script put in the environment (0: none, or not a number)."""
    value = env.get(name, "")
    return int(value) if value.isdigit() else 0


def requeued(run_dir: Path, env: Mapping[str, str]) -> str | None:
    """The Slurm job id when this launch is a requeued attempt of the job that ``run_dir`` was
    submitted as (None: it is not)."""
    job = env.get("SLURM_JOB_ID", "")
    if _count(env, "SLURM_RESTART_COUNT") < 1 or not job:
        return None
    try:
        submitted = json.loads((run_dir / "submit.json").read_text()).get("job_id")
    except (OSError, ValueError, AttributeError):
        return None
    return job if str(submitted) == job else None


def next_attempt(run_dir: Path) -> int:
    """Move the last attempt's records to ``attempts/<n>/``; this attempt's number (2, 3, ...)."""
    root = run_dir / ATTEMPTS_DIR
    done = len([p for p in root.iterdir() if p.is_dir()]) if root.is_dir() else 0
    folder = root / str(done + 1)
    folder.mkdir(parents=True, exist_ok=True)
    for path in run_dir.iterdir():
        if path.name not in KEPT and not (path.name.startswith("slurm-") and path.name.endswith(".out")):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, folder / path.name)
    return done + 2


def earlier_attempts(run_dir: Path) -> list[dict]:
    """What each earlier attempt's ``outcome.json`` says: attempt, start, wall time, exit code, why."""
    root = run_dir / ATTEMPTS_DIR
    found = []
    for folder in sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) \
            if root.is_dir() else ():
        try:
            outcome = json.loads((folder / OUTCOME_FILE).read_text())
        except (OSError, ValueError):
            outcome = {}
        cause = outcome.get("root_cause") if isinstance(outcome.get("root_cause"), dict) else {}
        found.append({"attempt": int(folder.name), "started_at": outcome.get("started_at"),
                      "wall_time_s": outcome.get("wall_time_s"), "exit_code": outcome.get("exit_code"),
                      "failure": outcome.get("failure"), "reason": cause.get("reason")})
    return found


def at_time_limit(env: Mapping[str, str], run_id: str, checkpoints: str | None, earlier: Sequence[Mapping],
                  say: Callable[[str], None]) -> bool:
    """The job's tasks have checkpointed and stopped at its time limit (Slurm's SIGUSR1): requeue
    it (``scontrol requeue``) while ``--max-requeues`` allows (counting the ``earlier`` attempts
    that ended at the time limit: a preemption Slurm requeued itself is not counted), else end the
    run. What happens is said (``say``) before the requeue: ``scontrol requeue`` ends this batch
    script at once, and Slurm may kill it before another line is written. True when requeued."""
    job = env.get("SLURM_JOB_ID", "")
    used, most = sum(1 for a in earlier if a.get("reason") == "time-limit"), _count(env, envvars.MAX_REQUEUES)
    kept = f"; its newest checkpoint stays in {checkpoints}" if checkpoints else ""
    if not job or used >= most:
        say(f"the time limit ends run {run_id} at attempt {len(earlier) + 1}: --max-requeues {most} "
            f"{'spent' if most else '(none asked)'}{kept}")
        return False
    say(f"requeueing Slurm job {job} at its time limit ({used + 1} of --max-requeues {most}): attempt "
        f"{len(earlier) + 2} goes on from the newest checkpoint")
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        error = done.stderr.strip() or done.stdout.strip() if done.returncode else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    if error is not None:
        say(f"the time limit ends run {run_id}: Slurm did not requeue job {job} ({error}){kept}")
        return False
    return True
