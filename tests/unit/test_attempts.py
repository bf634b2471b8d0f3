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
        {"attempt": 1, "started_at": 5.0, "wall_time_s": 12.5, "exit_code": 143, "failure": "interrupted by SIGTERM",
         "reason": None},
        {"attempt": 2, "started_at": None, "wall_time_s": None, "exit_code": None, "failure": None, "reason": None}]
    script = sbatch_script(SubmitOptions(requeue=True), run, "r", "python3", "/w")
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in script
    assert "--requeue" not in sbatch_script(SubmitOptions(), run, "r", "python3", "/w")


def _attempt(folder, started, wall, steps, failure=None, ok=False):
    """An attempt's records: its plan (one worker), outcome, and the worker's step records
    ``steps``: (step, start s, duration s)."""
    (folder / "tasks" / "worker-0").mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps({"strategy": "one_device", "tasks": [{"name": "worker:0"}]}))
    (folder / "outcome.json").write_text(json.dumps({"started_at": started, "wall_time_s": wall, "ok": ok,
                                                     "exit_code": 0 if ok else 143, "failure": failure}))
    if steps is not None:  # (None: no records came back)
        (folder / "tasks" / "worker-0" / "steps.jsonl").write_text("".join(
            json.dumps({"step": s, "start_us": int(t * 1e6), "duration_s": d}) + "\n" for s, t, d in steps))


def test_the_report_of_a_run_of_three_attempts_gives_each_its_steps_and_the_whole_runs_goodput(tmp_path):
    from ddlctl.report.attempts import attempts_line, attempts_section

    run = tmp_path / "run"
    one, two = run / "attempts" / "1", run / "attempts" / "2"
    # attempt 1 (preempted) ran steps 1-10 at 1 s each from t=100 and sent no records back; its node
    # kept them and attempt 2 (from t=130) appended steps 9-15 (resumed from the checkpoint at 8)
    first = [(s, 100 + s, 1.0) for s in range(1, 11)]
    _attempt(one, 100.0, 12.0, None, failure="interrupted by SIGTERM")
    _attempt(two, 130.0, 10.0, [*first, *((s, 122 + s, 1.0) for s in range(9, 16))],
             failure="the time limit is near (Slurm's SIGUSR1): every task checkpoints")
    _attempt(run, 200.0, 8.0, [(s, 185 + s, 1.0) for s in range(16, 21)], ok=True)
    outcome = json.loads((run / "outcome.json").read_text())
    outcome["attempt"], outcome["attempts"] = 3, earlier_attempts(run)
    section = attempts_section(run, outcome)
    rows = [(r["attempt"], r["steps"], r["redone"], r["waited_s"], r["ended_by"]) for r in section["attempts"]]
    assert rows == [(1, [1, 10], 0, None, "preempted (SIGTERM)"), (2, [9, 15], 2, 18.0, "time limit"),
                    (3, [16, 20], 0, 60.0, "completed")]
    # each step once: 20 s of steps over 100-208; the two redone records do not count
    assert section["span_s"] == 108.0 and section["between_s"] == 78.0 and section["steps_redone"] == 2
    assert section["productive_s"] == 20.0 and abs(section["goodput"] - 20 / 108) < 1e-9
    # start-up: from each attempt's start to its first step (101, 131, 201)
    assert [r["startup_s"] for r in section["attempts"]] == [1.0, 1.0, 1.0] and section["startup_s"] == 3.0
    assert attempts_line(section).startswith("this run took 3 attempts over 1m48s, 20.0s training (goodput 19% of "
                                             "the whole run), 1m18s between attempts, 3.0s starting")
    (run / "tasks" / "worker-0" / "steps.jsonl").write_text("")  # attempt 2 had trained the last step
    section = attempts_section(run, outcome)
    assert [(r["steps"], r["redone"]) for r in section["attempts"]][2] == (None, 0) and section["steps_unknown"] == []
    (two / "tasks" / "worker-0" / "steps.jsonl").unlink()  # nothing of attempts 1 and 2 anywhere
    section = attempts_section(run, outcome)
    assert section["steps_unknown"] == [1, 2] and section["attempts"][2]["redone"] is None
    assert "(attempts 1, 2: no step records anywhere" in attempts_line(section)
    assert attempts_section(run, {"started_at": 1.0}) is None, "one attempt: no section"
