"""Run summaries from run directories written here with known values."""

from __future__ import annotations

import json

import pytest

from ddlctl.report.summary import summarize


def write_steps(folder, task, durations, samples, start_us=1_000_000_000):
    folder.mkdir(parents=True)
    t = start_us
    with open(folder / "steps.jsonl", "w") as f:
        for i, d in enumerate(durations, start=1):
            f.write(json.dumps({"task": task, "step": i, "start_us": t, "duration_s": d,
                                "samples": samples}) + "\n")
            t += int(d * 1e6)


def test_throughput_excludes_warmup_and_is_samples_over_window(tmp_path):
    run = tmp_path / "run"
    # 2 warm-up steps of 1 s, then 8 steps of 0.5 s with 100 samples each per task
    write_steps(run / "tasks" / "worker-0", "worker:0", [1, 1] + [0.5] * 8, 100)
    write_steps(run / "tasks" / "worker-1", "worker:1", [1, 1] + [0.5] * 8, 100)
    (run / "tasks" / "worker-0" / "result.json").write_text(json.dumps({"loss": 0.25,
                                                                       "accuracy": 0.9}))
    (run / "plan.json").write_text(json.dumps({"run_id": "r", "strategy": "mwms"}))
    summary = summarize(run, warmup_steps=2)
    assert summary.total_steps == 20
    by_name = {t.name: t for t in summary.tasks}
    assert by_name["worker:0"].kept_steps == 8
    assert by_name["worker:0"].samples_per_s == pytest.approx(800 / 4.0)
    assert by_name["worker:0"].loss == 0.25 and by_name["worker:1"].accuracy is None
    assert summary.throughput_samples_per_s == pytest.approx(1600 / 4.0)
    assert summary.strategy == "mwms"


def test_truncated_line_is_counted_not_fatal(tmp_path):
    run = tmp_path / "run"
    write_steps(run / "tasks" / "chief-0", "chief:0", [0.1] * 3, 10)
    with open(run / "tasks" / "chief-0" / "steps.jsonl", "a") as f:
        f.write('{"task": "chief:0", "st')
    summary = summarize(run, warmup_steps=0)
    assert summary.skipped_lines == 1 and summary.total_steps == 3
