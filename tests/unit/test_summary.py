"""Summaries of run directories written here with known values (no processes)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddlctl.contract.grouping import figure_range, named
from ddlctl.contract.telemetry import GPU_FIELDS
from ddlctl.report.export import write_csv
from ddlctl.report.summary import percentile, summarize
from ddlctl.report.trace import build_trace

T0 = 1_700_000_000.0


def write_steps(run: Path, task: str, durations, samples=100, start=T0, sync=None, host="h1", total=None):
    folder = run / "tasks" / task.replace(":", "-")
    folder.mkdir(parents=True, exist_ok=True)
    t = start
    with open(folder / "steps.jsonl", "w") as f:
        for i, d in enumerate(durations, start=1):
            record = {"task": task, "step": i, "start_us": int(round(t * 1e6)), "duration_s": d, "samples": samples}
            if total is not None:
                record["total"] = total
            if sync is not None:
                record["sync_s"] = sync
                record["input_s"] = sync / 2
            f.write(json.dumps(record) + "\n")
            t += d


def write_plan(run: Path, strategy: str, tasks: dict[str, str], hosts=()):
    run.mkdir(parents=True, exist_ok=True)
    plan = {"run_id": "r1", "strategy": strategy,
            "cluster": {"hosts": [{"name": h, "gpus": 0} for h in hosts]},
            "request": {"workload_args": ["--batch-size", "64"], "global_batch": 64, "command": []},
            "tasks": [{"name": n, "host": h, "role": n.split(":")[0]} for n, h in tasks.items()]}
    (run / "plan.json").write_text(json.dumps(plan))


def write_telemetry(run: Path, host: str, utils, mem_used, mem_total=80 * 2**30, interval=1.0, times=None,
                    cpu=50.0, procs=None, host_mem_used=2**30):
    """Telemetry exactly as the agent writes it: GPU readings and task figures as arrays, GPU fields
    in the order the hello line declares (here reversed, so the reader must honour it)."""
    folder = run / "telemetry"
    folder.mkdir(parents=True, exist_ok=True)
    fields = list(reversed(GPU_FIELDS))
    lines = [{"type": "hello", "host": host, "interval": interval, "gpu_note": None, "gpu_fields": fields,
              "gpus": [{"index": 0, "name": "H100", "memory_total_bytes": mem_total}]}]
    times = times or [T0 + i * interval for i in range(len(utils))]
    for i, (t, util) in enumerate(zip(times, utils, strict=True)):
        reading = {"index": 0, "util": util, "sm_active": util / 2, "mem_used": mem_used[i], "mem_total": mem_total,
                   "power_w": 100.0 + i}
        lines.append({"type": "sample", "t": t, "cpu": cpu, "mem_used": host_mem_used, "mem_total": 2**34,
                      "net_sent": 1000 * i, "net_recv": 2000 * i,
                      "procs": procs if procs is not None else {"worker:0": [90.0, 5 * 2**20]},
                      "gpus": [[reading.get(f) for f in fields]]})
    (folder / f"{host}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_tasks_whose_cpu_time_is_mostly_the_kernels_are_named_with_their_share(tmp_path):
    """A task that spends over a quarter of its CPU time in the kernel (and uses a fifth of a CPU at
    least) is named, with its share; telemetry from an agent that did not read it says nothing."""
    run = tmp_path / "run"
    write_plan(run, "mwms", {f"worker:{i}": "h1" if i < 2 else "h2" for i in range(4)}, hosts=["h1", "h2"])
    for i in range(4):
        write_steps(run, f"worker:{i}", [0.1] * 10)
    rss = 2**30
    write_telemetry(run, "h1", [50.0] * 4, [2**30] * 4, procs={"worker:0": [90.0, rss, 40.0],
                                                                "worker:1": [80.0, rss, 40.0]})
    write_telemetry(run, "h2", [50.0] * 4, [2**30] * 4, procs={"worker:2": [90.0, rss, 9.0],  # 10%: not named
                                                                "worker:3": [10.0, rss, 8.0]})  # idle: not named
    summary = summarize(run, warmup_steps=0)
    assert {t.name: t.kernel_cpu_mean for t in summary.tasks} == {"worker:0": 40.0, "worker:1": 40.0,
                                                                   "worker:2": 9.0, "worker:3": 8.0}
    heavy = [line for line in summary.diagnosis if line.startswith("kernel-heavy")]
    assert heavy == ["kernel-heavy: worker:0-1 spend 44-50% of their CPU time in the kernel (page faults of memory "
                     "freed and allocated again each step, or system calls: `perf top -p PID` or `strace -c -f -p "
                     "PID` says which; ddlctl gives tasks MALLOC_TOP_PAD_ unless their environment sets a malloc "
                     "threshold of its own)"]
    assert json.loads(json.dumps(summary.to_dict()))["tasks"][0]["kernel_cpu_mean"] == 40.0
    # under ps the workers compute and record no step: their figures are read too
    ps_run = tmp_path / "ps"
    write_plan(ps_run, "ps", {"chief:0": "h1", "worker:0": "h1", "worker:1": "h1", "ps:0": "h1"}, hosts=["h1"])
    write_steps(ps_run, "chief:0", [0.1] * 10)
    write_telemetry(ps_run, "h1", [50.0] * 4, [2**30] * 4, procs={
        "chief:0": [30.0, rss, 3.0], "worker:0": [95.0, rss, 50.0], "worker:1": [95.0, rss, 10.0]})
    ps_summary = summarize(ps_run, warmup_steps=0)
    assert [(w.task, w.kernel_cpu_mean) for w in ps_summary.work] == [("worker:0", 50.0), ("worker:1", 10.0)]
    heavy = [line for line in ps_summary.diagnosis if line.startswith("kernel-heavy")]
    assert len(heavy) == 1 and heavy[0].startswith("kernel-heavy: worker:0 spends 53% of its CPU time in the kernel ")
    # an agent that did not read the kernel's share: nothing said
    write_telemetry(run, "h1", [50.0] * 4, [2**30] * 4, procs={"worker:0": [90.0, rss], "worker:1": [80.0, rss]})
    older = summarize(run, warmup_steps=0)
    assert not [line for line in older.diagnosis if line.startswith("kernel-heavy")]
    assert {t.name: t.kernel_cpu_mean for t in older.tasks}["worker:0"] is None


def test_percentiles_interpolate_linearly():
    values = [0.1 * i for i in range(1, 11)]
    assert percentile(values, 50) == pytest.approx(0.55)
    assert percentile(values, 90) == pytest.approx(0.91)
    assert percentile(values, 99) == pytest.approx(0.991)
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None


def test_step_statistics_warmup_and_throughput(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h1"})
    # 2 warm-up steps of 1 s are excluded; then 0.1 .. 1.0 s
    durations = [1.0, 1.0] + [0.1 * i for i in range(1, 11)]
    write_steps(run, "worker:0", durations)
    write_steps(run, "worker:1", durations)
    summary = summarize(run, warmup_steps=2)
    w0 = next(t for t in summary.tasks if t.name == "worker:0")
    assert (w0.steps, w0.kept_steps) == (12, 10)
    assert w0.step_time_p50_s == pytest.approx(0.55)
    assert w0.step_time_p90_s == pytest.approx(0.91)
    assert w0.step_time_p99_s == pytest.approx(0.991)
    window = sum(0.1 * i for i in range(1, 11))  # 5.5 s
    assert w0.samples_per_s == pytest.approx(1000 / window)
    assert summary.throughput_samples_per_s == pytest.approx(2000 / window), "samples over the window"
    assert summary.throughput_steps_per_s == pytest.approx(10 / window), "a synchronous step counts once"
    assert summary.global_batch == 64 and summary.warmup_steps == 2
    assert not any(t.straggler for t in summary.tasks)


def test_straggler_by_median_step_time(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "ps", {"a:0": "h1", "b:0": "h1", "c:0": "h2"})
    write_steps(run, "a:0", [0.100] * 20)
    write_steps(run, "b:0", [0.105] * 20)
    write_steps(run, "c:0", [0.120] * 20)
    summary = summarize(run, warmup_steps=0)
    assert {t.name: t.straggler for t in summary.tasks} == {"a:0": False, "b:0": False, "c:0": True}
    assert any(line.startswith("straggler: c:0 on h2") for line in summary.diagnosis)


def test_tasks_that_succeeded_before_the_last_step_they_declared_are_named_with_how_far_they_got(tmp_path):
    # model.fit whose dataset ran out: exit code 0 after 16 of epochs x steps_per_epoch = 60
    run = tmp_path / "run"
    write_plan(run, "mwms", {f"worker:{i}": "h1" for i in range(4)})
    for name, steps in (("worker:0", 16), ("worker:1", 16), ("worker:2", 60), ("worker:3", 10)):
        write_steps(run, name, [0.05] * steps, total=60)
    states = {"worker:0": "succeeded", "worker:1": "succeeded", "worker:2": "succeeded", "worker:3": "failed"}
    (run / "outcome.json").write_text(json.dumps({"tasks": [{"name": n, "state": s} for n, s in states.items()]}))
    summary = summarize(run)
    assert {t.name: t.last_step for t in summary.tasks} == {"worker:0": 16, "worker:1": 16, "worker:2": 60,
                                                            "worker:3": 10}
    [line] = [line for line in summary.diagnosis if line.startswith("ended before the last step declared")]
    assert line.startswith("ended before the last step declared, with exit code 0: worker:0-1 after 16 of 60 steps "
                           "(an early-stopping callback; or, in model.fit, input that ran out")  # not the failed one


def test_straggler_by_late_arrival_in_synchronous_training(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2"})
    # lockstep: same step times, but worker:1 reaches the all-reduce 30 ms after worker:0
    write_steps(run, "worker:0", [0.1] * 20, sync=0.010)
    write_steps(run, "worker:1", [0.1] * 20, sync=0.040)
    summary = summarize(run, warmup_steps=0)
    tasks = {t.name: t for t in summary.tasks}
    assert tasks["worker:1"].straggler and not tasks["worker:0"].straggler
    assert tasks["worker:1"].arrival_lateness_p50_s == pytest.approx(0.030, abs=1e-6)
    assert tasks["worker:0"].input_fraction == pytest.approx(0.05)


def test_telemetry_statistics_gaps_and_diagnosis(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [1.0] * 10)
    utils = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    mem = [10 * 2**30, 20 * 2**30, 79 * 2**30, 30 * 2**30, 30 * 2**30, 30 * 2**30]
    times = [T0 + t for t in (0, 1, 2, 3, 8, 9)]  # 5 s without a sample: a gap
    write_telemetry(run, "h1", utils, mem, times=times)
    summary = summarize(run, warmup_steps=0)
    (host,) = summary.hosts
    gpu = host.gpus[0]
    assert gpu.util_mean == pytest.approx(35.0)
    assert gpu.util_p5 == pytest.approx(12.5)
    assert gpu.sm_active_mean == pytest.approx(17.5)
    assert gpu.mem_peak_bytes == 79 * 2**30 and gpu.mem_total_bytes == 80 * 2**30
    assert gpu.power_mean_w == pytest.approx(102.5) and gpu.power_peak_w == 105.0
    assert host.cpu_util_mean == 50.0 and host.samples == 6
    assert host.gaps == ((T0 + 3, T0 + 8),)
    assert host.net_sent_bytes_per_s == pytest.approx(5000 / 9)
    assert summary.gpus_count == 1
    text = "\n".join(summary.diagnosis)
    assert "GPU 0 on h1 mostly idle: busy 35%" in text
    assert "memory nearly full" in text
    assert "telemetry gap on h1: no samples for 5.0s" in text
    task = summary.tasks[0]
    assert task.cpu_mean == 90.0 and task.rss_peak_bytes == 5 * 2**20


def test_utilisation_is_taken_while_training_and_memory_over_the_whole_run(tmp_path):
    """A start-up of 20 s with the GPU idle (TensorFlow importing, the cluster forming) before 10 s
    of steps at 90%: the GPU was busy while training, not "mostly idle"; the memory peak of the
    start-up still counts. Without steps the whole run's samples are all there is."""
    times = [T0 - 20 + i for i in range(31)]
    utils = [0.0 if t < T0 else 90.0 for t in times]
    mem = [40 * 2**30 if t == T0 - 5 else 2**30 for t in times]
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [1.0] * 10)
    write_telemetry(run, "h1", utils, mem, times=times)
    gpu = summarize(run, warmup_steps=0).hosts[0].gpus[0]
    assert gpu.util_mean == pytest.approx(90.0) and gpu.util_p5 == pytest.approx(90.0)
    assert gpu.mem_peak_bytes == 40 * 2**30
    assert "mostly idle" not in "\n".join(summarize(run, warmup_steps=0).diagnosis)

    bare = tmp_path / "bare"
    write_plan(bare, "mwms", {"worker:0": "h1"}, hosts=["h1"])
    write_telemetry(bare, "h1", utils, mem, times=times)
    summary = summarize(bare, warmup_steps=0)
    assert summary.hosts[0].gpus[0].util_mean == pytest.approx(sum(utils) / len(utils))
    assert "GPU 0 on h1 mostly idle" in "\n".join(summary.diagnosis)


def test_steps_too_short_to_sample_leave_figures_over_the_whole_run_and_the_diagnosis_says_so(tmp_path):
    """Five steps in 50 ms (a program that ran out of device memory right after them, as seen on an
    H200) fall between two of 20 one-second samples: the CPU and GPU figures are the whole run's,
    start-up included, and the diagnosis says so rather than blame the input pipeline."""
    run = tmp_path / "run"
    write_plan(run, "one_device", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [0.01] * 5, start=T0 + 10.2)
    write_telemetry(run, "h1", [0.0] * 20, [2**30] * 20, cpu=95.0)
    summary = summarize(run, warmup_steps=0)
    assert summary.hosts[0].whole_run and summary.hosts[0].cpu_util_mean == 95.0
    lines = summary.diagnosis
    assert "CPU saturated on h1: mean 95% over the whole run, start-up included (its steps took too little time " \
           "to be sampled)" in lines, lines
    assert "GPU 0 on h1 mostly idle: busy 0% of the time (idle 100%) over the whole run, start-up included (its " \
           "steps took too little time to be sampled)" in lines, lines
    assert json.loads(json.dumps(summary.to_dict()))["hosts"][0]["whole_run"] is True
    # two samples (a run of a second or two): their mean is no finding
    write_telemetry(run, "h1", [0.0] * 2, [2**30] * 2, cpu=95.0)
    assert not [line for line in summarize(run, warmup_steps=0).diagnosis if "saturated" in line or "idle" in line]
    write_telemetry(run, "h1", [0.0] * 20, [2**30] * 20, cpu=95.0)
    # steps that span three samples: the figures are theirs, and the pipeline may be blamed
    write_steps(run, "worker:0", [1.0] * 5, start=T0 + 10.2)
    summary = summarize(run, warmup_steps=0)
    assert not summary.hosts[0].whole_run
    assert "CPU saturated on h1: mean 95% (input pipeline, or too many tasks for its cores)" in summary.diagnosis


def test_a_host_whose_clock_is_off_has_its_times_put_on_the_controllers_clock(tmp_path):
    """Two workers stepping side by side for 10 s, h2's clock 42 s ahead (its records and samples
    say so): with outcome.json's clock_offsets the throughput window is the 10 s it was, the
    busy GPU's samples fall inside it, and the trace shows both workers side by side; without
    it the window was 52 s."""
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2"}, hosts=["h1", "h2"])
    write_steps(run, "worker:0", [0.1] * 100, samples=32, host="h1")
    write_steps(run, "worker:1", [0.1] * 100, samples=32, start=T0 + 42, host="h2")
    write_telemetry(run, "h2", [95.0] * 10, [2**30] * 10, times=[T0 + 42 + i for i in range(10)])
    skewed = summarize(run, warmup_steps=0)
    assert skewed.throughput_samples_per_s == pytest.approx(2 * 100 * 32 / 52.0, rel=0.01)
    (run / "outcome.json").write_text(json.dumps({"ok": True, "exit_code": 0, "tasks": [],
                                                  "clock_offsets": {"h2": 42.0}}))
    summary = summarize(run, warmup_steps=0)
    assert summary.throughput_samples_per_s == pytest.approx(2 * 100 * 32 / 10.0, rel=0.01)
    assert "the clock of h2 is 42.0s ahead of ddlctl's: its step times and samples are put on ddlctl's clock here; " \
           "synchronise the hosts' clocks (chrony, systemd-timesyncd)" in summary.diagnosis
    assert summary.hosts[0].gpus[0].util_mean == pytest.approx(95.0) and not summary.hosts[0].whole_run
    starts = {e["tid"]: e["ts"] for e in reversed(build_trace(run)["traceEvents"]) if e.get("name") == "step"}
    assert len(starts) == 2 and max(starts.values()) - min(starts.values()) < 1e3, starts  # within 1 ms


def test_summary_json_keys_are_the_documented_ones(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [0.1] * 10)
    write_telemetry(run, "h1", [90.0] * 3, [2**30] * 3)
    data = json.loads(json.dumps(summarize(run).to_dict()))
    for key in ("run_id", "strategy", "wall_time_s", "warmup_steps", "throughput_samples_per_s", "tasks",
                "hosts", "diagnosis"):
        assert key in data
    for key in ("name", "host", "exit_code", "steps", "step_time_p50_s", "step_time_p90_s", "step_time_p99_s",
                "samples_per_s", "straggler"):
        assert key in data["tasks"][0]
    for key in ("host", "cpu_util_mean", "whole_run", "mem_peak_bytes", "gpus"):
        assert key in data["hosts"][0]
    for key in ("index", "name", "util_mean", "util_p5", "mem_peak_bytes", "mem_total_bytes", "power_mean_w"):
        assert key in data["hosts"][0]["gpus"][0]


def test_truncated_lines_are_counted_not_fatal(tmp_path):
    run = tmp_path / "run"
    write_steps(run, "chief:0", [0.1] * 3)
    with open(run / "tasks" / "chief-0" / "steps.jsonl", "a") as f:
        f.write('{"task": "chief:0", "st')
    summary = summarize(run, warmup_steps=0)
    assert summary.skipped_lines == 1 and summary.total_steps == 3


def test_trace_has_a_process_per_host_a_thread_per_task_and_counters(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2"})
    write_steps(run, "worker:0", [0.1] * 4)
    write_steps(run, "worker:1", [0.2] * 3)
    write_telemetry(run, "h1", [50.0, 60.0], [2**30, 2**30])
    events = build_trace(run)["traceEvents"]
    processes = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert set(processes) == {"h1", "h2"}
    assert threads["worker:0"][0] == processes["h1"] and threads["worker:1"][0] == processes["h2"]
    steps = [e for e in events if e["ph"] == "X"]
    assert len(steps) == 7
    first = min((e for e in steps if e["tid"] == threads["worker:0"][1]), key=lambda e: e["ts"])
    assert first["ts"] == int(T0 * 1e6) and first["dur"] == pytest.approx(1e5)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"CPU %", "GPU 0 util %", "GPU 0 memory GiB"}


def test_csv_export(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [0.1] * 10)
    write_telemetry(run, "h1", [90.0] * 3, [2**30] * 3)
    paths = write_csv(summarize(run), tmp_path / "csv")
    assert [p.name for p in paths] == ["tasks.csv", "hosts.csv", "gpus.csv"]
    with open(tmp_path / "csv" / "gpus.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["host"] == "h1" and float(rows[0]["util_mean"]) == 90.0


def test_clock_skew_between_hosts_does_not_make_a_straggler(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2", "evaluator:0": "h3"})
    write_steps(run, "worker:0", [0.02] * 20, sync=0.010)
    write_steps(run, "worker:1", [0.02] * 20, sync=0.010, start=T0 + 0.005)  # h2's clock runs 5 ms ahead
    (run / "tasks" / "evaluator-0").mkdir(parents=True)
    (run / "tasks" / "evaluator-0" / "result.json").write_text('{"accuracy": 0.5}')  # no steps
    summary = summarize(run, warmup_steps=0)
    tasks = {t.name: t for t in summary.tasks}
    assert not tasks["worker:1"].straggler and tasks["worker:1"].arrival_lateness_p50_s == pytest.approx(0.0)


def test_an_evaluator_does_not_switch_the_late_arrival_check_off(tmp_path):
    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2", "evaluator:0": "h3"})
    write_steps(run, "worker:0", [0.1] * 20, sync=0.010)
    write_steps(run, "worker:1", [0.1] * 20, sync=0.040, start=T0 - 0.020)  # late, and its clock is behind
    (run / "tasks" / "evaluator-0").mkdir(parents=True)
    (run / "tasks" / "evaluator-0" / "result.json").write_text('{"accuracy": 0.5}')
    tasks = {t.name: t for t in summarize(run, warmup_steps=0).tasks}
    assert tasks["worker:1"].straggler and tasks["worker:1"].arrival_lateness_p50_s == pytest.approx(0.030)


# -- a real run's files (recorded: mwms x2, worker:1 killed at step ~150, group restart) ----------

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "mwms-restart"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_summary_trace_and_csv_of_a_recorded_run_with_a_restart(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    summary = summarize(run)
    steps = {t: records(run / "tasks" / t.replace(":", "-") / "steps.jsonl") for t in ("worker:0", "worker:1")}
    tasks = {t.name: t for t in summary.tasks}
    assert {n: t.steps for n, t in tasks.items()} == {n: len(r) for n, r in steps.items()}
    numbers = [r["step"] for r in steps["worker:0"]]
    redone = len(numbers) - len(set(numbers))
    assert redone > 0 and summary.steps_lost == redone, "steps redone after resuming from the checkpoint"
    [restart] = summary.restarts
    assert (restart.task, restart.cause, restart.scope) == ("worker:1", "signal", "group")
    resumed = min(r["start_us"] for rs in steps.values() for r in rs if r["start_us"] / 1e6 >= restart.time) / 1e6
    assert restart.downtime_s == pytest.approx(resumed - restart.time)
    assert restart.steps_lost == redone
    # worked out from the fixture's records by hand: worker:0 kept 3.118 s of steps (8 records redone)
    # in a 20.049 s window, and resumed 13.12 s after the fault
    assert summary.goodput == pytest.approx(3.1184 / 20.0490, abs=1e-4)
    assert summary.steps_lost == 8 and restart.downtime_s == pytest.approx(13.12, abs=0.01)
    samples = [r for r in records(run / "telemetry" / "localhost.jsonl") if r["type"] == "sample"]
    [host] = summary.hosts
    assert host.samples == len(samples) and host.gpus == () and "no NVIDIA GPU" in host.gpu_note
    # host CPU while training: the samples from the first step's start to the last step's end
    first = min(r["start_us"] for rs in steps.values() for r in rs) / 1e6
    last = max(r["start_us"] / 1e6 + r["duration_s"] for rs in steps.values() for r in rs)
    training = [r["cpu"] for r in samples if first <= r["t"] <= last]
    assert 3 <= len(training) < len(samples)
    assert host.cpu_util_mean == pytest.approx(sum(training) / len(training))
    rss = [r["procs"]["worker:0"][1] for r in samples if "worker:0" in r["procs"]]
    assert tasks["worker:0"].rss_peak_bytes == max(rss)
    trace = build_trace(run)["traceEvents"]
    assert sum(e["ph"] == "X" and e["cat"] == "step" for e in trace) == sum(len(r) for r in steps.values())
    [down] = [e for e in trace if e.get("cat") == "job"]  # recorded before ddlctl wrote its start: no start-up
    assert down["name"] == "restart downtime: worker:1 (signal)" and down["dur"] == pytest.approx(13.12e6, abs=1e4)
    # by cause, over the job's window (first step of any task to the last end: 20.051 s, 2 ms more
    # than worker:0's): the kept steps are goodput's 3.118 s, the restart its 13.12 s
    causes = summary.time_by_cause
    assert causes["wall_s"] == pytest.approx(20.051, abs=1e-3)
    # (the first step's time beyond the usual step: compile)
    assert causes["productive_s"] + causes["compile_s"] == pytest.approx(3.118, abs=1e-3) and causes["compile_s"] > 0
    assert causes["restart_s"] == pytest.approx(13.12, abs=0.01) and causes["startup_s"] == 0
    exclusive = ("compile_s", "productive_s", "redone_s", "checkpoint_s", "eval_s", "stalled_s", "restart_s",
                 "startup_s", "ending_s", "between_s", "other_s")
    assert sum(causes[k] for k in exclusive) == pytest.approx(causes["wall_s"], abs=0.01)
    instants = [e["name"] for e in trace if e["ph"] == "i"]
    assert instants == ["fault: worker:1 (signal)", "restart: worker:0, worker:1"]
    write_csv(summary, tmp_path / "csv")
    with open(tmp_path / "csv" / "tasks.csv") as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    assert {n: int(r["steps"]) for n, r in rows.items()} == {n: len(r) for n, r in steps.items()}


def test_a_hang_section_shows_whom_ddlctl_blamed_and_where_every_task_stood(tmp_path):
    from rich.console import Console

    from ddlctl.report.render import render_report

    run = tmp_path / "run"
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [0.1] * 20)
    write_steps(run, "worker:1", [0.1] * 20)
    hang = {"time": T0 + 30, "culprit": "worker:1", "why": "its main thread is in its own code at train.py:42 in cb",
            "threshold_s": 60.0, "rule": "the 60s floor", "idle_s": 61.5, "stacks": str(run / "hang" / "1"),
            "tasks": [{"task": "worker:0", "state": "waiting", "where": "waiting in TensorFlow (execute.py:53)",
                       "last_step": 20, "idle_s": 61.0},
                      {"task": "worker:1", "state": "user", "where": "train.py:42 in cb", "last_step": 20,
                       "idle_s": 61.5}]}
    left = {"task": "worker:1", "host": "h1", "pid": 4711, "where": "its process is blocked in the kernel (state D)"}
    (run / "outcome.json").write_text(json.dumps({"ok": False, "exit_code": 124, "tasks": [], "hangs": [hang],
                                                  "left_running": [left]}))
    summary = summarize(run)
    assert list(summary.to_dict()["hangs"]) == [hang] and summary.to_dict()["schema"] == 14
    assert list(summary.to_dict()["left_running"]) == [left]
    console = Console(record=True, width=200)
    render_report(summary, console)
    text = console.export_text()
    assert "hang 1: worker:1 blamed (its main thread is in its own code at train.py:42 in cb)" in text
    assert "waiting in TensorFlow (execute.py:53)" in text
    assert "noticed after 62s without progress (threshold 60s: the 60s floor)" in text
    assert "left running: worker:1 on h1 (pid 4711): SIGKILL could not end it (its process is blocked" in text
    assert "cpu %" not in text and "GPU busy %" not in text, "no telemetry figures: no such columns"
    # with what each task's process and GPU did over the stall: a column each
    hang["tasks"][0].update(cpu={"readings": 60, "cpu_mean": 0.4, "seconds": 61.0},
                            gpu={"host": "h1", "gpus": [0], "state": "busy", "readings": 60, "util_mean": 99.6,
                                 "seconds": 61.0})
    hang["tasks"][1].update(cpu={"readings": 60, "cpu_mean": 97.2, "seconds": 61.5}, gpu=None)
    (run / "outcome.json").write_text(json.dumps({"ok": False, "exit_code": 124, "tasks": [], "hangs": [hang]}))
    console = Console(record=True, width=200)
    render_report(summarize(run), console)
    text = console.export_text()
    rows = [line for line in text[text.index("hang 1:"):].splitlines() if "│ worker:" in line]
    assert [[cell.strip() for cell in row.split("│")[1:7]] for row in rows] == [
        ["worker:0", "waiting", "20", "61", "0", "100 (busy)"], ["worker:1", "user", "20", "62", "97", "-"]], rows


def test_what_holds_for_many_hosts_is_one_diagnosis_line_naming_them_with_the_range_of_figures(tmp_path):
    run = tmp_path / "run"
    hosts = [f"127.0.0.{i}:22300" for i in range(1, 9)]
    write_plan(run, "mwms", {f"worker:{i}": h for i, h in enumerate(hosts)}, hosts=hosts)
    for i, host in enumerate(hosts):
        write_steps(run, f"worker:{i}", [0.4] * 10)  # (4 s: every sample falls inside)
        write_telemetry(run, host, [10.0 + i] * 4, [2**30] * 4, cpu=91.0 + i)
    lines = summarize(run, warmup_steps=0).diagnosis
    saturated = [line for line in lines if line.startswith("CPU saturated")]
    assert saturated == [f"CPU saturated on 8 hosts ({', '.join(hosts)}): mean 91-98% (input pipeline, or too many "
                         "tasks for its cores)"]
    # with no step recorded, the mean covers start-up too: said, no cause guessed
    for i in range(8):
        (run / "tasks" / f"worker-{i}" / "steps.jsonl").unlink()
    unstepped = [line for line in summarize(run, warmup_steps=0).diagnosis if line.startswith("CPU saturated")]
    assert unstepped == [f"CPU saturated on 8 hosts ({', '.join(hosts)}): mean 91-98% over the whole run (no step "
                         "recorded to tell its start-up from its work)"]
    idle = [line for line in lines if "mostly idle" in line]
    assert idle == ["8 GPUs (" + ", ".join(f"{h} GPU 0" for h in hosts) + ") mostly idle: busy 10-17% of the time "
                    "(idle 83-90%)"]


def test_figures_and_names_of_a_grouped_line():
    assert figure_range([90.2, 97.4, 93]) == "90-97%" and figure_range([90.4, 89.6]) == "90%"
    assert named(["a"], "hosts") == "a" and named(["a", "b"], "hosts") == "2 hosts (a, b)"


def test_a_step_file_reads_the_same_whether_every_line_is_sound_or_one_is_cut(tmp_path):
    """Sound files, and files whose last line a killed task cut short, take the typed fast path
    (msgspec records); a cut line elsewhere the general one: the same columns either way, the cut
    line counted, optional fields missing read as -1."""
    from ddlctl.report.stepfile import read_steps

    lines = [json.dumps({"task": "chief:0", "step": 1, "start_us": 1_000_000, "duration_s": 0.5, "samples": 64,
                         "input_s": 0.1, "sync_s": 0.4, "worker": "worker:1", "total": 3}),
             json.dumps({"task": "chief:0", "step": 3, "start_us": 1_600_000, "duration_s": 0.25, "steps": 2,
                         "worker": "worker:0", "total": 4})]
    sound, cut = tmp_path / "sound.jsonl", tmp_path / "cut.jsonl"
    sound.write_text("\n".join(lines) + "\n")
    cut.write_text("\n".join(lines) + '\n{"task": "chief:0", "step": 4, "sta')
    middle = tmp_path / "middle.jsonl"
    middle.write_text(lines[0] + '\n{"task": "chief:0", "st\n' + lines[1] + "\n")
    fast, cut_last, general = read_steps(sound, "x"), read_steps(cut, "x"), read_steps(middle, "x")
    assert (fast.bad_lines, cut_last.bad_lines, general.bad_lines) == (0, 1, 1)
    for steps in (fast, cut_last, general):
        assert steps.name == "chief:0" and list(steps.step) == [1, 3] and list(steps.start_us) == [1_000_000, 1_600_000]
        assert list(steps.duration) == [0.5, 0.25] and list(steps.samples) == [64, -1]
        assert list(steps.input_s) == [0.1, -1.0] and list(steps.sync_s) == [0.4, -1.0]
        assert steps.block == 2 and steps.worker == ["worker:1", "worker:0"] and steps.total == 4
    odd = tmp_path / "odd.jsonl"  # a field of another type than ddlctl writes: the general path reads it
    odd.write_text(json.dumps({"step": 1, "start_us": 5.0e6, "duration_s": 1, "samples": 8.0}) + "\n")
    steps = read_steps(odd, "worker:0")
    assert (list(steps.step), list(steps.start_us), list(steps.samples), steps.bad_lines) == ([1], [5_000_000], [8], 0)


def test_membership_phases_split_the_run_at_each_change_with_its_own_steps_and_throughput():
    from array import array

    from ddlctl.report.membership import membership_phases
    from ddlctl.report.stepfile import TaskSteps

    def series(name: str, starts: list[float], samples: int) -> TaskSteps:
        return TaskSteps(name, step=array("q", range(1, len(starts) + 1)),
                         start_us=array("q", [int(t * 1e6) for t in starts]), duration=array("d", [0.5] * len(starts)),
                         samples=array("q", [samples] * len(starts)))

    # 3 workers of 32 step at 100..103 s; worker:2 leaves at 104 s; 2 workers of 48 step at 110..113 s
    steps = [series("worker:0", [100, 101, 102, 103, 110, 111, 112, 113], 0),
             series("worker:1", [100, 101, 102, 103, 110, 111, 112, 113], 0),
             series("worker:2", [100, 101, 102, 103], 32)]
    for s in steps[:2]:
        s.samples = array("q", [32] * 4 + [48] * 4)
    change = {"time": 104.0, "workers": ["worker:0", "worker:1"], "left": ["worker:2"], "why": "host gone",
              "cause": "host-lost"}
    before, after = membership_phases([change], ["worker:0", "worker:1", "worker:2"], steps, 100.0, 113.5)
    assert (before["workers"], before["why"], before["steps"]) == (["worker:0", "worker:1", "worker:2"], "start", 4)
    assert before["samples_per_s"] == pytest.approx(4 * 96 / 3.5)  # 100.0 to 103.5
    assert (after["workers"], after["why"], after["steps"], after["start"]) == (["worker:0", "worker:1"], "host gone",
                                                                                4, 104.0)
    assert after["samples_per_s"] == pytest.approx(4 * 96 / 3.5), "the restart before its first step not counted"
    # goodput: 4 steps of 0.5 s in steps, over each phase's whole time (its restart counted here)
    assert before["goodput"] == pytest.approx(2.0 / 4.0) and after["goodput"] == pytest.approx(2.0 / 9.5)
    assert membership_phases([], ["worker:0"], steps, 100.0, 113.5) == ()


def test_a_telemetry_file_reads_the_same_in_the_agents_arrays_or_an_older_agents_dicts(tmp_path):
    """The agent's own shape (GPU readings and task figures as arrays) takes the typed fast path,
    also with its last line cut short; dicts (older agents), a cut line elsewhere or a record of
    another type take the general one: the same columns either way, nulls left out where a GPU
    does not report a field, lines counted."""
    from ddlctl.report.hosts import _typed_records, host_summary, read_telemetry

    fields = ["index", "util", "sm_active", "mem_used", "power_w", "throttle"]
    readings = [[{"index": 0, "util": 90.0 + i, "sm_active": None, "mem_used": 2**30 * (i + 1), "power_w": 300.0,
                  "throttle": 0x4 if i % 2 else 0},
                 {"index": 3, "util": 10.0 * i, "sm_active": 5.0, "mem_used": 2**29, "power_w": None,
                  "throttle": None}] for i in range(4)]
    hello = {"type": "hello", "host": "h9", "interval": 0.5, "gpu_note": None, "gpu_fields": fields,
             "gpus": [{"index": 0, "name": "H100", "memory_total_bytes": 2**34, "power_limit_w": 700.0},
                      {"index": 3, "name": "A100", "memory_total_bytes": 2**33}]}

    def sample(i: int, arrays: bool) -> dict:
        gpus = [[g[f] for f in fields] if arrays else g for g in readings[i]]
        # today's agent: CPU %, RSS and the kernel's CPU %; an older one: a dict without the last
        figures = [50.0 + i, 1000 * (i + 1), 5.0 * i] if arrays else {"cpu": 50.0 + i, "rss": 1000 * (i + 1)}
        procs = {"worker:0": figures}
        return {"type": "sample", "t": T0 + 0.5 * i, "cpu": 20.0 * i, "mem_used": 100 + i, "mem_total": 1000,
                "net_sent": 10 * i, "net_recv": 20 * i, "procs": procs, "gpus": gpus, "steps": {}}

    def write(name: str, lines: list[str]) -> Path:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return path

    arrays = [json.dumps(hello), *(json.dumps(sample(i, True)) for i in range(4))]
    dicts = [json.dumps(hello), *(json.dumps(sample(i, False)) for i in range(4))]
    files = {"fast": (write("fast", arrays), 0),
             "cut_last": (write("cut_last", [*arrays, '{"type": "sample", "t": 17']), 1),
             "dicts": (write("dicts", dicts), 0),
             "cut_middle": (write("cut_middle", [*arrays[:2], '{"type": "sam', *arrays[2:]]), 1),
             "error_and_odd": (write("odd", [*arrays, '{"type": "error", "error": "nvml"}', '{"type": "x"}']), 1)}
    typed = {name for name, (path, _) in files.items() if _typed_records(path.read_bytes()) is not None}
    assert typed == {"fast", "cut_last"}
    summaries = {}
    for name, (path, bad) in files.items():
        series = read_telemetry(path)
        assert series.bad_lines == bad, name
        assert series.host == "h9" and series.interval == 0.5 and list(series.t) == [T0 + 0.5 * i for i in range(4)]
        assert list(series.cpu) == [0.0, 20.0, 40.0, 60.0] and list(series.mem) == [100, 101, 102, 103]
        kernel = [] if name == "dicts" else [0.0, 5.0, 10.0, 15.0]
        assert [list(c) for c in series.procs["worker:0"]] == [[50.0, 51.0, 52.0, 53.0], [1000, 2000, 3000, 4000],
                                                               kernel]
        gpu0, gpu3 = series.gpus[0], series.gpus[3]
        assert (gpu0.name, gpu3.name, gpu0.power_limit) == ("H100", "A100", 700.0)
        assert list(gpu0.values("util")) == [90.0, 91.0, 92.0, 93.0] and list(gpu0.values("sm_active")) == []
        assert list(gpu3.values("sm_active")) == [5.0] * 4 and list(gpu3.values("power_w")) == []
        assert list(gpu0.values("throttle")) == [0, 4, 0, 4] and list(gpu3.values("temp_c")) == []
        summaries[name] = host_summary(series, T0, T0 + 1.5)
    first = summaries["fast"]
    assert first.gpus[0].util_mean == 91.5 and first.gpus[0].mem_peak_bytes == 4 * 2**30
    assert first.gpus[0].power_capped_share == 0.5 and first.gpus[1].util_p5 == pytest.approx(1.5)
    assert first.cpu_util_mean == 30.0 and first.net_sent_bytes_per_s == 20.0 and first.gaps == ()
    assert all(s == first for s in summaries.values())


def test_arrival_lateness_and_straggler_wait_agree_in_columns_and_by_step():
    """Workers that recorded the same steps take the column path; one extra step on one worker (a
    step the others never recorded) takes the per-step one: the same figures over the common steps."""
    from array import array

    from ddlctl.report.arrivals import arrival_lateness, straggler_wait_of
    from ddlctl.report.stepfile import TaskSteps

    def worker(i: int, extra: bool) -> TaskSteps:
        steps = list(range(1, 41)) + ([41] if extra else [])
        sync = [0.1 + 0.01 * i + 0.001 * (s % 7) for s in steps]
        return TaskSteps(f"worker:{i}", step=array("q", steps), start_us=array("q", [s * 200_000 for s in steps]),
                         duration=array("d", [0.2] * len(steps)), samples=array("q", [32] * len(steps)),
                         input_s=array("d", [0.0] * len(steps)), sync_s=array("d", sync))

    same = [worker(i, False) for i in range(3)]
    ragged = [worker(0, False), worker(1, True), worker(2, False)]
    late, late_by_step = arrival_lateness(same, 5), arrival_lateness(ragged, 5)
    assert late == pytest.approx(late_by_step) and late["worker:2"] == pytest.approx(0.02)
    wait, wait_by_step = straggler_wait_of(same[0], same), straggler_wait_of(ragged[0], ragged)
    assert wait == pytest.approx(wait_by_step) == pytest.approx(40 * 0.02)


def test_hosts_whose_memory_came_near_full_are_named_with_their_peak_share(tmp_path):
    run = tmp_path / "run"
    hosts = ["h1", "h2", "h3"]
    write_plan(run, "mwms", {f"worker:{i}": h for i, h in enumerate(hosts)}, hosts=hosts)
    for i, (host, peak) in enumerate(zip(hosts, (0.95, 0.5, 0.92), strict=True)):
        write_steps(run, f"worker:{i}", [0.1] * 10)
        write_telemetry(run, host, [50.0] * 4, [2**30] * 4, host_mem_used=int(peak * 2**34))
    lines = [line for line in summarize(run, warmup_steps=0).diagnosis if line.startswith("memory nearly full")]
    assert lines == ["memory nearly full on 2 hosts (h1, h3): peak 92-95% of their memory (the kernel's OOM killer "
                     "ends a task when it is full: a smaller batch, fewer tasks on the host)"]


NO_CUDA_LINE = ("I0000 00:00:1795887448.080123   14602 cudart_stub.cc:31] Could not find cuda drivers on your "
                "machine, GPU will not be used.\n")  # (verbatim: TensorFlow 2.21 here)
DLOPEN_LINE = ("W0000 00:00:1795887448.480123   14602 gpu_device.cc:2342] Cannot dlopen some GPU libraries. Please "
               "make sure the missing libraries mentioned above are installed properly if you would like to use GPU. "
               "Follow the guide at https://www.tensorflow.org/install/gpu for how to download and setup the required "
               "libraries for your platform.\nSkipping registering GPU devices...\n")  # (its text: TF 2.21's library)


def test_tasks_whose_tensorflow_found_no_cuda_on_a_host_with_gpus_are_named_with_what_to_install(tmp_path):
    run = tmp_path / "run"
    # h1: a GPU NVML counted; h2: no GPU (the line is noise there); h3: gpus=2 declared, no telemetry
    write_plan(run, "mwms", {"worker:0": "h1", "worker:1": "h2", "worker:2": "h3", "worker:3": "h1"},
               hosts=["h1", "h2"])
    plan = json.loads((run / "plan.json").read_text())
    plan["cluster"]["hosts"].append({"name": "h3", "gpus": 2, "port": 22})
    (run / "plan.json").write_text(json.dumps(plan))
    for task in ("worker:0", "worker:1", "worker:2", "worker:3"):
        write_steps(run, task, [1.0] * 10)
        text = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n" + \
            (NO_CUDA_LINE if task != "worker:3" else "") + "loss 0.5\n"
        if task == "worker:2":  # (what TensorFlow says when it sets up its devices)
            text = DLOPEN_LINE + "loss 0.5\n"
        (run / "tasks" / task.replace(":", "-") / "output.log").write_text(text)
    write_telemetry(run, "h1", [0.0] * 6, [2**20] * 6)
    summary = summarize(run, warmup_steps=0)
    said = [line for line in summary.diagnosis if "found no CUDA" in line]
    assert said == ["TensorFlow found no CUDA and trained on the CPU in worker:0 on h1, worker:2 on h3 (\"Could not "
                    "find cuda drivers on your machine, GPU will not be used\"), though their hosts have GPUs (h1: 1, "
                    "h3: 2): that TensorFlow lacks its CUDA libraries: `pip install 'tensorflow[and-cuda]'` into the "
                    "tasks' Python there (`nvidia-smi` shows the driver; `python -c \"import tensorflow as tf; "
                    "print(tf.config.list_physical_devices('GPU'))\"` what TensorFlow sees)"]
    assert summary.diagnosis[0] == said[0]  # (first: it explains the idle GPU below it)
    assert any("GPU 0 on h1 mostly idle" in line for line in summary.diagnosis)
    # on CPU hosts alone, nothing is said
    for task in ("worker:0", "worker:2", "worker:3"):
        (run / "tasks" / task.replace(":", "-") / "output.log").write_text("loss 0.5\n")
    assert not any("found no CUDA" in line for line in summarize(run, warmup_steps=0).diagnosis)


def test_a_record_file_larger_than_the_report_reads_is_read_from_its_end_and_said(tmp_path, monkeypatch):
    from ddlctl.contract import runfolder
    from ddlctl.report.render import _throughput_line

    run = tmp_path / "run"
    write_plan(run, "one_device", {"worker:0": "h1"}, hosts=["h1"])
    write_steps(run, "worker:0", [0.1] * 200)
    monkeypatch.setattr(runfolder, "RECORDS_READ_MAX", 8192)
    summary = summarize(run, warmup_steps=0)
    size = (run / "tasks" / "worker-0" / "steps.jsonl").stat().st_size
    assert 0 < size - 8192 <= summary.unread_bytes < size - 8192 + 200
    assert summary.skipped_lines == 0 and summary.tasks[0].steps < 200
    assert "MiB at the start of record files not read" in _throughput_line(summary)
    assert summary.to_dict()["unread_bytes"] == summary.unread_bytes


def test_a_long_host_cell_the_same_on_every_row_is_said_once_under_the_table(tmp_path):
    # before: "no NVIDIA GPU (NVML: NVML Shared Library Not Found)" on every host's row
    from rich.console import Console

    from ddlctl.report.render import render_report, said_once

    run = tmp_path / "run"
    write_plan(run, "mwms", {f"worker:{i}": f"h{i}" for i in range(3)}, hosts=["h0", "h1", "h2"])
    note = "no NVIDIA GPU (NVML: NVML Shared Library Not Found)"
    for i in range(3):
        write_steps(run, f"worker:{i}", [0.1] * 5, host=f"h{i}")
        (run / "telemetry").mkdir(exist_ok=True)
        (run / "telemetry" / f"h{i}.jsonl").write_text(
            json.dumps({"type": "hello", "host": f"h{i}", "interval": 1.0, "gpu_note": note, "gpus": []}) + "\n"
            + json.dumps({"type": "sample", "t": T0, "cpu": 10.0}) + "\n")
    console = Console(record=True, width=200)
    render_report(summarize(run), console)
    text = console.export_text()
    assert text.count(note) == 1 and f"GPUs (*): {note}" in text, text
    assert said_once(["4", "4"]) == (["4", "4"], None), "short cells stay"
    assert said_once([note, "8"]) == ([note, "8"], None), "once is once"
