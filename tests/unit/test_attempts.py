"""A run across Slurm attempts of one job (submit --requeue): which launch continues it, and what moves."""

from __future__ import annotations

import json

from ddlctl.commands.attempts import earlier_attempts, next_attempt, requeued
from ddlctl.commands.submit import SubmitOptions, sbatch_script


def test_only_a_requeue_of_the_runs_own_job_continues_it_and_each_attempt_keeps_its_records(tmp_path):
    run = tmp_path / "run"
    (run / "tasks" / "worker-0").mkdir(parents=True)
    (run / "submit.json").write_text(json.dumps({"job_id": "17"}))
    for name in ("plan.json", "summary.json", "slurm-17.out", "submit.sbatch"):
        (run / name).write_text("x")
    (run / "outcome.json").write_text(json.dumps({"started_at": 5.0, "wall_time_s": 12.5, "exit_code": 143,
                                                  "failure": "interrupted by SIGTERM"}))
    (run / "checkpoints").mkdir()
    assert requeued(run, {"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "17"}) == "17"
    for env in ({"SLURM_JOB_ID": "17"}, {"SLURM_RESTART_COUNT": "0", "SLURM_JOB_ID": "17"},
                {"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "18"}, {"SLURM_RESTART_COUNT": "x", "SLURM_JOB_ID": "17"}):
        assert requeued(run, env) is None, env
    assert requeued(tmp_path, {"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "17"}) is None, "no submit.json"
    assert next_attempt(run) == 2
    assert sorted(p.name for p in run.iterdir()) == ["attempts", "checkpoints", "slurm-17.out", "submit.json",
                                                     "submit.sbatch"]
    assert sorted(p.name for p in (run / "attempts" / "1").iterdir()) == ["outcome.json", "plan.json", "summary.json",
                                                                        "tasks"]
    (run / "plan.json").write_text("y")
    assert next_attempt(run) == 3 and (run / "attempts" / "2" / "plan.json").read_text() == "y"
    assert earlier_attempts(run) == [
        {"attempt": 1, "started_at": 5.0, "wall_time_s": 12.5, "exit_code": 143, "failure": "interrupted by SIGTERM"},
        {"attempt": 2, "started_at": None, "wall_time_s": None, "exit_code": None, "failure": None}]
    script = sbatch_script(SubmitOptions(requeue=True), run, "r", "python3", "/w")
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in script
    assert "--requeue" not in sbatch_script(SubmitOptions(), run, "r", "python3", "/w")
