"""Strategy comparison, pipelined vs linear execution, and sharding, on real localhost runs."""

from __future__ import annotations

import pytest

from ddlctl.commands.compare import (
    RunRecord,
    accuracy_note,
    execution_ranges,
    execution_speedups,
    overlap_ceiling,
    parse_executions,
    rows_from_runs,
    run_order,
    speedup_range,
    verdict,
)


def summary(throughput, accuracy=0.9, role="worker", input_fraction=None):
    return {"throughput_samples_per_s": throughput, "tasks_count": 1, "hosts": [],
            "tasks": [{"name": f"{role}:0", "role": role, "steps": 10, "step_time_p50_s": 0.01,
                       "step_time_p95_s": 0.02, "loss": 0.1, "accuracy": accuracy, "input_fraction": input_fraction}]}


def test_rows_speedup_efficiency_spread_and_failures_are_computed_from_runs():
    runs = [RunRecord("one_device", "pipelined", "a", 0, None, summary(100.0), 1),
            RunRecord("one_device", "pipelined", "b", 0, None, summary(120.0), 1),
            RunRecord("mwms", "pipelined", "c", 0, None, summary(330.0), 2),
            RunRecord("mwms", "pipelined", "d", 0, None, summary(300.0), 2),
            RunRecord("mwms", "pipelined", "e", 0, None, summary(270.0), 2),
            RunRecord("ps", "pipelined", None, 2, "2 workers requested but the cluster has 1 worker slots", None)]
    rows = {r["strategy"]: r for r in rows_from_runs(runs, several=False)}
    assert rows["one_device"]["throughput_samples_per_s"] == 110.0
    assert rows["mwms"]["throughput_samples_per_s"] == 300.0
    assert (rows["mwms"]["throughput_min"], rows["mwms"]["throughput_max"]) == (270.0, 330.0)
    assert rows["mwms"]["speedup_vs_one_device"] == pytest.approx(300 / 110)
    assert rows["mwms"]["scaling_efficiency"] == pytest.approx(300 / 110 / 2)
    assert rows["ps"]["error"].startswith("2 workers requested") and rows["ps"]["throughput_samples_per_s"] is None
    modes = rows_from_runs([RunRecord("mwms", "pipelined", "x", 0, None, summary(500.0), 2),
                            RunRecord("mwms", "linear", "y", 0, None, summary(400.0), 2),
                            RunRecord("mwms", "python-feed", "z", 0, None, summary(50.0), 2)], several=True)
    assert [r["label"] for r in modes] == ["mwms (pipelined)", "mwms (linear)", "mwms (python-feed)"]
    assert execution_speedups(modes) == {"mwms": {"linear": 1.25, "python-feed": 10.0}}
    assert parse_executions("all") == ("pipelined", "linear", "python-feed")
    assert parse_executions("linear, pipelined,linear") == ("linear", "pipelined")
    with pytest.raises(Exception, match="unknown mode 'fast'"):
        parse_executions("pipelined,fast")


def test_repeats_run_interleaved_and_the_verdict_says_the_spread_and_when_it_is_noise():
    assert run_order(["a", "b"], ["pipelined", "linear"], 2) == [
        ("a", "pipelined", 0), ("a", "linear", 0), ("b", "pipelined", 0), ("b", "linear", 0),
        ("a", "pipelined", 1), ("a", "linear", 1), ("b", "pipelined", 1), ("b", "linear", 1)]
    # pipelined 110-130 against linear 90-100: apart; against 100-120: the ranges overlap
    assert speedup_range([110.0, 120.0, 130.0], [90.0, 95.0, 100.0]) == (pytest.approx(1.1), pytest.approx(130 / 90),
                                                                         False)
    assert speedup_range([110.0, 130.0], [100.0, 120.0])[2] is True
    assert speedup_range([110.0], [100.0, 120.0]) is None  # one run: no spread to speak of
    runs = [RunRecord("ps", mode, f"{mode}{i}", 0, None, summary(v), 2)
            for mode, values in (("pipelined", (110.0, 120.0, 130.0)), ("linear", (100.0, 105.0, 120.0)))
            for i, v in enumerate(values)]
    rows = rows_from_runs(runs, several=True)
    ranges = execution_ranges(rows)
    assert ranges == {"ps": {"linear": [pytest.approx(110 / 120), pytest.approx(1.3), True]}}
    line = verdict("ps", execution_speedups(rows)["ps"], ranges["ps"], 3)
    assert line == "pipelined under ps: 1.14x linear's throughput (0.92-1.30x over 3 repeats: inside the noise)"
    one = [RunRecord("one_device", "pipelined", f"o{i}", 0, None, summary(v), 1) for i, v in enumerate((100.0, 104.0))]
    two = [RunRecord("mwms", "pipelined", f"m{i}", 0, None, summary(v), 2) for i, v in enumerate((180.0, 200.0))]
    mwms = {r["strategy"]: r for r in rows_from_runs(one + two, several=False)}["mwms"]
    assert mwms["speedup_range"] == [pytest.approx(180 / 104), pytest.approx(2.0), False]


def test_each_row_says_whether_it_was_input_or_compute_bound_and_what_overlap_could_gain():
    """From the runs' own step records: without overlap the input's share of a step is the input
    pipeline alone and the rest the step alone; pipelined, what overlap left waiting."""
    runs = [RunRecord("ps", "pipelined", "p", 0, None, summary(93.0, input_fraction=0.04), 2),
            RunRecord("ps", "linear", "l", 0, None, summary(100.0, input_fraction=0.12), 2),
            RunRecord("one_device", "pipelined", "o", 0, None, summary(140.0, input_fraction=0.45), 1),
            RunRecord("one_device", "linear", "q", 0, None, summary(100.0, input_fraction=0.6), 1)]
    rows = {r["label"]: r for r in rows_from_runs(runs, several=True)}
    assert rows["ps (linear)"]["bound"] == "compute-bound (12% input, 88% compute, one after the other)"
    assert rows["ps (pipelined)"]["bound"] == "compute-bound (input hidden: 4% wait)"
    assert rows["one_device (linear)"]["bound"].startswith("input-bound (60% input")
    assert rows["one_device (pipelined)"]["bound"] == "input-bound (still waits 45% for input)"
    assert overlap_ceiling(0.12) == pytest.approx(1 / 0.88) and overlap_ceiling(0.6) == pytest.approx(1 / 0.6)
    ratios = execution_speedups(list(rows.values()))
    assert verdict("ps", ratios["ps"], {}, 1, 0.12) == (
        "pipelined under ps: 0.93x linear's throughput; input was 12% of a linear step, so overlap can gain at "
        "most 1.14x here (it lost instead: the input pipeline took cores the compute was using)")
    assert verdict("one_device", ratios["one_device"], {}, 1, 0.6).endswith("overlap can gain at most 1.67x here")
    # final accuracy over repeats: apart, or inside the run-to-run spread (ps: asynchronous updates)
    # and each repeat's two runs (side by side in time) against each other, in points
    assert accuracy_note([0.937, 0.944, 0.940], [0.929, 0.918, 0.950]) == (
        "accuracy 0.940 [0.937-0.944] pipelined, 0.929 [0.918-0.950] linear: inside the run-to-run spread "
        "(pipelined - linear per repeat: +0.8, +2.6, -1.0 points; 2 of 3 within 1 point)")
    assert accuracy_note([0.85, 0.86], [0.90, 0.89]) == (
        "accuracy 0.855 [0.850-0.860] pipelined, 0.895 [0.890-0.900] linear "
        "(pipelined - linear per repeat: -5.0, -3.0 points; 0 of 2 within 1 point)")
    # a failed run leaves its repeat unpaired, the others keep their pairs
    assert accuracy_note([0.95, None, 0.94], [0.945, 0.96, 0.951]).endswith(
        "(pipelined - linear per repeat: +0.5, -1.1 points; 1 of 2 within 1 point)")
    assert accuracy_note([0.9], [0.9, 0.91]) is None
    assert accuracy_note([0.9, None], [0.9, 0.91]) is None
    repeated = [RunRecord("ps", mode, f"{mode}{i}", 0, None, summary(100.0, accuracy=a), 2)
                for mode, values in (("pipelined", (0.85, 0.86)), ("linear", (0.90, 0.89)))
                for i, a in enumerate(values)]
    repeated.insert(2, RunRecord("ps", "pipelined", "pipelined2", 1, "crashed", None, 2))  # a third, failed
    repeated.append(RunRecord("ps", "linear", "linear2", 0, None, summary(100.0, accuracy=0.87), 2))
    by_mode = {r["execution"]: r for r in rows_from_runs(repeated, several=True)}
    assert {mode: r["accuracy_runs"] for mode, r in by_mode.items()} == {
        "pipelined": [0.85, 0.86], "linear": [0.90, 0.89, 0.87]}
    assert by_mode["pipelined"]["accuracy_by_repeat"] == [0.85, 0.86, None]


def test_input_local_and_service_are_a_row_each_and_the_service_is_compared_with_local_input():
    from ddlctl.commands.compare import parse_inputs, run_modes, service_line, service_speedups

    assert run_modes(("pipelined", "linear"), parse_inputs("local, service,local")) == (
        "pipelined", "pipelined+service", "linear", "linear+service")
    with pytest.raises(Exception, match="unknown input 'disk'"):
        parse_inputs("local,disk")
    runs = [RunRecord("mwms", "pipelined", "a", 0, None, summary(1000.0, input_fraction=0.3), 2),
            RunRecord("mwms", "pipelined+service", "b", 0, None, summary(1800.0, input_fraction=0.1), 2),
            RunRecord("mwms", "linear", "c", 0, None, summary(800.0, input_fraction=0.5), 2)]
    rows = rows_from_runs(runs, several=True)
    assert [r["label"] for r in rows] == ["mwms (pipelined)", "mwms (pipelined, service input)", "mwms (linear)"]
    assert execution_speedups(rows) == {"mwms": {"linear": 1.25}}, "the service is not an execution mode"
    assert rows[1]["bound"] == "compute-bound (input hidden: 10% wait)", "pipelined, through the service"
    speedups = service_speedups(rows)
    assert speedups == {"mwms": {"pipelined": {"ratio": 1.8, "input_local": 0.3, "input_service": 0.1}}}
    assert service_line("mwms", "pipelined", speedups["mwms"]["pipelined"]) == (
        "the tf.data service under mwms (pipelined): 1.80x local input's throughput; each step waited 30% for "
        "input, 10% with the service")
