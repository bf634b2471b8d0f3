"""The job's wall time by cause (pure: literal intervals, then a recorded run directory)."""

from __future__ import annotations

import json

import pytest

from ddlctl.contract.causes import CAUSES, minus, straggler_wait, time_by_cause, union
from ddlctl.report.summary import summarize


def test_intervals_merge_and_subtract():
    assert union([(5, 7), (0, 2), (1, 3), (4, 4)]) == [(0, 3), (5, 7)]
    assert minus([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]
    assert minus([(0, 2), (4, 6)], []) == [(0, 2), (4, 6)]


def test_every_second_of_the_window_is_counted_once_in_order_of_precedence():
    causes = time_by_cause((0.0, 100.0), kept=[(10, 20), (20, 30), (50, 60)], redone=[(30, 40)],
                           phases={"checkpoint": [(40, 42)], "eval": [(95, 97)]}, restarts=[(40, 50)],
                           degraded_since=[55.0], straggler_wait_s=3.0)
    assert (causes.productive_s, causes.redone_s, causes.checkpoint_s, causes.eval_s, causes.restart_s,
            causes.startup_s, causes.ending_s, causes.other_s) == (30, 10, 2, 2, 8, 10, 38, 0)  # (the restart's
    # first 2 s: a save; after the last step, but the evaluation: the end)
    assert causes.degraded_s == 5 and causes.straggler_wait_s == 3.0
    assert causes.line() == ("productive 30% · redone 10% · checkpoints 2% · evaluation 2% · restarts 8% · "
                             "start-up 10% · ending 38% (of the productive time: degraded 5%, waiting for "
                             "stragglers 3%)")


def test_short_pauses_between_the_leads_steps_are_the_loops_own_and_a_long_one_stays_other():
    from ddlctl.contract.causes import short_gaps

    steps = [(0, 1), (1.2, 2.2), (2.5, 3.5), (20, 21), (21.1, 22.1)]  # a 16.5 s pause: no loop's own
    assert [(round(a, 1), round(b, 1)) for a, b in short_gaps(steps)] == [(1, 1.2), (2.2, 2.5), (21, 21.1)]
    causes = time_by_cause((0.0, 22.1), kept=steps, redone=[], phases={}, restarts=[], degraded_since=[],
                           straggler_wait_s=None)
    assert round(causes.between_s, 3) == 0.6 and round(causes.other_s, 3) == 16.5
    assert "between steps 3%" in causes.line() and "other 75%" in causes.line()


def test_a_first_step_longer_than_the_usual_is_compile_and_a_hang_until_found_is_stalled():
    # before: the first step's tracing counted as productive, a hang's stall as "other"
    causes = time_by_cause((0.0, 40.0), kept=[(10, 14), (14, 15), (15, 16), (16, 17), (30, 31)], redone=[],
                           phases={}, restarts=[(32, 35)], degraded_since=[], straggler_wait_s=None,
                           stalls=[(17, 32)])
    assert (causes.startup_s, causes.compile_s, causes.productive_s, causes.stalled_s, causes.restart_s,
            causes.ending_s, causes.other_s) == (10, 3, 5, 14, 3, 5, 0)  # (the step at 30 is the hung one's
    # progress: productive; the end after the last step, but the restart)
    assert causes.line() == ("compile 8% · productive 12% · stalled (hang) 35% · restarts 8% · start-up 25% · "
                             "ending 12%")
    assert sum(getattr(causes, key + "_s") for key, _ in CAUSES) == causes.wall_s


def test_the_lead_waits_for_the_last_worker_to_arrive_at_each_step():
    lead = {1: 10.0, 2: 20.0, 3: 30.0}
    others = [lead, {1: 10.5, 2: 19.0, 3: 30.1}, {1: 10.25, 2: 20.2}]  # step 3 not recorded by one: left out
    assert straggler_wait(lead, others) == pytest.approx(0.5 + 0.2)


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_a_recorded_run_with_a_restart_is_split_by_cause(tmp_path):
    run = tmp_path / "run"
    chief = run / "tasks" / "chief-0"
    chief.mkdir(parents=True)
    t0 = 1_800_000_000.0
    (run / "plan.json").write_text(json.dumps({"run_id": "r", "strategy": "ps", "request": {}, "tasks": [
        {"name": "chief:0", "host": "h", "role": "chief"}, {"name": "worker:0", "host": "h", "role": "worker"}]}))
    # steps 1-4 (1 s each from t0+5), the chief killed at t0+9.5, back stepping at t0+14 from step 3
    steps = [(1, 5), (2, 6), (3, 7), (4, 8), (3, 14), (4, 15), (5, 16), (6, 17)]
    (chief / "steps.jsonl").write_text(_lines([{"task": "chief:0", "step": n, "start_us": int((t0 + at) * 1e6),
                                                "duration_s": 1.0, "samples": 64} for n, at in steps]))
    (chief / "phases.jsonl").write_text(_lines([{"phase": "checkpoint", "start_us": int((t0 + 7.0) * 1e6),
                                                 "duration_s": 0.5},  # inside a step: the step counts
                                                {"phase": "eval", "start_us": int((t0 + 18.5) * 1e6),
                                                 "duration_s": 1.0}]))
    (run / "outcome.json").write_text(json.dumps({
        "ok": True, "exit_code": 0, "wall_time_s": 20.0, "started_at": t0, "ended_at": t0 + 20.0, "tasks": [],
        "restarts": [{"time": t0 + 9.5, "task": "chief:0", "host": "h", "cause": "signal", "action": "restart",
                      "scope": "task", "tasks": ["chief:0"], "restarted_at": t0 + 10.0}]}))
    causes = summarize(run, warmup_steps=0).time_by_cause
    assert {k: causes[k] for k in ("wall_s", "productive_s", "redone_s", "checkpoint_s", "eval_s", "restart_s",
                                   "startup_s", "ending_s", "between_s", "other_s")} == {
        "wall_s": 20.0, "productive_s": 6.0, "redone_s": 2.0, "checkpoint_s": 0.0, "eval_s": 1.0,
        "restart_s": 4.5, "startup_s": 5.0, "ending_s": 1.0, "between_s": 0.5, "other_s": 0.0}  # (between:
    # the last step to the kill)
    assert causes["straggler_wait_s"] is None, "ps: no all-reduce to wait at"
    assert causes["line"].startswith("productive 30% · redone 10% · evaluation 5% · restarts 22% · start-up 25%")


def test_a_stall_starts_where_the_lead_stopped_if_it_waited_for_the_hung_task_before_it_hung():
    from ddlctl.contract.causes import stall_of

    # a pipeline's chief stopped stepping at 16.9 (waiting on the stage), the stage's last progress
    # was 19.2, the hang found at 27.3: the stall is the chief's wait too (it was "other")
    assert stall_of(27.3, 8.1, [(10.0, 14.4), (14.4, 16.9)]) == (16.9, 27.3)
    # a ps chief stepping on while a worker hung: the worker's last progress
    assert stall_of(27.3, 8.1, [(10.0, 14.4), (26.0, 27.0)]) == (pytest.approx(19.2), 27.3)
    assert stall_of(27.3, 8.1, []) == (pytest.approx(19.2), 27.3)


def test_a_running_jobs_time_is_counted_from_its_progress_reports_as_the_report_counts_steps():
    from ddlctl.supervise.accounting import LiveCauses

    live = LiveCauses(started=1000.0)
    beat = {"chief:0": (0, None)}

    def tick(t: float, step: int, phase: str | None = None, restarts: tuple = (), restarting: bool = False) -> None:
        live.tick(t, {"chief:0": (step, 100), "worker:0": (step, None)}, {"chief:0": (0, phase)},
                  list(restarts), restarting)

    live.tick(1001.0, beat, {}, [], False)  # start-up: no step yet
    tick(1010.0, 5)  # the first report with steps: start-up ends here
    for t, step in ((1011, 10), (1012, 15), (1013, 20)):
        tick(t, step)  # productive 1010-1013 (one merged interval)
    tick(1014.0, 20, phase="checkpoint")
    tick(1016.0, 20)  # a 2 s save
    tick(1017.0, 25)  # 1016-1017: productive
    tick(1020.0, 25, restarts=(1017.5,), restarting=True)  # a fault; the chief starts again
    tick(1030.0, 15, restarts=(1017.5,))  # back at its checkpoint (step 15)
    tick(1032.0, 25, restarts=(1017.5,))  # steps 15-25 again: redone; the restart ends (1017.5-1030)
    tick(1033.0, 27, restarts=(1017.5,))
    assert len(live.kept) == 3 and live.redone == [(1030.0, 1032.0)]
    causes = live.breakdown(1040.0, degraded_since=[1032.5], hangs=[(1040.0, 7.0)])  # stalled since 1033
    assert (causes.startup_s, causes.productive_s, causes.checkpoint_s, causes.redone_s, causes.restart_s,
            causes.stalled_s) == (10.0, 5.0, 2.0, 2.0, 12.5, 7.0)
    assert causes.degraded_s == 0.5 and causes.wall_s == 40.0
    assert sum(getattr(causes, key + "_s") for key, _ in CAUSES) == pytest.approx(causes.wall_s)
    # the supervisor's records as outcome.json keeps them; counted again only a second later
    first = live.now(1040.0, [{"since": 1032.5}], [{"kind": "hang", "time": 1040.0, "idle_s": 7.0}, {"kind": "x"}])
    assert first == causes and live.now(1040.5, [], []) is first and live.now(1041.5, [], []) != first


def test_the_metrics_give_the_time_by_cause_and_goodput_from_it():
    from prometheus_client import CollectorRegistry, generate_latest

    from ddlctl.console.metrics import JobMetrics

    metrics = JobMetrics()
    causes = time_by_cause((0.0, 50.0), kept=[(10, 40)], redone=[], phases={"checkpoint": [(40, 45)]},
                           restarts=[], degraded_since=[30.0], straggler_wait_s=None)
    metrics.on_progress({"worker:0": (10, None)}, None, causes)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    got = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
           for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")}
    assert got['ddlctl_time_seconds{cause="productive"}'] == 30
    assert got['ddlctl_time_seconds{cause="checkpoint"}'] == 5 and got['ddlctl_time_seconds{cause="startup"}'] == 10
    assert sum(v for k, v in got.items() if k.startswith("ddlctl_time_seconds")) == 50
    assert got["ddlctl_degraded_seconds"] == 10 and got["ddlctl_goodput_ratio"] == 0.6


def test_an_evaluation_the_lead_beats_through_is_evaluation_while_it_runs():
    # model.fit's validation writes its phase record at its end; its batches beat once a second
    from ddlctl.supervise.accounting import LiveCauses

    live = LiveCauses(started=0.0)
    busy = 0
    for t in range(1, 30):
        step = 10 + t if t <= 5 else (15 if t < 17 else 15 + t - 16)  # steps, an evaluation 5-13, steps from 17
        if 5 < t <= 13:
            busy += 1  # a beat a second
        live.tick(float(t), {"worker:0": (step, None)}, {"worker:0": (busy, None)}, [], False,
                  {"worker:0": "eval"} if busy else {})
        if t == 10:
            assert live.breakdown(10.0).eval_s == 4.0, "under way: counted as it runs"
    causes = live.breakdown(29.0)
    assert live.phases == {"eval": [(6.0, 14.0)]}  # its first beat to a second after its last
    # (steps resumed at 16: the report's step records say so; live, the time from the evaluation's
    # end to the first report of a step is the steps')
    assert (causes.startup_s, causes.productive_s, causes.eval_s) == (1.0, 4.0 + 15.0, 8.0)
    assert causes.ending_s == 0 and causes.between_s == 1.0 and causes.other_s == 0  # (5-6: to the first beat)

