"""--trace auto, without processes: the paces the host agent makes of step records, what the live
analysis finds in them and asks for (once), and the report's side of the captures that came back."""

from __future__ import annotations

import json

import pytest

from ddlctl.contract.wire import GarbledFrame, Kind, check_frame
from ddlctl.host.stepfollow import PACE_RECORDS, StepFile
from ddlctl.supervise.autotrace import WARMUP, AutoTrace, Baselines, Pace, straggler


def test_pace_is_the_median_of_each_runners_last_records_per_step(tmp_path):
    path = tmp_path / "steps.jsonl"
    lines = [{"step": i, "duration_s": 0.010 * (1 + i % 3), "sync_s": 0.004} for i in range(1, 41)]
    lines += [{"step": 41, "steps": 4, "duration_s": 0.4, "worker": "worker:1"},  # a ps chief's block: 0.1 s a step
              {"step": 45, "duration_s": -1.0}, {"step": 46, "duration_s": "slow"}]  # (not a time: passed over)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    follower = StepFile(str(path))
    follower.poll()
    pace = follower.pace()
    assert pace[""] == [0.02, 0.004, 40] and len(follower.recent[""]) == PACE_RECORDS
    assert pace["worker:1"] == [0.1, None, 1]  # (no sync time recorded: none)
    frame = {"k": Kind.STEPS, "t": 1.0, "counts": {"w": 46}, "pace": {"w": pace}}
    assert check_frame(frame) is frame
    for bad in ({"w": {"": [0.1, None]}}, {"w": {"": ["0.1", None, 3]}}, {"w": {"": [0.1, None, -1]}},
                {"w": {"x" * 201: [0.1, None, 3]}}, {"w": [0.1, None, 3]}):
        with pytest.raises(GarbledFrame):
            check_frame({**frame, "pace": bad})


def test_a_straggler_is_the_slowest_worker_against_the_median_of_its_peers_by_sync_time_where_recorded():
    healthy = {f"worker:{i}": Pace(0.060, 0.020 + i * 0.001, 50) for i in range(4)}
    assert straggler(healthy) is None
    # lockstep: every step lasts as long; worker:3 is ready to synchronise last
    slow = {**healthy, "worker:3": Pace(0.061, 0.055, 50)}
    found = straggler(slow)
    assert (found.reason, found.task, found.peer) == ("straggler", "worker:3", "worker:1")
    assert found.why == ("worker:3 is a straggler: it has its gradients ready in 55 ms against 21 ms on worker:1 "
                         "(2.6x, its last steps' median)")
    assert straggler({**slow, "worker:3": Pace(0.061, 0.055, WARMUP - 1)}) is None  # not warmed up yet
    # without sync times: the step times (ps workers, as their chief records them)
    assert straggler({"worker:0": Pace(0.05, None, 30), "worker:1": Pace(0.2, None, 30)}).task == "worker:1"
    # tiny steps jitter by large ratios; a pipeline's stages differ by design (one of each role)
    assert straggler({"worker:0": Pace(0.001, None, 30), "worker:1": Pace(0.003, None, 30)}) is None
    assert straggler({"chief:0": Pace(0.05, None, 30), "worker:0": Pace(0.2, None, 30)}) is None


def test_a_regression_is_a_task_slower_than_its_own_early_pace_at_two_looks_in_a_row():
    baselines = Baselines()
    for t in range(0, 121, 10):  # the first two minutes: the baseline (the fastest seen)
        assert baselines.regression({"w:0": Pace(0.05 + 0.01 * (t == 60), None, WARMUP + t),
                                     "w:1": Pace(0.05, None, WARMUP + t)}, float(t)) is None
    assert baselines.fastest == {"w:0": 0.05, "w:1": 0.05}
    assert baselines.regression({"w:0": Pace(0.09, None, 500), "w:1": Pace(0.05, None, 500)}, 130.0) is None
    same = {"w:0": Pace(0.09, None, 500), "w:1": Pace(0.05, None, 500)}
    assert baselines.regression(same, 131.0) is None  # (no new records: no second look)
    found = baselines.regression({"w:0": Pace(0.09, None, 510), "w:1": Pace(0.05, None, 510)}, 140.0)
    assert (found.reason, found.task, found.peer) == ("regression", "w:0", "w:1")
    assert found.why == "w:0's steps slowed down: 90 ms a step against 50 ms early in the run (1.8x)"
    baselines = Baselines()  # a slow look, then a normal one: no regression
    baselines.regression({"w:0": Pace(0.05, None, 20)}, 0.0)
    for seen, step_s in ((30, 0.09), (40, 0.05), (50, 0.09)):
        assert baselines.regression({"w:0": Pace(step_s, None, seen)}, 200.0 + seen) is None


def test_auto_trace_asks_the_recorders_once_says_why_and_waits_before_the_next():
    asked, said, clock = [], [], [0.0]
    auto = AutoTrace(lambda task, request: asked.append((task, request)), said.append, every_s=600.0,
                     clock=lambda: clock[0])
    # a ps chief records every worker's steps: both captures are asked of it (it traces its servers)
    paces = {"chief:0": {"worker:0": (0.05, None, 40), "worker:1": (0.05, None, 40), "worker:2": (0.2, None, 40)}}
    found = auto.tick(paces, {"chief:0": 300})
    assert found.task == "worker:2" and [task for task, _ in asked] == ["chief:0"]
    # from a step about 2 s ahead of the chief at the fastest pace captured (0.05 s a step): every
    # task asked captures the same steps
    assert asked[0][1] == {"id": 1, "from": 300 + 40 + 1, "steps": 10, "seconds": 30.0, "why": found.why}
    assert said == [f"trace auto: {found.why}: capturing 10 steps of worker:2 and worker:0 (through chief:0)"]
    assert auto.events[0]["session"] == "auto-1" and auto.events[0]["asked"] == ["chief:0"]
    paces["chief:0"]["worker:1"] = (0.3, None, 60)  # another straggler, within every_s of the last capture
    clock[0] = 300.0
    assert auto.tick(paces) is None and len(asked) == 1
    clock[0] = 601.0
    assert auto.tick(paces).task == "worker:1" and asked[-1][1]["id"] == 2 and "from" not in asked[-1][1]
    clock[0] = 5000.0  # both again, much later: each was captured once
    assert auto.tick(paces) is None and len(asked) == 2 and len(said) == 2


def test_a_task_near_its_hang_threshold_is_captured_at_once_for_some_seconds_beside_the_last_to_progress():
    from ddlctl.supervise.autotrace import NOW_SECONDS, near_hang
    from ddlctl.supervise.hangs.watch import HangWatch

    watch = HangWatch(timeout_s=40.0)
    for task in ("worker:0", "worker:1"):
        watch.update(task, 1, 0.0)
        watch.update(task, 2, 1.0)
    watch.update("worker:0", 3, 5.0)
    assert near_hang(watch, 19.0, ["worker:0", "worker:1"]) is None  # (half of 40 s: not yet)
    assert near_hang(HangWatch(timeout_s=4.0), 1.0, ["worker:0"]) is None
    found = near_hang(watch, 22.0, ["worker:0", "worker:1"])
    assert (found.reason, found.task, found.peer) == ("near-hang", "worker:1", "worker:0")
    assert found.why == "worker:1 has made no progress for 21s (it is called hung at 40s)"
    assert near_hang(watch, 42.0, ["worker:0", "worker:1"]).task == "worker:0"  # (worker:1 is hung: the hang watch's)
    asked = []
    auto = AutoTrace(lambda task, request: asked.append((task, request)), lambda _: None, clock=lambda: 22.0)
    auto.tick({}, {"worker:0": 3, "worker:1": 2}, found)
    assert asked == [(task, {"id": 1, "seconds": NOW_SECONDS, "why": found.why, "now": True})
                     for task in ("worker:0", "worker:1")]
    soon = near_hang(watch, 36.0, ["worker:0", "worker:1"])  # (5 s before the hang is called: a shorter capture)
    auto = AutoTrace(lambda task, request: asked.append((task, request)), lambda _: None, clock=lambda: 36.0)
    auto.tick({}, {}, soon)
    assert asked[-1][1]["seconds"] == 3.0
