"""The built-in workload's progress line: rates over a time window, not over a burst."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from ddlctl.workloads import trainer as train


def test_a_burst_of_results_does_not_show_an_absurd_rate(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(train.time, "monotonic", lambda: clock[0])
    progress = train.Progress(argparse.Namespace(steps=40, log_every=8))
    # blocks of 8 steps (800 samples) at 100 samples/s, except that the second block's result
    # arrives 1 ms after the first's (ps fetches pending closures as they complete)
    for end, at in ((8, 8.0), (16, 8.001), (24, 24.0), (32, 32.0), (40, 40.0)):
        clock[0] = at
        progress.after(end, 1.0, 800)
    rates = [float(line.split("(")[1].split()[0].replace(",", "")) for line in capsys.readouterr().out.splitlines()]
    assert len(rates) == 5 and all(50 <= r <= 250 for r in rates), rates


def test_a_program_declares_its_total_in_code_or_in_the_environment(tmp_path, monkeypatch):
    import ddlctl
    from ddlctl.task import steps

    monkeypatch.setenv("DDLCTL_TASK_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("DDLCTL_TOTAL_STEPS", "300")
    recorder = steps.StepRecorder.from_env()
    recorder.record(1, 0.0, 0.1, 8)
    recorder.close()
    assert json.loads((tmp_path / "env" / "steps.jsonl").read_text())["total"] == 300

    monkeypatch.setenv("DDLCTL_TASK_DIR", str(tmp_path / "code"))
    monkeypatch.delenv("DDLCTL_TOTAL_STEPS")
    monkeypatch.setattr(steps, "_shared", None)
    ddlctl.set_total_steps(40)
    with ddlctl.step(samples=8):
        pass
    steps.shared_recorder().close()
    assert json.loads((tmp_path / "code" / "steps.jsonl").read_text())["total"] == 40
    with pytest.raises(ValueError):
        ddlctl.set_total_steps(0)


def test_a_step_marks_where_its_input_ends(tmp_path, monkeypatch):
    """``timer.input_done()`` inside ``ddlctl.step``: the record's input_s is the wait before the
    mark, part of the step's duration; a step without the mark has no input_s, one given it keeps it."""
    import ddlctl
    from ddlctl.task import steps

    monkeypatch.setenv("DDLCTL_TASK_DIR", str(tmp_path))
    monkeypatch.setattr(steps, "_shared", None)
    with ddlctl.step(samples=4) as timer:
        time.sleep(0.05)
        timer.input_done()
        time.sleep(0.02)
    with ddlctl.step(samples=4):
        pass
    with ddlctl.step(samples=4, input_s=0.5):
        pass
    steps.shared_recorder().close()
    marked, plain, given = (json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines())
    assert 0.05 <= marked["input_s"] < marked["duration_s"] and marked["duration_s"] >= 0.07
    assert "input_s" not in plain and given["input_s"] == 0.5






def test_a_phase_says_when_it_begins_and_ends_and_beats_come_at_most_once_a_second(tmp_path, monkeypatch):
    import ddlctl
    from ddlctl.report.stepfile import read_phases
    from ddlctl.task import steps

    monkeypatch.setenv("DDLCTL_TASK_DIR", str(tmp_path))
    with pytest.raises(OSError), ddlctl.phase("checkpoint"):  # a save that fails ends the phase too
        began = json.loads((tmp_path / "phases.jsonl").read_text())
        raise OSError("disk full")
    assert began["phase"] == "checkpoint" and began["open"] is True
    ended = json.loads((tmp_path / "phases.jsonl").read_text().splitlines()[1])
    assert ended["phase"] == "checkpoint" and ended["start_us"] == began["start_us"] and "open" not in ended
    assert list(read_phases(tmp_path / "phases.jsonl")) == ["checkpoint"], "the report reads the end alone"
    assert len(read_phases(tmp_path / "phases.jsonl")["checkpoint"]) == 1
    clock = [100.0]
    monkeypatch.setattr(steps.time, "monotonic", lambda: clock[0])
    monkeypatch.setitem(steps._beats, "last", float("-inf"))
    for at in (100.0, 100.4, 100.9, 101.0, 101.5, 102.2):
        clock[0] = at
        ddlctl.beat()  # (the public name of steps.beat; "eval" by default)
    beats = [json.loads(line) for line in (tmp_path / "phases.jsonl").read_text().splitlines()[2:]]
    assert [b["beat"] for b in beats] == ["eval"] * 3, "at 100, 101 and 102.2"
