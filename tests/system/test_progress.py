"""The built-in workload's progress line: rates over a time window, not over a burst."""

from __future__ import annotations

import json

import pytest


def test_step_records_reach_the_file_although_the_task_hangs_after_them(tmp_path):
    """A task that records steps and then blocks (a deadlock, a hung collective) keeps nothing in a
    buffer: the records are on disk at once, no further step needed."""
    import subprocess
    import sys

    path = tmp_path / "steps.jsonl"
    code = ("import sys, threading, time\nfrom ddlctl.task.steps import StepRecorder\n"
            "r = StepRecorder(sys.argv[1], 'worker:0')\n"
            "for i in range(3):\n    r.record(i + 1, time.time(), 0.01, 8)\n"
            "print('recorded', flush=True)\nthreading.Event().wait()  # hangs forever, the file left open\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "recorded"
        lines = path.read_text().splitlines()  # as soon as the task says it recorded them
        assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
        assert proc.poll() is None, "the task is still hanging: nothing closed the file"
    finally:
        proc.kill()
        proc.wait()

@pytest.mark.parametrize("per_epoch", [False, True])
def test_a_resumed_fit_numbers_its_steps_from_the_epoch_it_resumes_at(tmp_path, per_epoch):
    """BackupAndRestore (or initial_epoch) starts fit at epoch 3 of 5: the records go on from step
    3 x 4 and the last one reaches the declared total, as in a run never interrupted."""
    from ddlctl.task.instrument.keras import epoch_timer_class, step_timer_class
    from ddlctl.task.steps import StepRecorder

    base = type("Callback", (), {})  # what the timers need of Keras' Callback: nothing
    recorder = StepRecorder(tmp_path / "steps.jsonl", "worker:0")
    timer = (epoch_timer_class if per_epoch else step_timer_class)(base)(batch_size=8, recorder=recorder)
    timer.params = {"epochs": 5, "steps": 4}
    timer.on_train_begin()
    for epoch in (3, 4):
        timer.on_epoch_begin(epoch)
        if not per_epoch:
            for batch in range(4):
                timer.on_train_batch_begin(batch)
                timer.on_train_batch_end(batch)
        else:
            timer.on_epoch_end(epoch)
    recorder.close()
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    reached = [r["step"] + r.get("steps", 1) - 1 for r in records]  # a record names its block's first step
    assert reached[-1] == records[-1]["total"] == 20
    assert records[0]["step"] == 13 and reached == ([16, 20] if per_epoch else list(range(13, 21)))
