"""What went wrong with --trace, said from the run directory alone (pure: crafted folders)."""

from __future__ import annotations

import json

from ddlctl.report.traces import traces_section


def test_every_capture_that_went_wrong_is_said_naming_the_task_and_why(tmp_path):
    plan = {"request": {"trace": [5, 8]}, "tasks": [
        {"name": "chief:0", "kind": "program"}, {"name": "worker:0", "kind": "program"},
        {"name": "worker:1", "kind": "program"}, {"name": "worker:2", "kind": "program"},
        {"name": "ps:0", "kind": "server"}]}
    tasks = tmp_path / "tasks"
    for name in ("chief-0", "worker-0", "worker-1", "worker-2", "ps-0"):
        (tasks / name).mkdir(parents=True)
    # the chief's own trace is damaged, and it could not reach the servers' profilers
    (tasks / "chief-0" / "capture.xplane.pb").write_bytes(b"\xff" * 64)
    (tasks / "chief-0" / "capture.json").write_text(json.dumps({
        "asked": [5, 8], "steps": [5, 8], "start_s": 1.0, "end_s": 2.0, "file": "capture.xplane.pb",
        "servers_error": "UnavailableError: failed to connect to all addresses"}))
    (tasks / "worker-0" / "capture.json").write_text(json.dumps({
        "asked": [5, 8], "error": "the program had not imported TensorFlow: nothing to capture"}))
    (tasks / "worker-1" / "steps.jsonl").write_text('{"step": 1}\n')  # it never reached step 4
    (tasks / "worker-2" / "capture.json").write_text(json.dumps({
        "asked": [5, 8], "steps": [5, 8], "start_s": 1.0, "end_s": 2.0, "file": "capture.xplane.pb"}))
    section = traces_section(tmp_path, plan)
    assert section["tasks"] == [] and section["comparison"] is None
    assert section["notes"] == [
        "chief:0 could not trace the servers' profilers (UnavailableError: failed to connect to all addresses): "
        "their traces are missing (a profiler port taken by another process?)",
        "worker:0: nothing captured (the program had not imported TensorFlow: nothing to capture)",
        "worker:1: nothing captured (it recorded no step 4 while tracing was asked for steps 5-8: fewer steps, "
        "or steps it does not record)",
        f"worker:2: its trace did not come back (capture.xplane.pb is not in {tasks / 'worker-2'})",
        "chief:0: its trace profile/plugins/profile/steps-5-8/chief-0.xplane.pb cannot be decoded (damaged)"]
    # without --trace and without captures: no section
    assert traces_section(tmp_path / "nothing", {"request": {}, "tasks": []}) is None
