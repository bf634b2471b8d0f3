"""What went wrong with --trace, said from the run directory alone (pure: crafted folders)."""

from __future__ import annotations

import json

import pytest

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


def _space(spans: list[tuple[str, float, float]], keys: dict[str, str] | None = None) -> bytes:
    """An XSpace of one host plane whose compute thread ran ``(op, start s, end s)`` (``keys``: an
    op's rendezvous key stat, by reference as TensorFlow writes it)."""
    from ddlctl.report.traces import xplane_module

    space = xplane_module().XSpace()
    plane = space.planes.add(name="/host:CPU")
    line = plane.lines.add(name="tf_Compute", timestamp_ns=0)
    plane.stat_metadata[1].name = "key"
    for i, (name, start, end) in enumerate(spans, start=1):
        plane.event_metadata[i].name = name
        event = line.events.add(metadata_id=i, offset_ps=int(start * 1e12), duration_ps=int((end - start) * 1e12))
        if name in (keys or {}):
            plane.stat_metadata[100 + i].name = keys[name]
            event.stats.add(metadata_id=1, ref_value=100 + i)
    return space.SerializeToString()


def test_a_ps_tasks_tensors_are_counted_by_the_task_at_the_other_end(tmp_path):
    from ddlctl.report.traces import split, xplane_module

    space = xplane_module().XSpace()
    space.ParseFromString(_space([("a/_1:_Send", 0.0, 0.3), ("b/_2:_Send", 0.3, 0.4), ("c/_3:_Recv", 0.4, 0.5)], {
        "a/_1:_Send": "/job:ps/replica:0/task:0/device:CPU:0;1f;/job:worker/replica:0/task:1/device:CPU:0;edge_1;0:0",
        "b/_2:_Send": "/job:ps/replica:0/task:0/device:CPU:0;1f;/job:worker/replica:0/task:0/device:CPU:0;edge_2;0:0",
        "c/_3:_Recv": "/job:worker/replica:0/task:1/device:CPU:0;2e;/job:ps/replica:0/task:0/device:CPU:0;edge_3;0:0"}))
    trace = split("ps:0", {"start_s": 10.0, "end_s": 11.0, "steps": [1, 2]}, space)
    assert trace.parts["ps_rpc"] == pytest.approx(0.5)
    assert trace.rpc_peers == pytest.approx({"worker:1": 0.4, "worker:0": 0.1})
    assert list(trace.rpc_peers) == ["worker:1", "worker:0"]  # (most first)


def test_trace_auto_captures_are_sessions_of_their_own_with_why_and_what_differs(tmp_path):
    plan = {"request": {}, "tasks": [{"name": f"worker:{i}", "kind": "program"} for i in range(3)]}
    why = "worker:1 is a straggler: it is ready to synchronise in 43 ms against 16 ms on worker:0 (2.7x)"
    # lockstep: worker:1 computes most of the captured second, worker:0 waits for it in the all-reduce
    for name, compute in (("worker-0", 0.25), ("worker-1", 0.7)):
        folder = tmp_path / "tasks" / name
        folder.mkdir(parents=True)
        (folder / "capture-auto-1.xplane.pb").write_bytes(_space([
            ("model/conv:Conv2D", 0.0, compute), ("allreduce:CollectiveReduceV2", compute, 0.95)]))
        (folder / "capture-auto-1.json").write_text(json.dumps({
            "asked": [41, 50], "session": "auto-1", "why": why, "steps": [41, 50], "start_s": 1000.0,
            "end_s": 1001.0, "file": "capture-auto-1.xplane.pb"}))
    outcome = {"auto_traces": [{"session": "auto-1", "asked": ["worker:0", "worker:1"], "why": why,
                                "reason": "straggler", "task": "worker:1"},
                               {"session": "auto-2", "asked": ["worker:2"], "why": "worker:2's steps slowed down"}]}
    section = traces_section(tmp_path, plan, outcome)
    session = tmp_path / "profile" / "plugins" / "profile" / "auto-1-steps-41-50"
    assert sorted(p.name for p in session.iterdir()) == ["worker-0.xplane.pb", "worker-1.xplane.pb"]
    assert [(t["task"], t["session"]) for t in section["tasks"]] == [("worker:0", "auto-1-steps-41-50"),
                                                                    ("worker:1", "auto-1-steps-41-50")]
    shares = {t["task"]: {k: round(v / t["wall_s"], 2) for k, v in t["parts"].items()} for t in section["tasks"]}
    assert shares["worker:1"]["compute"] == 0.7 and shares["worker:0"]["collective"] == 0.7
    assert section["comparison"] is None  # (no --trace A-B capture)
    assert section["captures"] == [{
        "session": "auto-1-steps-41-50", "why": why, "reason": "straggler", "task": "worker:1",
        "tasks": ["worker:0", "worker:1"],
        "comparison": "worker:1 holds the others up in its capture: it computes 70% of its time against 25% on "
                      "worker:0, which waits in collective 70%: for it (a slower or busier machine)"}]
    # a capture asked of a task that recorded no step after it (it ended, or hung): said
    assert section["notes"] == ["trace auto asked worker:2 for a capture (worker:2's steps slowed down), and none "
                                "came back: the task recorded no step after it was asked (it ended, or hung)"]
