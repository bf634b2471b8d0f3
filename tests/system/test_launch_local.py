"""Real TensorFlow clusters on localhost, launched and supervised by the real ddlctl command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import PROGRAMS, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl

pytestmark = pytest.mark.cluster
STEPS = "40"


def read_steps(task_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (task_dir / "steps.jsonl").read_text().splitlines()]


def assert_nothing_left(run_dir: Path) -> None:
    assert processes_of_run(run_dir.name) == [], "processes of the run are still alive"


def check_trained(run_dir: Path, tasks: list[str], steps_run: str = STEPS) -> None:
    for name in tasks:
        folder = run_dir / "tasks" / name.replace(":", "-")
        steps = read_steps(folder)
        assert [s["step"] for s in steps] == list(range(1, int(steps_run) + 1))
        assert {s["task"] for s in steps} == {name}
        result = json.loads((folder / "result.json").read_text())
        assert result["accuracy"] > 0.5, "chance is 1/8: the model must have learned"
        assert "final loss" in (folder / "output.log").read_text()


PS_STEPS = "120"  # asynchronous updates from two workers need more steps than synchronous ones


def test_ps_chief_two_workers_one_ps_train_and_the_evaluator_evaluates_checkpoints(runs):
    # --json: summary.json alone on stdout; task output and the summary table on stderr
    result = run_ddlctl("launch", "--strategy", "ps", "--workers", "2", "--ps", "1", "--evaluator",
                        "--steps", PS_STEPS, "--runs-dir", str(runs), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [t["name"] for t in plan["tasks"]] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    check_trained(run_dir, ["chief:0"], PS_STEPS)
    # workers and ps ran ddlctl's server and were stopped when the chief finished
    for name in ("worker-0", "worker-1", "ps-0"):
        assert "ddlctl server:" in (run_dir / "tasks" / name / "output.log").read_text()
    assert "[chief:0@localhost] final loss" in result.stderr
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["unjoined"] == [], "the chief of a ps program joins its cluster"
    assert {t["name"]: t["state"] for t in outcome["tasks"]} == {
        "chief:0": "succeeded", "worker:0": "stopped", "worker:1": "stopped", "ps:0": "stopped",
        "evaluator:0": "stopped"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert json.loads(result.stdout) == summary
    assert summary["throughput_samples_per_s"] > 0
    assert f"throughput {summary['throughput_samples_per_s']:,.0f} samples/s" in result.stderr
    # every task accounted for: the steps each worker ran, its share and busy time
    work = {w["task"]: w for w in summary["work"]}
    assert set(work) == {"worker:0", "worker:1"} and summary["work_note"] is None
    assert sum(w["steps"] for w in work.values()) == int(PS_STEPS)
    assert all(w["busy_s"] > 0 and 0 < w["busy_fraction"] <= 1.0 for w in work.values() if w["steps"]), work
    assert re.search(r"worker:0\s+│\s+localhost\s+│\s+stopped\s+│\s+\d+ ran", result.stderr)
    assert "work per worker" in result.stderr
    # the side-car evaluator: outside the cluster spec, it evaluated at least one of the chief's
    # checkpoints with figures a model can have, and was stopped after training
    evaluator = next(t for t in plan["tasks"] if t["name"] == "evaluator:0")
    assert evaluator["tf_config"]["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" not in evaluator["tf_config"]["cluster"]
    assert list((run_dir / "checkpoints").glob("ckpt-*.index")), "the chief saved checkpoints"
    lines = re.findall(r"evaluator: (ckpt-\d+) loss ([\d.]+) accuracy ([\d.]+)",
                       (run_dir / "tasks" / "evaluator-0" / "output.log").read_text())
    assert lines, "no evaluation line from the evaluator"
    assert all(float(loss) > 0 and 0 <= float(accuracy) <= 1 for _ckpt, loss, accuracy in lines), lines
    assert_nothing_left(run_dir)


def test_mwms_two_workers_train_in_lockstep(runs):
    result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "2", "--steps", STEPS,
                        "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    check_trained(run_dir, ["worker:0", "worker:1"])
    results = [json.loads((run_dir / "tasks" / f"worker-{i}" / "result.json").read_text())
               for i in (0, 1)]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"]), "synchronous replicas agree"
    assert read_steps(run_dir / "tasks" / "worker-0")[0]["samples"] == 32, "64 split over 2"
    # model FLOPs of the built-in cnn (worked out by hand in test_mfu.py); no GPU here: MFU n/a
    mfu = json.loads((run_dir / "summary.json").read_text())["mfu"]
    assert [(r["task"], r["train_flops_per_sample"], r["note"]) for r in mfu] == [
        ("worker:0", 3 * 1_172_864, "n/a: no GPU (CPU host)"), ("worker:1", 3 * 1_172_864, "n/a: no GPU (CPU host)")]
    assert all(r["achieved_flops_per_s"] > 0 for r in mfu)
    assert "model FLOPs 3.52 MFLOP/sample (3 x forward); achieved worker:0 " in result.stdout
    assert "MFU n/a: no GPU (CPU host)" in result.stdout
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["unjoined"] == [] and "cluster up: every task is listening" in result.stderr
    assert_nothing_left(run_dir)


@pytest.mark.parametrize("strategy", ["mwms", "ps"])
def test_a_one_machine_program_trains_alone_and_it_is_said(runs, strategy):
    # MirroredStrategy, not the strategy of -s: every mwms worker "succeeds" with a model of its own;
    # a ps chief trains while its worker and ps task wait idle
    result = run_ddlctl("launch", "-s", strategy, "--workers", "2" if strategy == "mwms" else "1", "--no-telemetry",
                        "--runs-dir", str(runs), "--", sys.executable, str(PROGRAMS / "trains_alone.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    shown = sorted(line.split("]")[0] for line in result.stdout.splitlines() if "TRAINED_ALONE" in line)
    assert shown in ((["[worker:0-1@localhost"], ["[worker:0@localhost", "[worker:1@localhost"]) if strategy == "mwms"
                     else (["[chief:0@localhost"],)), shown
    said = ("worker:0, worker:1 took steps without listening on their ports (TF_CONFIG): their program did not join "
            "the mwms cluster (it creates no tf.distribute.MultiWorkerMirroredStrategy, or not from TF_CONFIG): each "
            "worker trains alone, on its own copy of the model") if strategy == "mwms" else (
        "chief:0 took steps without listening on its port (TF_CONFIG): its program did not join the ps cluster "
        "(it creates no tf.distribute.ParameterServerStrategy, or not from TF_CONFIG): the workers and ps tasks "
        "waited idle")
    assert f"• {said}" in result.stdout  # in the report: every one of them, in one line
    # said as found: both at once, or each when its first step was 2 s old (under load, apart)
    for who in ("worker:0", "worker:1") if strategy == "mwms" else ("chief:0",):
        assert re.search(rf"ddlctl: [^\n]*\b{who}\b[^\n]* took steps without listening", result.stderr), who
    assert "cluster up" not in result.stderr
    run_dir = only_run_dir(runs)
    assert json.loads((run_dir / "outcome.json").read_text())["unjoined"] == (
        ["worker:0", "worker:1"] if strategy == "mwms" else ["chief:0"])
    assert_nothing_left(run_dir)


@pytest.mark.parametrize("strategy", ["ps", "mwms"])
def test_model_fit_at_work_between_its_step_records_is_not_a_hang(runs, strategy):
    # ps: an epoch is one record (no batch callbacks there), 2 epochs of ~9 s; mwms: quick steps,
    # then an evaluation of ~9 s. Both longer than --hang-timeout: hung, exit 124, before the
    # hook's beats (a ps closure done, an evaluation batch) counted as progress
    # mwms under profile: its live lines (every 5 s here, not a terminal) show the ~16 s evaluation
    # after the first epoch as work, not as a stall
    args = ("2", "110", "80") if strategy == "ps" else ("2", "5", "80", "200")
    command = ("launch", "--no-telemetry") if strategy == "ps" else ("profile",)
    # (mwms: 8 s, half its evaluation; at 6 s, beside two CPU hogs and four test workers, a gap
    # without a step or a beat went past it once, a worker in model.fit and its peer in an all-reduce)
    timeout = "6" if strategy == "ps" else "8"
    result = run_ddlctl(*command, "-s", strategy, "--workers", "1" if strategy == "ps" else "2", "--hang-timeout",
                        timeout, "--runs-dir", str(runs), "--",
                        sys.executable, str(PROGRAMS / "fit_slow.py"), *args, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FIT_SLOW_DONE" in result.stdout and "hang:" not in result.stderr
    if strategy == "mwms":
        live = [line for line in result.stdout.splitlines() if line.startswith("ddlctl live |")]
        assert any(re.search(r"worker:0 5 steps \(at work, none for 1\ds\) ", line) for line in live), live
        # the time so far by cause, live: the evaluation counted as it ran
        assert any(re.search(r"time: .*evaluation \d+%", line) for line in live), live
    trainer = "chief-0" if strategy == "ps" else "worker-0"
    phases = [json.loads(line) for line in
              (only_run_dir(runs) / "tasks" / trainer / "phases.jsonl").read_text().splitlines()]
    beats = [p["t"] for p in phases if "beat" in p]
    assert len(beats) >= 8 and {p["beat"] for p in phases if "beat" in p} == {"train" if strategy == "ps" else "eval"}
    assert max(b - a for a, b in zip(beats, beats[1:], strict=False)) < 3, "a beat a second while at work"
    if strategy == "mwms":  # its validation is an eval phase: the report's time by cause counts it
        [validation] = [p for p in phases if p.get("phase") == "eval"]
        assert validation["duration_s"] > 5 and "open" not in validation
        causes = json.loads((only_run_dir(runs) / "summary.json").read_text())["time_by_cause"]
        assert causes["eval_s"] > 5 and "evaluation" in causes["line"]
    assert_nothing_left(only_run_dir(runs))


@pytest.mark.parametrize("strategy", ["ps", "mwms"])
def test_model_fit_program_works_with_tf_keras(runs, strategy):
    balance = ["--balance", "speed"] if strategy == "mwms" else []  # model.fit cannot be balanced: told so
    workers = "1" if strategy == "ps" else "2"  # (under ps the chief fits: one worker is enough)
    result = run_ddlctl("launch", "--strategy", strategy, "--workers", workers, "--runs-dir", str(runs), *balance,
                        "--", sys.executable, str(PROGRAMS / "fit_program.py"))
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    done = [line for line in result.stdout.splitlines() if "FIT_DONE" in line]
    # mwms: both replicas print the same line, shown once for both (or once each when far apart)
    assert sorted(line.split("]")[0] for line in done) in (
        [["[chief:0@localhost"]] if strategy == "ps" else
        [["[worker:0-1@localhost"], ["[worker:0@localhost", "[worker:1@localhost"]]), done
    report = json.loads(done[0].split("FIT_DONE ", 1)[1])
    assert report["keras"].startswith("tf_keras") and report["strategy"] == strategy
    assert report["loss"][-1] < report["loss"][0]
    # step timings without code changes: ddlctl's model.fit hook recorded them
    assert report["hooked"], "the records came from ddlctl's model.fit hook"
    trainer = "chief-0" if strategy == "ps" else "worker-1"
    records = [json.loads(line) for line in
               (only_run_dir(runs) / "tasks" / trainer / "steps.jsonl").read_text().splitlines()]
    if strategy == "ps":  # tf-keras refuses batch callbacks under ps: a record per closure its worker finished
        assert [r["step"] for r in records] == list(range(1, 61)) and {r["worker"] for r in records} == {"worker:0"}
        # samples too: the batch of the dataset its DatasetCreator made (before: null, no samples/s)
        assert {r["samples"] for r in records} == {32}, records[:3]
    else:
        assert len(records) == 60 and records[-1]["step"] == 60, "3 epochs x 20 steps"
    assert all(r["duration_s"] > 0 for r in records)
    # and the model's FLOPs, also without code changes: Dense 8x16 and 16x2, 2 FLOPs a multiply-add, x3
    flops = json.loads((only_run_dir(runs) / "tasks" / trainer / "flops.json").read_text())
    assert flops["train_flops_per_sample"] == 3 * 2 * (8 * 16 + 16 * 2)
    assert_nothing_left(only_run_dir(runs))
    if balance:
        assert "--balance speed cannot balance model.fit" in result.stdout
        summary = json.loads((only_run_dir(runs) / "summary.json").read_text())
        assert any("--balance speed had no effect" in line for line in summary["diagnosis"])


def test_crashing_task_is_the_root_cause_and_everything_stops(runs):
    started = time.monotonic()
    result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "3", "--grace", "2",
                        "--runs-dir", str(runs), "--", sys.executable,
                        str(PROGRAMS / "crash_program.py"), timeout=120)
    assert result.returncode == 7
    assert time.monotonic() - started < 60
    assert "worker:1 on localhost failed: exit code 7" in result.stderr
    assert "RuntimeError: disk full on purpose" in result.stderr
    run_dir = only_run_dir(runs)
    error = json.loads((run_dir / "tasks" / "worker-1" / "error.json").read_text())
    assert error["exit_code"] == 7 and error["traceback"][-1] == "RuntimeError: disk full on purpose"
    assert not (run_dir / "tasks" / "worker-0" / "error.json").exists()
    outcome = json.loads((run_dir / "outcome.json").read_text())
    states = {t["name"]: t["state"] for t in outcome["tasks"]}
    assert states == {"worker:0": "stopped", "worker:1": "failed", "worker:2": "stopped"}
    assert_nothing_left(run_dir)


def test_sigint_stops_every_task_within_10s(runs):
    proc = subprocess.Popen(
        ddlctl_cmd("launch", "--strategy", "ps", "--workers", "1", "--steps", "100000",
                   "--runs-dir", str(runs)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # wait until training is under way
            if "cluster up" in line:
                break
        run_dir = only_run_dir(runs)
        deadline = time.monotonic() + 60
        while not (run_dir / "tasks" / "chief-0" / "steps.jsonl").exists():
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        assert len(processes_of_run(run_dir.name)) >= 4, "3 tasks and the host agent"
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rest = proc.communicate(timeout=30)[0]
        gone = time.monotonic()
        while processes_of_run(run_dir.name) and time.monotonic() - sent < 10:
            time.sleep(0.1)
        assert processes_of_run(run_dir.name) == []
        assert gone - sent < 10
        assert proc.returncode == 130
        assert "interrupted by SIGINT" in rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_program_that_is_not_there_or_a_command_not_found_is_not_started_said_and_not_retried(runs, tmp_path):
    cases = ((("python", str(tmp_path / "nowhere" / "train.py")), 2,
              f"failed: not started: the program {tmp_path / 'nowhere' / 'train.py'} is not on "),
             (("no-such-command-here",), 127, "failed: not started: cannot start 'no-such-command-here': No such file "
                                              "or directory"))
    for command, code, said in cases:
        started = time.monotonic()
        result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "2", "--max-restarts", "2", "--runs-dir",
                            str(runs / str(code)), "--", *command, timeout=120)
        assert result.returncode == code and said in result.stderr, result.stderr[-2000:]
        assert "not retried: it would not start again" in result.stderr and "restarting" not in result.stderr
        assert time.monotonic() - started < 30, "refused by the host agent: nothing imported TensorFlow"
        assert_nothing_left(only_run_dir(runs / str(code)))


def test_a_bare_python_in_the_command_runs_as_the_python_the_hosts_file_names(runs, tmp_path):
    """``-- python prog.py`` on a host with ``python=``: that interpreter runs prog.py (before, the
    ``python`` on the host's PATH did), said once. The host's Python here: a virtual environment of
    its own that sees this one's packages (a .pth), so that it has TensorFlow."""
    other = tmp_path / "hostpy"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=120)
    site = subprocess.run([str(other / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip()
    mine = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "ours.pth").write_text(mine + "\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"localhost python={other / 'bin' / 'python'}\n")
    result = run_ddlctl("launch", "--hosts", str(hosts), "-s", "one_device", "--no-telemetry", "--runs-dir",
                        str(runs), "--", "python", "-c", "import sys; print('ran under', sys.executable)", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"ran under {other / 'bin' / 'python'}" in result.stdout, result.stdout[-2000:]
    assert result.stderr.count(f"'python' in the command is run as {other / 'bin' / 'python'} on localhost "
                               "(python= in the hosts file)") == 1, result.stderr[-2000:]


def test_a_program_whose_python_lacks_a_module_is_told_which_python_ran_it_and_given_ddlctls_own(runs, tmp_path):
    """The most common first failure: ``-- python train.py`` with a ``python`` that is not the
    environment with TensorFlow (here a fresh virtual environment without this one's packages)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    (tmp_path / "train.py").write_text("import typer\n")  # (ddlctl's own dependency: its Python has it)
    python = str(bare / "bin" / "python")
    result = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--max-restarts", "2", "--runs-dir", str(runs),
                        "--", python, "train.py", "--epochs", "2", cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    said = result.stderr.replace("\n", " ")
    assert f"worker:0 on localhost failed: exit code 1 after a Python exception: it cannot import typer: the Python " \
           f"it ran under, `{python}` on localhost, does not have it; ddlctl's own Python there does " \
           f"({sys.executable}): give that one after -- (`-- {sys.executable} train.py --epochs 2`), or activate " \
           "its environment before starting ddlctl; not retried: the same Python would not find it again" in said, \
        said[-2000:]
    error = json.loads((only_run_dir(runs) / "tasks" / "worker-0" / "error.json").read_text())
    assert error["cause"] == "no-module" and "restarting" not in result.stderr
    # a module to run (-m) that is not in the task's folder: where it looked
    other = tmp_path / "elsewhere"
    other.mkdir()
    result = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(tmp_path / "runs-m"),
                        "--", sys.executable, "-m", "train", cwd=other, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    said = result.stderr.replace("\n", " ")
    assert f"worker:0 on localhost failed: exit code 1: its Python found no module train to run (-m): tasks run in " \
           f"{other} on localhost, where `python -m` looks for train first" in said, said[-2000:]


def test_a_host_with_gpus_whose_tensorflow_has_no_cuda_is_told_why_it_trained_on_the_cpu(runs, tmp_path):
    """This machine's TensorFlow has no CUDA libraries; a hosts file declaring a GPU here makes it the
    GPU host whose TensorFlow cannot use it. The notice TensorFlow prints while it is imported (by
    the zygote, for a forked task) reaches the task's log and the report names the task."""
    from ddlctl.host import prefork

    if prefork.gpu_host():
        pytest.skip("this machine has a GPU: its TensorFlow may well find CUDA")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost gpus=1\n")
    program = tmp_path / "train.py"
    program.write_text("import ddlctl\nimport tensorflow as tf\n\nfor _ in range(5):\n    with ddlctl.step():\n"
                       "        tf.reduce_sum(tf.ones((8, 8))).numpy()\n")
    result = run_ddlctl("launch", "--hosts", str(hosts), "-s", "one_device", "--no-telemetry", "--runs-dir", str(runs),
                        "--", sys.executable, str(program), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    said = (result.stdout + result.stderr).replace("\n", " ")
    assert "TensorFlow found no CUDA and trained on the CPU in worker:0 on localhost (\"Could not find cuda drivers " \
           "on your machine, GPU will not be used\"), though its host has GPUs (localhost: 1)" in said, said[-3000:]
    task_dir = only_run_dir(runs) / "tasks" / "worker-0"
    assert json.loads((task_dir / "pid.json").read_text())["forked"] is True


def test_startup_timeout_names_the_task_that_never_joined(runs):
    result = run_ddlctl("launch", "--strategy", "mwms", "--workers", "2", "--startup-timeout",
                        "10", "--grace", "1", "--runs-dir", str(runs), "--", sys.executable,
                        str(PROGRAMS / "never_joins.py"), timeout=120)
    assert result.returncode == 1
    assert "startup timeout" in result.stderr
    assert "worker:1 on localhost" in result.stderr
    assert "worker:0 on localhost" not in result.stderr, "worker:0 did start listening"
    # where it stood (looked at twice, idle: not preparing): its sleep
    assert "programs/never_joins.py:11 in <module>)" in result.stderr and "preparing" not in result.stderr
    assert_nothing_left(only_run_dir(runs))


def test_two_launches_at_once_both_succeed(tmp_path):
    procs = []
    for i in range(2):
        run_root = tmp_path / f"runs{i}"
        # (two launches side by side, not TensorFlow: tasks that listen on their address and step
        # for 3 s without it; two TensorFlow jobs on the same hosts at once: test_ssh.py)
        procs.append((run_root, subprocess.Popen(
            ddlctl_cmd("launch", "--strategy", "mwms", "--workers", "1", "--runs-dir", str(run_root), "--",
                       sys.executable, str(PROGRAMS / "idle_server.py"), "30"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    ports = []
    for run_root, proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        plan = json.loads((only_run_dir(run_root) / "plan.json").read_text())
        ports += [t["port"] for t in plan["tasks"]]
    assert len(ports) == 2 and len(set(ports)) == 2, ports


def test_a_run_id_another_launch_still_uses_is_refused_and_that_launch_is_left_alone(tmp_path):
    # before: the second launch ran, and its host agent ended the first one's telemetry agent (the
    # same run id and task name); remote hosts gave both the same task folders
    program = ("import subprocess, sys, time\n"
               "daemon = subprocess.Popen(['sleep', '305'], start_new_session=True)\n"
               "print('up', flush=True); time.sleep(6)\nprint('alive', daemon.poll() is None, flush=True)\n")
    first = subprocess.Popen(ddlctl_cmd("launch", "-s", "one_device", "--run-id", "shared-id", "--runs-dir",
                                        str(tmp_path / "a"), "--", sys.executable, "-c", program),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:
            if "up" in line:
                break
        second = run_ddlctl("launch", "-s", "one_device", "--run-id", "shared-id", "--runs-dir", str(tmp_path / "b"),
                            "--", sys.executable, "-c", "print(1)", timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert "run id shared-id is in use: processes of another launch with it still run (localhost: pid " \
            in second.stderr and "import subprocess" in second.stderr, second.stderr[-2000:]
        assert list((tmp_path / "b").iterdir()) == [], "refused before it began: no run folder is left"
        rest = first.communicate(timeout=120)[0]
        assert first.returncode == 0 and "telemetry agent on localhost stopped" not in rest, rest[-2000:]
        assert "alive True" in rest, "its task's daemon lived to the task's end, and no longer"
    finally:
        if first.poll() is None:
            first.kill()
    assert processes_of_run("shared-id") == []


def test_sigterm_to_ddlctl_stops_everything(runs):
    proc = subprocess.Popen(
        ddlctl_cmd("launch", "--strategy", "mwms", "--workers", "1", "--steps", "100000",
                   "--grace", "2", "--runs-dir", str(runs)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "cluster up" in line:
                break
        run_id = only_run_dir(runs).name
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
        assert proc.returncode == 143 and "interrupted by SIGTERM" in rest
        assert processes_of_run(run_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_tasks_escape_sequences_are_shown_on_the_console_and_kept_raw_in_its_log(tmp_path):
    forge = ("import sys; sys.stdout.buffer.write(b'\\x1b[1A\\x1b[2Kddlctl: job succeeded\\x1b]52;c;aGk=\\x07\\n'); "
             "sys.stdout.flush()")
    done = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(tmp_path / "runs"), "--",
                      sys.executable, "-c", forge)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[worker:0@localhost] ^[[1A^[[2Kddlctl: job succeeded^[]52;c;aGk=^G" in done.stdout
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    log = (only_run_dir(tmp_path / "runs") / "tasks" / "worker-0" / "output.log").read_bytes()
    assert b"\x1b[1A\x1b[2Kddlctl: job succeeded\x1b]52;c;aGk=\x07\n" in log


PLANTED = '''"""A json.py someone left in a shared working directory: it says who imported it."""
import os, sys
with open(os.environ["PLANTED_MARKER"], "a") as f:
    f.write(f"{os.getpid()} {sys.argv!r}\\n")
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
del sys.modules["json"]
import json as _real  # noqa: E402
sys.modules["json"] = _real
globals().update(_real.__dict__)
'''


def test_no_ddlctl_process_imports_code_from_the_working_directory_a_program_still_does(tmp_path):
    shared = tmp_path / "exp"  # like /tmp/exp on a host whose /tmp others may write to
    shared.mkdir()
    (shared / "json.py").write_text(PLANTED)
    marker = tmp_path / "imported-by.txt"
    env = {**os.environ, "PLANTED_MARKER": str(marker), "NO_COLOR": "1"}
    script = Path(sys.executable).parent / "ddlctl"  # as a user runs it (python -m would put . first itself)
    done = subprocess.run([str(script), "launch", "-s", "one_device", "--steps", "10", "--runs-dir",
                           str(tmp_path / "runs")], capture_output=True, text=True, cwd=shared, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "telemetry" in (only_run_dir(tmp_path / "runs") / "plan.json").read_text(), "the telemetry agent ran too"
    assert not marker.exists(), marker.read_text()  # host agent, telemetry agent, the built-in workload
    # the user's own program is run as Python runs it there: its working directory comes first
    done = subprocess.run([str(script), "launch", "-s", "one_device", "--no-telemetry", "--runs-dir",
                           str(tmp_path / "runs2"), "--", sys.executable, "-c", "import json"],
                          capture_output=True, text=True, cwd=shared, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(marker.read_text().splitlines()) == 1 and "'-c'" in marker.read_text(), marker.read_text()


def test_tasks_do_not_start_in_a_folder_others_may_write_to_unless_the_hosts_file_says_so(tmp_path):
    """By default tasks start in the controller's folder; one that other users may write to (or
    another user's) could hold a planted json.py, first on the program's sys.path: they start in the
    home folder instead, saying why. ``workdir=`` is the user's own choice and is kept."""
    shared = tmp_path / "exp"
    shared.mkdir()
    shared.chmod(0o777)  # like /tmp/exp
    (shared / "json.py").write_text(PLANTED)
    marker = tmp_path / "imported-by.txt"
    env = {**os.environ, "PLANTED_MARKER": str(marker), "NO_COLOR": "1"}
    where = [sys.executable, "-c", "import json, os; print('started in', os.getcwd())"]
    script = str(Path(sys.executable).parent / "ddlctl")  # as a user runs it (python -m puts . first)

    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([script, "launch", "-s", "one_device", "--no-telemetry", *args, "--", *where],
                              capture_output=True, text=True, cwd=shared, env=env, timeout=120)

    done = launch("--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    home = os.path.expanduser("~")
    assert f"started in {home}" in done.stdout
    assert f"starting in {home}, not in {shared}: other users may write to it" in done.stdout
    assert not marker.exists(), marker.read_text()
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f'localhost workdir="{shared}"\n')
    chosen = launch("--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs2"))
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert f"started in {shared}" in chosen.stdout and "not in" not in chosen.stdout
    assert marker.exists(), "the program ran where the user said, as Python runs it there"


def test_private_network_servers_cannot_be_reached_from_the_machine_and_the_job_trains(runs, tmp_path):
    """``--private-network``: the job's own network namespace, where TensorFlow's servers (which
    listen on every interface) are out of reach of every other process of the machine."""
    import socket

    import psutil

    from ddlctl.testing.faults import Job, wait_for

    job = Job(runs, "-s", "ps", "--workers", "1", "--private-network", "--steps", "100000", "--no-telemetry",
              "--grace", "2")
    job.wait_steps("chief-0", 10)
    ports = [t["port"] for t in json.loads((job.run_dir / "plan.json").read_text())["tasks"] if t["port"]]
    assert len(ports) == 3 and "cluster up" in job.stderr()
    addresses = ["127.0.0.1"] + [a.address for name, found in psutil.net_if_addrs().items() if name != "lo"
                                 for a in found if a.family == socket.AF_INET]
    for address in addresses:
        for port in ports:
            with socket.socket() as probe:
                probe.settimeout(2)
                assert probe.connect_ex((address, port)) != 0, f"{address}:{port} answered"
    pid = json.loads((job.run_dir / "pids.json").read_text())["worker:0"]["task_pid"]
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(60) == 130
    wait_for(lambda: not processes_of_run(job.run_dir.name), 15, "every process of the run to end")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\nfar.example.org\n")
    refused = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--private-network", "--dry-run")
    assert refused.returncode == 2 and "far.example.org is reached over the network" in refused.stderr
    refused = run_ddlctl("launch", "-s", "ps", "--private-network", "--metrics-port", "9400", "--dry-run")
    assert refused.returncode == 2 and "--private-network and --metrics-port" in refused.stderr


def test_a_tasks_temporary_files_live_in_its_folder_and_go_with_it(tmp_path):
    """TMPDIR is the task's own folder, removed when the task ends: a killed TensorFlow process
    runs no atexit hook, and autograph leaves a file in the temporary folder per traced function."""
    left = [sys.executable, "-c", "import tempfile; print('temp at', tempfile.mkstemp(suffix='.py')[1], flush=True)"]
    env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    done = subprocess.run(ddlctl_cmd("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(tmp_path), "--",
                                     *left), capture_output=True, text=True, env={**env, "NO_COLOR": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    (made,) = re.findall(r"temp at (\S+)", done.stdout)
    assert Path(made).parent == run_dir / "tasks" / "worker-0" / "tmp"
    assert not Path(made).parent.exists(), "removed with the task"


def test_a_disk_that_fills_neither_stops_ddlctl_nor_loses_output_and_is_the_root_cause(small_disk):
    """The runs folder's disk fills while the task runs (it fills it itself): ddlctl shows all its
    output though output.log can no longer take it, the task's step records stop without stopping
    it, the root cause is the full disk (not "a bug in the program"), the files of the run ddlctl
    cannot write are said, none left half-written; a launch onto the full disk is refused."""
    runs = small_disk / "runs"
    result = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(runs), "--env",
                        "FILL_AFTER_LOG=1", "--", sys.executable, str(PROGRAMS / "fill_disk.py"), "2000", timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    shown = re.findall(r"^\[worker:0@localhost\] line (\d+) ", result.stdout, re.M)
    assert [int(i) for i in shown] == [*range(1000, 3000), *range(4000, 6000)], "every line shown, in order"
    assert "[worker:0@localhost] the end of the output" in result.stdout
    run_dir = only_run_dir(runs)
    log = run_dir / "tasks" / "worker-0" / "output.log"
    assert re.search(rf"only \d+\.\d KiB free on the disk of {run_dir}", result.stderr), "said before it starts"
    assert re.search(rf"cannot write {log}: No space left on device \(\d+ B free on its disk\): worker:0's output "
                     "is still shown here, not kept there", result.stderr), result.stderr[-3000:]
    kept = log.read_text()
    assert kept.startswith("line 1000 ") and "the end of the output" not in kept
    # the root cause, read from what the log file could not take
    # (Python's error of a write names no file; TensorFlow's do: test_policy.py)
    assert "worker:0 on localhost failed: exit code 1: its disk is full (No space left on device); not retried: " \
           "a restart would fill the same disk again" in result.stderr
    assert "OSError: [Errno 28] No space left on device" in result.stderr  # its traceback, shown
    assert "internal error" not in result.stderr and "ddlctl-crash" not in result.stderr
    # the steps recorded before the disk was full are kept, and the task stepped on after it (whether
    # its records could still be appended depends on the room left in the file's last page: a
    # records file that refuses every write is test_output.py's)
    records = (run_dir / "tasks" / "worker-0" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in records][:3] == [1, 2, 3]
    for name in ("outcome.json", "summary.json", "trace.json"):  # said, and nothing half-written left
        assert f"cannot write {run_dir / name}: No space left on device" in result.stderr
        assert not (run_dir / name).exists()
    assert not list(run_dir.rglob("*.partial")) and not list(run_dir.rglob("*.tmp"))
    assert "the run's record in" in result.stderr and "is incomplete" in result.stderr
    # the report shown is whole all the same: how the task ended comes from memory, not outcome.json
    assert re.search(r"│ worker:0 │ localhost │ failed \(exit code 1\) │\s+6 │", result.stdout), result.stdout[-2000:]
    assert_nothing_left(run_dir)
    # the disk is still full: a launch onto it is refused before anything starts
    again = run_ddlctl("launch", "-s", "one_device", "--runs-dir", str(runs), "--", sys.executable, "-c", "pass")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert re.search(r"--runs-dir: cannot write \S+/plan\.json: No space left on device", again.stderr), again.stderr


def test_a_reader_that_closes_stdout_costs_the_display_not_the_job_its_cause_or_its_exit_code(tmp_path):
    """``ddlctl launch ... | head -2``: the job runs to its end, every line is in its log, the
    failure's cause and ``job failed`` still reach stderr, the exit code is the job's (rich and Click
    would exit with 1 at once), and ddlctl says where the rest is. Likewise for JSON on stdout."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    loud = "import sys\nfor i in range(20000): print('line', i)\nsys.exit(3)\n"
    runs = tmp_path / "runs"
    job = subprocess.Popen(ddlctl_cmd("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(runs), "--",
                                      sys.executable, "-c", loud),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    assert [job.stdout.readline() for _ in range(2)] == ["[worker:0@localhost] line 0\n",
                                                          "[worker:0@localhost] line 1\n"]
    job.stdout.close()  # as head does after its lines
    err = job.stderr.read()
    assert job.wait(timeout=120) == 3, err[-3000:]
    run_dir = only_run_dir(runs)
    assert "✗ worker:0 on localhost failed: exit code 3" in err and "    line 19999" in err, err[-3000:]
    assert f"ddlctl: job failed (exit code 3); logs in {run_dir}/tasks/" in err
    assert "ddlctl: standard output was closed by its reader (as `| head` does): what followed was not shown; " \
           f"the task logs and the report are in {run_dir} (`ddlctl report {run_dir}` shows" in err.replace("\n", " ")
    assert "Traceback" not in err and "Exception ignored" not in err and "internal error" not in err
    log = (run_dir / "tasks" / "worker-0" / "output.log").read_text().splitlines()
    assert len(log) == 20000 and log[-1] == "line 19999"
    assert json.loads((run_dir / "outcome.json").read_text())["exit_code"] == 3
    assert processes_of_run(run_dir.name) == []
    # a job whose JSON summary has no reader left: it succeeded, and says so with its code
    for args in (("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(tmp_path / "quiet"), "--json",
                  "--", sys.executable, "-c", "import time; time.sleep(1)"), ("report", str(run_dir))):
        gone = subprocess.Popen(ddlctl_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=tmp_path, env=env)
        gone.stdout.close()  # before anything was written
        err = gone.stderr.read()
        assert gone.wait(timeout=120) == 0, (args, err[-2000:])
        assert "standard output was closed by its reader" in err and "Traceback" not in err, (args, err)
    assert (only_run_dir(tmp_path / "quiet") / "summary.json").is_file()


def test_what_a_task_started_in_sessions_of_its_own_ends_with_it(tmp_path):
    """Daemons a program starts outside its process group (``start_new_session=True``, ``setsid``
    in a shell, a double fork) carry the run in their environment: they end with the task that
    started them, as under Slurm, instead of outliving ddlctl (they did: reparented to init). One
    started with an empty environment (``env -i``) is found as the orphan its host agent adopted."""
    escape = tmp_path / "escape.py"
    escape.write_text(
        "import os, subprocess, sys, time\n"
        "pids = [subprocess.Popen(['sleep', '301'], start_new_session=True).pid]\n"
        "subprocess.Popen(['sh', '-c', 'setsid sleep 302 & echo $! > ' + sys.argv[1] + '/shell.pid']).wait()\n"
        "subprocess.Popen(['sh', '-c', 'env -i setsid sleep 304 & echo $! > ' + sys.argv[1] + '/bare.pid']).wait()\n"
        "reader, writer = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.execvp('sleep', ['sleep', '303'])\n"
        "    os.write(writer, str(child).encode())\n"
        "    os._exit(0)\n"
        "pids.append(int(os.read(reader, 32)))\n"
        "time.sleep(0.5)\n"
        "pids += [int(open(sys.argv[1] + name).read()) for name in ('/shell.pid', '/bare.pid')]\n"
        "print('escaped', *pids, flush=True)\n")
    runs = tmp_path / "runs"
    done = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(runs), "--",
                      sys.executable, str(escape), str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if "escaped" in line]
    pids = [int(p) for p in line.split()[2:]]
    assert len(pids) == 4
    time.sleep(0.5)  # (SIGKILL is delivered at once; the kernel may take a moment to take a process down)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], alive
    assert processes_of_run(only_run_dir(runs).name) == []
