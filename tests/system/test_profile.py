"""Profiling real runs: steps, telemetry, stragglers, instrumentation, the report."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import PROGRAMS, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl

pytestmark = pytest.mark.cluster


def steps_of(run_dir, task):
    path = run_dir / "tasks" / task.replace(":", "-") / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_report_from_a_copied_run_directory_gives_the_same_answer(runs, tmp_path):
    # (what the report reads, not TensorFlow: tasks that listen and step 30 times without it)
    result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "2", "--runs-dir", str(runs), "--",
                        sys.executable, str(PROGRAMS / "idle_server.py"), "30")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    live = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "telemetry" / "localhost.jsonl").stat().st_size > 0, "launch collects telemetry too"
    copy = tmp_path / "elsewhere" / run_dir.name
    shutil.copytree(run_dir, copy)
    shutil.rmtree(run_dir)
    again = run_ddlctl("report", str(copy), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == live
    text = run_ddlctl("report", str(copy), "--csv", str(tmp_path / "csv"), "--trace", str(tmp_path / "t.json"))
    assert text.returncode == 0 and "worker:0" in text.stdout
    assert (tmp_path / "csv" / "tasks.csv").exists()
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_no_auto_steps_turns_the_hook_off(runs):
    result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "1", "--no-auto-steps", "--no-telemetry",
                        "--runs-dir", str(runs), "--", sys.executable, str(PROGRAMS / "fit_program.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert steps_of(only_run_dir(runs), "worker:0") == []
    done = [json.loads(line.split("FIT_DONE ", 1)[1]) for line in result.stdout.splitlines() if "FIT_DONE " in line]
    assert done and not any(d["hooked"] for d in done), "model.fit ran, and ran without ddlctl's hook"


def test_custom_loop_with_ddlctl_step(runs):
    result = run_ddlctl("launch", "--strategy", "one_device", "--trace", "10-14", "--tensorboard", "--runs-dir",
                        str(runs), "--", sys.executable, str(PROGRAMS / "custom_loop.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    records = steps_of(run_dir, "worker:0")
    assert [r["step"] for r in records] == list(range(1, 26))
    assert {r["samples"] for r in records} == {8}
    # --trace 10-14: ddlctl.step's steps 10 to 14 exactly, each marked in the trace (XProf's step view)
    from ddlctl.report.traces import xplane_module

    assert json.loads((run_dir / "tasks" / "worker-0" / "capture.json").read_text())["steps"] == [10, 14]
    space = xplane_module().XSpace()
    space.ParseFromString((run_dir / "profile" / "plugins" / "profile" / "steps-10-14" / "worker-0.xplane.pb")
                          .read_bytes())
    marked = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                if plane.event_metadata[event.metadata_id].name == "train":
                    marked += [s.int64_value or s.uint64_value for s in event.stats
                               if plane.stat_metadata[s.metadata_id].name == "step_num"]
    assert sorted(marked) == [10, 11, 12, 13, 14]
    # --tensorboard: the step times by step beside the profile, read back with TensorFlow
    import tensorflow as tf

    assert f"tensorboard --logdir {run_dir / 'profile'}" in " ".join(result.stderr.split())
    [events] = (run_dir / "profile" / "worker-0").glob("events.out.tfevents.*")
    scalars = {}
    for record in tf.data.TFRecordDataset(str(events)):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    assert sorted(scalars["step_time_s"]) == list(range(1, 26))
    assert scalars["step_time_s"] == pytest.approx({r["step"]: r["duration_s"] for r in records}, rel=1e-5)
    assert scalars["samples_per_s"][5] == pytest.approx(8 / records[4]["duration_s"], rel=1e-5)
    assert list((run_dir / "profile" / "host-localhost").glob("events.out.tfevents.*"))


def test_a_task_crashed_while_its_profiler_captures_is_started_again_once_tracing_off_no_restart_counted(runs):
    """TensorFlow's profiler crashes a task it captures now and then (SIGSEGV; SIGABRT "munmap_chunk():
    invalid pointer"): ddlctl's diagnostics must not cost the job. Caused for real: the task gets a
    SIGSEGV while its capture is open; --max-restarts 0, and the job still completes. (The scope of
    the restart is the strategy's: a group under mwms, tests/unit/test_policy.py.)"""
    from ddlctl.testing.faults import Job, wait_for

    job = Job(runs, "-s", "one_device", "--trace", "5-60", "--max-restarts", "0", "--no-telemetry", "--grace", "2",
              "--", sys.executable, str(PROGRAMS / "custom_loop.py"), "80", "0.05")
    marker = job.run_dir / "tasks" / "worker-0" / "profiling.json"
    wait_for(lambda: marker.exists() or job.proc.poll() is not None, 120, "worker:0's capture to begin")
    assert json.loads(marker.read_text())["session"] == "steps-5-60"
    job.kill("worker-0", signal.SIGSEGV)
    assert job.wait() == 0, job.stderr()[-3000:]
    said = " ".join(job.stderr().split())
    assert "worker:0 on localhost killed by SIGSEGV while TensorFlow's profiler was capturing it (steps-5-60)" \
        in said and "starting worker:0 again, once, with tracing off (no restart counted)" in said
    outcome = job.outcome()
    [event] = outcome["restarts"]
    assert (event["cause"], event["scope"], event["tasks"]) == ("profiler-crash", "task", ["worker:0"])
    assert {t["name"]: t["restarts"] for t in outcome["tasks"]} == {"worker:0": 1}
    folder = job.run_dir / "tasks" / "worker-0"  # started again from step 1, through step 5: tracing off
    assert not (folder / "capture.json").exists() and not (folder / "profiling.json").exists()
    assert (folder / "output.log").read_text().count("CUSTOM_DONE") == 1
    assert [r["step"] for r in steps_of(job.run_dir, "worker:0")][-80:] == list(range(1, 81))
    notes = json.loads((job.run_dir / "summary.json").read_text())["traces"]["notes"]
    assert notes == ["worker:0: TensorFlow's profiler crashed it (killed by SIGSEGV while its profiler captured "
                     "steps-5-60): ddlctl started worker:0 again with tracing off; the capture is lost"]
    wait_for(lambda: not processes_of_run(job.run_dir.name), 15, "every process of the run to end")


def test_agent_death_leaves_a_gap_and_the_job_goes_on(runs):
    # (the telemetry agent is the subject, not TensorFlow: a task that steps for 6 s without it)
    proc = subprocess.Popen(
        ddlctl_cmd("launch", "--strategy", "one_device", "--sample-interval", "0.3", "--runs-dir", str(runs),
                   "--", sys.executable, str(PROGRAMS / "idle_server.py"), "60"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            dirs = list(runs.iterdir())
            if dirs and (dirs[0] / "tasks" / "worker-0" / "steps.jsonl").exists():
                break
            time.sleep(0.2)
        run_id = only_run_dir(runs).name
        agents = [p for p in processes_of_run(run_id)
                  if any("ddlctl.host.telemetry" in part for part in p.cmdline())]
        assert len(agents) == 1
        agents[0].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run_dir = only_run_dir(runs)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["ok"] and "telemetry agent on localhost stopped (killed by SIGKILL)" in outcome["telemetry_gaps"][0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("telemetry" in line for line in summary["diagnosis"])
    assert "telemetry agent on localhost stopped" in out


def test_a_capture_starts_after_step_a_minus_1_and_covers_only_steps_begun_after_its_start(tmp_path):
    import tensorflow as tf  # (the real profiler, in this process)

    from ddlctl.report.traces import xplane_module
    from ddlctl.task.trace import AutoCapture, Capture, parse_steps

    assert parse_steps("20-30") == (20, 30) and parse_steps(" 7 ") == (7, 7)
    for bad in ("30-20", "0-3", "a-b", ""):
        with pytest.raises(ValueError, match="100-110"):
            parse_steps(bad)
    capture = Capture(20, 30, str(tmp_path / "profile"))
    for step in range(1, 19):
        capture.after(step, 1, float(step))
    assert capture.state == "waiting" and not (tmp_path / "profile").exists()
    capture.after(19, 1, 19.0)  # a block of 19-24 recorded together: 20-24 ran before the start
    for step in range(20, 25):
        capture.after(step, 1, 19.0 + (step - 19) * 0.01)
    assert capture.state == "tracing"
    tf.reduce_sum(tf.ones((64, 64)) @ tf.ones((64, 64)))
    for step in range(25, 33):  # the next block, after the start
        capture.after(step, 1, capture.began[1] + step)
    record = json.loads((tmp_path / "capture.json").read_text())
    assert capture.state == "done" and record["steps"] == [25, 30] and record["asked"] == [20, 30]
    assert record["file"] == "capture.xplane.pb" and not (tmp_path / "profile").exists()  # (moved up)
    space = xplane_module().XSpace()
    space.ParseFromString((tmp_path / record["file"]).read_bytes())
    assert any(plane.name == "/host:CPU" for plane in space.planes)
    # --trace auto: a request in the task folder starts a capture after the next step, of its steps
    auto_dir = tmp_path / "auto"
    auto_dir.mkdir()
    auto = AutoCapture(str(auto_dir), watch=False)  # (its thread's look, called here)
    request = auto_dir / "trace-request.json"
    for bad in ('{"id": 0}', '{"id": 1, "steps": 5000}', '{"id": 1, "seconds": -1}', '{"id": 1, "now": 1}', "[1]",
                "{"):
        request.write_text(bad)
        auto.look()
        auto.after(1, 1, 1.0)
        assert auto.state == "idle" and auto.pending is None, bad
    request.write_text(json.dumps({"id": 1, "from": 42, "steps": 3, "seconds": 30, "why": "worker:0 is a straggler"}))
    auto.look()
    auto.after(39, 1, 39.0)
    assert not request.exists() and auto.state == "waiting"  # (taken: a task started again does not retake it)
    auto.after(40, 1, 40.0)
    assert auto.state == "waiting"
    auto.after(41, 1, 41.0)  # (from step 42: after step 41)
    assert auto.state == "tracing"
    for step in range(42, 45):
        tf.reduce_sum(tf.ones((64, 64)) @ tf.ones((64, 64)))
        auto.after(step, 1, auto.current.began[1] + step)
    record = json.loads((auto_dir / "capture-auto-1.json").read_text())
    assert auto.state == "done" and record["steps"] == [42, 44] and record["asked"] == [42, 44]
    assert record["session"] == "auto-1" and record["why"] == "worker:0 is a straggler"
    assert record["file"] == "capture-auto-1.xplane.pb" and (auto_dir / record["file"]).stat().st_size > 0
    request.write_text(json.dumps({"id": 1}))  # the same request again: not taken twice
    auto.look()
    auto.after(50, 1, 50.0)
    assert auto.current.name == "auto-1" and auto.state == "done"
    # a capture "now" (a task near its hang threshold): for its seconds, whether steps come or not
    request.write_text(json.dumps({"id": 2, "now": True, "seconds": 0.5, "why": "worker:0 has made no progress"}))
    auto.look()
    record = json.loads((auto_dir / "capture-auto-2.json").read_text())
    assert record["asked"] == [51, 51] and record["steps"] == [51, 50] and record["why"].endswith("no progress")
    assert 0.5 <= record["end_s"] - record["start_s"] < 1.5 and (auto_dir / record["file"]).stat().st_size > 0



def test_trace_captures_every_workers_own_steps_for_xprof_and_names_the_input_bound_one_beside_its_peer(runs):
    # mwms, 2 workers: worker:1's tf.data map takes 150 ms a batch (steps of 16 examples take ~10 ms
    # alone): it waits for its input and worker:0 waits for it in the all-reduce; the step records
    # alone show both slow. (The wait costs no CPU: a loaded machine lengthens the compute, not the
    # wait; with 60 ms and batches of 64, four test files beside it made worker:1's input share 11%.)
    for attempt in (1, 2):
        folder = runs / f"try{attempt}"
        result = run_ddlctl("profile", "-s", "mwms", "--workers", "2", "--trace", "30-40", "--runs-dir", str(folder),
                            "--", sys.executable, "-m", "ddlctl.workloads", "--steps", "50", "--batch-size", "16",
                            "--slow-task", "worker:1", "--slow-input-ms", "150")
        # TensorFlow 2.21's profiler, capturing a tf.data numpy_function, once ended worker:1 with
        # "munmap_chunk(): invalid pointer" (SIGABRT, exit 134) in the capture: TensorFlow's crash,
        # said as such by ddlctl; tried again once (see the closing note of 2026-12-02)
        if result.returncode not in (134, 139) or attempt == 2:
            break
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(folder)
    from ddlctl.report.traces import xplane_module

    session = run_dir / "profile" / "plugins" / "profile" / "steps-30-40"
    assert sorted(p.name for p in session.iterdir()) == ["worker-0.xplane.pb", "worker-1.xplane.pb"]
    for worker in ("worker:0", "worker:1"):
        capture = json.loads((run_dir / "tasks" / worker.replace(":", "-") / "capture.json").read_text())
        first, last = capture["steps"]
        assert 30 <= first <= last and last >= 40, capture
        records = {r["step"]: r for r in steps_of(run_dir, worker)}
        # the capture ran from before its first step began to after its last ended (the task's own
        # steps: a block's later steps that ran before the start are not counted as captured)
        assert records[first - 1]["start_us"] / 1e6 <= capture["start_s"] <= records[first]["start_us"] / 1e6 + 1e-3
        assert records[last]["start_us"] / 1e6 + records[last]["duration_s"] - 1e-3 <= capture["end_s"]
        space = xplane_module().XSpace()
        space.ParseFromString((session / f"{worker.replace(':', '-')}.xplane.pb").read_bytes())
        assert any(plane.name == "/host:CPU" and len(plane.lines) > 3 for plane in space.planes)
    traces = json.loads((run_dir / "summary.json").read_text())["traces"]
    assert [t["task"] for t in traces["tasks"]] == ["worker:0", "worker:1"]
    for task in traces["tasks"]:
        assert sum(task["parts"].values()) == pytest.approx(task["wall_s"], abs=1e-5)  # (each rounded to 1 us)
        assert any("Conv2D" in op for op, _ in task["top_ops"])
    shares = {t["task"]: {k: v / t["wall_s"] for k, v in t["parts"].items()} for t in traces["tasks"]}
    assert shares["worker:1"]["input"] > 0.3 > shares["worker:0"]["input"], shares
    assert shares["worker:0"]["collective"] > 0.3, shares  # (waiting for worker:1 at each all-reduce)
    assert traces["comparison"].startswith("worker:1 is input-bound in its capture: ") and "on worker:0" in \
        traces["comparison"], traces["comparison"]
    assert traces["comparison"] in " ".join(result.stdout.split())
    assert f"xprof --logdir {run_dir / 'profile'}" in " ".join(result.stdout.split())
    bad = run_ddlctl("profile", "-s", "mwms", "--trace", "30-20", "--runs-dir", str(runs))
    assert bad.returncode == 2 and "--trace '30-20'" in bad.stderr and "Traceback" not in bad.stderr

