"""Faults caused for real on localhost clusters (kill -9, SIGSTOP, crashes) and what ddlctl does:
exit code, root cause, restarts, resumption, and no process left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlctl.testing.faults import Job, task_pid, wait_for
from tests.conftest import PROGRAMS, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl

pytestmark = pytest.mark.cluster
BUILTIN = ("--no-telemetry", "--startup-timeout", "120", "--grace", "2")
#: the ps jobs' built-in workload: batches of 16 (a step's CPU a quarter of the default 64's; 0.86
#: accuracy after 240 steps on one device, against 0.91)
PS_JOB = ("-s", "ps", "--batch-size", "16")


def nothing_left(job: Job) -> None:
    wait_for(lambda: not processes_of_run(job.run_dir.name), 15, "every process of the run to end")


def plan_ports(job: Job) -> dict[str, int]:
    return {t["name"]: t["port"] for t in json.loads((job.run_dir / "plan.json").read_text())["tasks"]}


def pids(job: Job) -> dict[str, int]:
    return {name: record["task_pid"] for name, record in json.loads((job.run_dir / "pids.json").read_text()).items()
            if "task_pid" in record}


def log(job: Job, task: str) -> str:
    path = job.run_dir / "tasks" / task / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


def result(job: Job) -> dict:
    return json.loads((job.run_dir / "tasks" / "chief-0" / "result.json").read_text())


def test_ps_worker_then_chief_killed_are_each_restarted_alone_and_training_finishes(runs):
    job = Job(runs, *PS_JOB, "--steps", "240", "--max-restarts", "2", *BUILTIN)  # a checkpoint every 60 steps
    job.wait_steps("chief-0", 60)
    first = pids(job)
    # worker:0 is held while worker:1 is replaced, so the job cannot end before the new worker is back
    # (on a fast machine the chief alone on worker:0 finished first and the replacement never served).
    # Not the chief: a coordinator held across the replacement never sees the failure and then fetches
    # results the old worker held ("Unable to find the relevant tensor remote_handle": a crash).
    os.kill(first["worker:0"], signal.SIGSTOP)
    try:
        job.kill("worker-1", signal.SIGKILL)
        wait_for(lambda: log(job, "worker-1").count("listening at") == 2 or job.proc.poll() is not None, 120,
                 "worker:1 to listen again")
        time.sleep(1.5)  # ddlctl probes a starting task's port every 0.5 s: it sees worker:1 listening
    finally:
        os.kill(first["worker:0"], signal.SIGCONT)
    job.wait_steps("chief-0", 100)
    job.kill("chief-0", signal.SIGKILL)
    assert job.wait() == 0, job.stderr()[-3000:]
    outcome = job.outcome()
    worker, chief = outcome["restarts"]
    assert (worker["task"], worker["cause"], worker["scope"], worker["tasks"]) == ("worker:1", "signal", "task",
                                                                                 ["worker:1"])
    assert worker["listening_at"] > worker["time"], "replaced and listening again (how fast: benchmarks/recovery.py)"
    assert (chief["task"], chief["tasks"]) == ("chief:0", ["chief:0"])
    ports = plan_ports(job)
    assert log(job, "worker-1").count(f"listening at grpc://localhost:{ports['worker:1']}") == 2, "same port twice"
    last = pids(job)
    assert last["worker:1"] != first["worker:1"] and last["chief:0"] != first["chief:0"]
    assert {n: p for n, p in last.items() if n in ("worker:0", "ps:0")} == \
        {n: p for n, p in first.items() if n in ("worker:0", "ps:0")}, "ps and the other worker were reused"
    assert {t["name"]: t["restarts"] for t in outcome["tasks"]} == {"chief:0": 1, "worker:0": 0, "worker:1": 1,
                                                                    "ps:0": 0}
    assert "resumed from checkpoint" in log(job, "chief-0")
    assert result(job)["accuracy"] > 0.6
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert [r["task"] for r in summary["restarts"]] == ["worker:1", "chief:0"]
    # the job's time by cause: start-up, two restarts, the final evaluation, adding up to its wall
    causes = summary["time_by_cause"]
    assert causes["startup_s"] > 0 and causes["restart_s"] > 0 and causes["eval_s"] > 0 and causes["productive_s"] > 0
    exclusive = ("compile_s", "productive_s", "redone_s", "checkpoint_s", "eval_s", "stalled_s", "restart_s",
                 "startup_s", "ending_s", "between_s", "other_s")
    assert sum(causes[k] for k in exclusive) == pytest.approx(causes["wall_s"], abs=0.01)
    assert causes["wall_s"] == pytest.approx(job.outcome()["wall_time_s"], abs=0.01)
    assert f"time by cause: {causes['line']}" in (runs.parent / "ddlctl.out").read_text()
    nothing_left(job)


def test_a_taken_port_then_a_killed_ps_task_restart_everything_and_training_resumes_from_the_checkpoint(runs):
    # a checkpoint every 60 steps; one worker (how many is not what this is about)
    job = Job(runs, *PS_JOB, "--workers", "1", "--steps", "240", "--max-restarts", "1", "--trace", "auto", *BUILTIN)
    port = wait_for(lambda: (job.run_dir / "plan.json").exists() and plan_ports(job).get("worker:0"), 30, "the plan")
    [ps] = [t for t in json.loads((job.run_dir / "plan.json").read_text())["tasks"] if t["name"] == "ps:0"]
    profiler = int(ps["env"]["DDLCTL_PROFILER_SERVE"])  # (--trace: the port ps:0's profiler serves on)
    holders = [socket.socket(), socket.socket()]
    for holder, taken in zip(holders, (port, profiler), strict=True):
        holder.bind(("", taken))  # someone else takes the ports between planning and binding
        holder.listen()
    try:
        job.wait_steps("chief-0", 100)
    finally:
        for holder in holders:
            holder.close()
    job.kill("ps-0", signal.SIGKILL)
    assert job.wait() == 0, job.stderr()[-3000:]
    # the port: every task of the cluster spec again with new ports, not counted as a restart
    retry, event = job.outcome()["restarts"]
    assert (retry["cause"], retry["scope"]) == ("port-in-use", "all") and retry["task"] in ("worker:0", "ps:0")
    assert retry["new_ports"]["worker:0"] != port and retry["new_ports"]["ps:0@profiler"] != profiler
    assert (f"port {port} was taken before it could bind" if retry["task"] == "worker:0" else
            f"its profiler's port {profiler} was taken before it could bind") in job.stderr()
    # ps:0 serves its profiler on the new port, and the chief traces it there
    assert f"serves TensorFlow's profiler on port {retry['new_ports']['ps:0@profiler']}" in log(job, "ps-0")
    # the ps task: its variables are gone, every task restarts (the one restart allowed)
    assert (event["task"], event["scope"]) == ("ps:0", "all")
    assert set(event["tasks"]) == {"chief:0", "worker:0", "ps:0"}
    resumed = [line for line in log(job, "chief-0").splitlines() if line.startswith("resumed from checkpoint")]
    assert len(resumed) == 1 and "(restart " in resumed[0]
    at = int(resumed[0].split(" at step ")[1].split()[0])
    assert at >= 60, "resumed from a checkpoint, not from step 0"
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["steps_lost"] <= 120, "at most one checkpoint interval (and what was in flight) redone"
    assert result(job)["accuracy"] > 0.6
    nothing_left(job)


def test_ps_stopped_worker_is_found_by_the_hang_watch_and_without_restarts_the_job_runs_degraded(runs):
    # (a restart after a hang is the same decision as after a kill: test_policy, test_supervisor)
    job = Job(runs, *PS_JOB, "--steps", "240", "--hang-timeout", "6", *BUILTIN)
    job.wait_steps("chief-0", 60)
    job.kill("worker-1", signal.SIGSTOP)
    assert job.wait() == 0, job.stderr()[-3000:]
    outcome = job.outcome()
    assert outcome["restarts"] == [] and outcome["degraded"][0]["task"] == "worker:1"
    [hang] = outcome["hangs"]
    assert (hang["culprit"], {t["task"]: t["state"] for t in hang["tasks"]}["worker:1"]) == ("worker:1", "stopped")
    assert "stopped (state T)" in hang["why"]
    dump = (job.run_dir / "hang" / "1" / "worker-1.txt").read_text()
    assert " T " in dump, dump
    assert "chief" in (job.run_dir / "hang" / "1" / "chief-0.txt").read_text()
    assert "training goes on degraded with 1 worker(s)" in job.stderr()
    summary = json.loads((job.run_dir / "summary.json").read_text())
    [line] = [d for d in summary["diagnosis"] if d.startswith("ran degraded")]
    assert "for the last" in line and "worker:1 was lost" in line
    assert {t["name"]: t["state"] for t in outcome["tasks"]}["worker:1"] == "failed"
    # the stall until the hang was found (the chief's checkpoint save waited for the stopped worker)
    causes = summary["time_by_cause"]
    assert causes["degraded_s"] > 0 and causes["stalled_s"] > 0, causes
    assert result(job)["accuracy"] > 0.6
    nothing_left(job)  # the stopped process included


def test_mwms_stopped_worker_is_blamed_from_tensorflows_words_model_fit_resumes_then_the_job_fails_naming_it(runs):
    # model.fit with BackupAndRestore in ddlctl's checkpoint folder (an epoch takes ~3 s)
    job = Job(runs, "-s", "mwms", "--max-restarts", "1", "--no-telemetry", "--grace", "2", "--",
              sys.executable, str(PROGRAMS / "fit_backup.py"))
    wait_for(lambda: "EPOCH_BEGIN 2" in log(job, "worker-0") or job.proc.poll() is not None, 240, "epoch 2")
    time.sleep(0.5)  # mid-epoch
    assert job.proc.poll() is None and "EPOCH_BEGIN 3" not in log(job, "worker-0")
    first = task_pid(job.run_dir, "worker-1")
    job.kill("worker-1", signal.SIGSTOP)
    # worker:0's TensorFlow names it; the group restarts and model.fit resumes the interrupted epoch
    for task in ("worker-0", "worker-1"):
        wait_for(lambda task=task: "restart=1" in log(job, task) or job.proc.poll() is not None, 120,
                 f"{task} to resume")
    assert task_pid(job.run_dir, "worker-1") != first
    for task in ("worker-0", "worker-1"):
        epochs = [line for line in log(job, task).splitlines() if line.startswith("EPOCH_BEGIN")]
        after = [line for line in epochs if "restart=1" in line]
        assert after and after[0] == "EPOCH_BEGIN 2 restart=1 workers=2", epochs  # the interrupted epoch, not 0
    job.kill("worker-1", signal.SIGSTOP)  # again, with no restart left
    assert job.wait() == 124, job.stderr()[-3000:]
    outcome = job.outcome()
    [event] = outcome["restarts"]
    assert (event["task"], event["cause"], event["reporter"], event["scope"]) == \
        ("worker:1", "hang", "worker:0", "group")
    assert "stopped sending heartbeats" in event["detail"]
    assert (job.run_dir / "hang" / "1" / "worker-1.txt").exists(), "stacks saved before the group was killed"
    assert "worker:1 on localhost failed: hung (worker:0 reports" in job.stderr()
    assert outcome["root_cause"]["task"] == "worker:1"
    assert len(outcome["hangs"]) == 2
    assert "FIT_DONE" not in log(job, "worker-0")
    nothing_left(job)  # the stopped process included


CRASH = [sys.executable, "-c", "import os; print('attempt', os.environ['DDLCTL_RESTART_COUNT']); raise SystemExit(1/0)"]


def test_a_python_exception_is_not_retried_under_fault(runs):
    done = run_ddlctl("launch", "-s", "one_device", "--max-restarts", "3", "--no-telemetry", "--runs-dir", str(runs),
                      "--", *CRASH, timeout=120)
    assert done.returncode == 1
    assert "a bug in the program: not retried under --restart-on fault" in done.stderr
    assert "ZeroDivisionError" in done.stderr and "Traceback" in done.stderr
    assert done.stdout.count("attempt") == 1


def test_a_python_exception_is_retried_under_any_until_the_budget_is_spent(runs):
    done = run_ddlctl("launch", "-s", "one_device", "--max-restarts", "3", "--restart-on", "any", "--no-telemetry",
                      "--runs-dir", str(runs), "--", *CRASH, timeout=180)
    assert done.returncode == 1
    assert [line.split()[-1] for line in done.stdout.splitlines() if "attempt" in line] == ["0", "1", "2", "3"]
    assert "no restarts left (3 of --max-restarts 3 used)" in done.stderr
    run_dir = next(runs.iterdir())
    assert len(json.loads((run_dir / "outcome.json").read_text())["restarts"]) == 3


def test_an_mwms_worker_that_ends_early_is_the_root_cause_not_the_peer_it_left_waiting(runs):
    # worker:1 runs out of batches after 5 steps and exits 0; worker:0's next all-reduce fails
    # naming it, as it names a killed peer: only ddlctl knows it ended on its own, and why that fails
    done = run_ddlctl("launch", "-s", "mwms", "--workers", "2", "--max-restarts", "2", "--no-telemetry",
                      "--runs-dir", str(runs), "--", sys.executable, str(PROGRAMS / "ends_early.py"), timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "worker:1 on localhost failed: ended on its own (exit code 0, after 5 steps) while its peers went on " \
           "(worker:0, at step 5, then failed:" in done.stderr, done.stderr[-3000:]
    assert "every worker must take the same number of steps" in done.stderr  # (worker:0 failed in step 6)
    assert "not retried: the same program would end early again" in done.stderr  # a restart ends the same way
    # the traceback shown is worker:0's, and said to be
    assert "traceback of worker:0, which reported it:" in done.stderr and "UnavailableError" in done.stderr
    assert "worker:0's log: " in done.stderr
    run_dir = only_run_dir(runs)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["root_cause"]["task"] == "worker:1" and outcome["restarts"] == []
    error = json.loads((run_dir / "tasks" / "worker-1" / "error.json").read_text())
    assert (error["cause"], error["reporter"]) == ("ended-early", "worker:0")
    assert not processes_of_run(run_dir.name)


def test_an_mwms_worker_that_ends_before_joining_is_named_at_once_not_after_the_startup_timeout(runs):
    # "if not the first worker: exit": worker:0's coordination service waits for it to connect (and
    # would for ever); it says which tasks it waits for: one that has ended is the fault at once
    started = time.monotonic()
    done = run_ddlctl("launch", "-s", "mwms", "--workers", "2", "--no-telemetry", "--runs-dir", str(runs), "--",
                      sys.executable, str(PROGRAMS / "ends_early.py"), "0", timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    assert time.monotonic() - started < 60, "not after the startup timeout (180 s)"
    assert "worker:1 on localhost failed: ended on its own (exit code 0, after 0 steps) while worker:0 waits for it " \
           "to join the cluster (\"Waiting for 1/2 tasks to connect. Example stragglers: worker:1\")" in done.stderr, \
        done.stderr[-3000:]
    assert "not the first worker: nothing to do here" in done.stderr  # its own last words
    assert not processes_of_run(only_run_dir(runs).name)


def test_a_silent_host_agent_is_a_lost_host_and_its_tasks_are_restarted_elsewhere(runs):
    # a stopped agent says nothing (like a network gone without a reset): after 15 s of silence the
    # host counts as lost, the old agent is cut off (its tasks die with it) and a new one takes over
    program = [sys.executable, "-c", "import os, time; n = os.environ['DDLCTL_RESTART_COUNT']; print('try', n, "
               "flush=True); time.sleep(120 if n == '0' else 0)"]
    job = Job(runs, "-s", "one_device", "--max-restarts", "1", "--no-telemetry", "--", *program)
    wait_for(lambda: "try 0" in log(job, "worker-0"), 60, "the first try")
    first = pids(job)["worker:0"]
    agent = json.loads((job.run_dir / "pids.json").read_text())["worker:0"]["agent_pid"]
    os.kill(agent, signal.SIGSTOP)
    assert job.wait(90) == 0, job.stderr()[-3000:]
    assert "no word from its host agent" in job.stderr()
    [event] = job.outcome()["restarts"]
    assert event["cause"] == "host-lost"
    assert "try 1" in log(job, "worker-0")
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    nothing_left(job)


MEMORY = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(os.geteuid() != 0 or not (MEMORY / "cgroup.procs").exists(),
                    reason="needs root and the cgroup v1 memory controller (a memory limit the test sets)")
def test_a_task_the_oom_killer_ends_is_said_to_be_out_of_memory_and_restarted_as_a_fault(runs):
    """A real OOM kill (the kernel's, for a memory group's 128 MiB limit): not just "killed by
    SIGKILL", but out of memory, with what the kernel log says it held; retried under
    --restart-on fault like any signal, and when it is killed again the job fails naming it."""
    group = MEMORY / f"ddlctl-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(128 * 2**20))
        result = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--max-restarts", "1", "--runs-dir",
                            str(runs), "--", sys.executable, str(PROGRAMS / "eat_memory.py"),
                            str(group / "cgroup.procs"), timeout=120)
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 20, "the group to empty")
        group.rmdir()
    assert result.returncode == 137, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    outcome = json.loads((run_dir / "outcome.json").read_text())
    [restart] = outcome["restarts"]
    assert (restart["task"], restart["cause"]) == ("worker:0", "oom")
    said = " ".join(result.stderr.split())
    killed = re.findall(r"killed by SIGKILL: out of memory \(the kernel's OOM killer, for its memory group's limit: "
                        r"it held (\d+) MiB when killed\)", said)
    assert len(killed) >= 2 and all(100 <= int(mib) <= 150 for mib in killed), said[-3000:]
    assert "worker:0 on localhost failed: killed by SIGKILL: out of memory" in said and "no restarts left" in said
    [task] = outcome["tasks"]
    assert task["exit"].startswith("killed by SIGKILL: out of memory (the kernel's OOM killer")
    assert processes_of_run(run_dir.name) == []


def test_ddlctl_itself_stopped_past_every_threshold_blames_no_host_or_task_and_the_job_trains_on(runs):
    """Ctrl-Z, then fg: ddlctl SIGSTOPped for 20 s, past the host silence limit (15 s) and the hang
    threshold (6 s), while its host agent and task go on. Before, its first look after SIGCONT read
    nothing (Python gives a wait whose timeout passed back empty) and it declared the host lost
    (exit 255) or the task hung (124)."""
    stepping = ("import time, ddlctl\nddlctl.set_total_steps(500)\nfor i in range(500):\n"
                "    with ddlctl.step():\n        time.sleep(0.06)\n    print('step', i, flush=True)\n")
    job = Job(runs, "-s", "one_device", "--hang-timeout", "6", "--grace", "2", "--", sys.executable, "-c", stepping)
    job.wait_steps("worker-0", 20)
    job.proc.send_signal(signal.SIGSTOP)
    stopped_at = job.steps("worker-0")
    time.sleep(20)
    trained = job.steps("worker-0") - stopped_at
    job.proc.send_signal(signal.SIGCONT)
    assert job.wait() == 0, job.stderr()[-3000:]
    assert trained > 50, "the task trained on while ddlctl was stopped"
    outcome = job.outcome()
    assert (outcome["hangs"], outcome["hosts_lost"], outcome["restarts"]) == ([], [], [])
    # (a loaded machine could add a pause of a few seconds of its own: only the 20 s one is counted)
    assert len([p for p in outcome["paused"] if 19 <= p["seconds"] < 30]) == 1, outcome["paused"]
    assert re.search(r"ddlctl: this process did not run for (19|2\d)s \(stopped: Ctrl-Z, SIGSTOP or a debugger",
                     job.stderr()), job.stderr()[-2000:]
    log = (job.run_dir / "tasks" / "worker-0" / "output.log").read_text().splitlines()
    assert [line for line in log if line.startswith("step")][-1] == "step 499"
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert any(line.startswith("ddlctl itself did not run for") for line in summary["diagnosis"]), summary["diagnosis"]
    assert processes_of_run(job.run_dir.name) == []


def test_a_daemon_left_by_a_task_whose_host_agent_was_killed_is_ended_with_the_job(runs):
    """The host agent ends what a task started outside its process group when the task ends; a
    host agent SIGKILLed cannot. Once the job has ended, ddlctl ends what is left of the run on
    its own machine (found by the run id in its environment) and names it."""
    program = ("import subprocess, time, ddlctl\n"
               "daemon = subprocess.Popen(['sleep', '304'], start_new_session=True)\n"
               "print('daemon', daemon.pid, flush=True)\n"
               "for i in range(600):\n    with ddlctl.step():\n        time.sleep(0.05)\n")
    job = Job(runs, "-s", "one_device", "--no-telemetry", "--grace", "1", "--", sys.executable, "-c", program)
    job.wait_steps("worker-0", 5)
    log = (job.run_dir / "tasks" / "worker-0" / "output.log").read_text()
    daemon = int(re.search(r"daemon (\d+)", log).group(1))
    agents = [p for p in processes_of_run(job.run_dir.name) if "ddlctl.host.agent" in " ".join(p.cmdline())]
    assert len(agents) == 1
    agents[0].kill()
    assert job.wait() == 255, job.stderr()[-3000:]
    said = job.stderr().replace("\n", " ")
    assert f"ended 1 process(es) of this run still running on this machine after its tasks and host agents had " \
           f"ended (started by a task outside its process group): {daemon} (sleep 304)" in said, said[-3000:]
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE
    assert processes_of_run(job.run_dir.name) == []


@pytest.mark.parametrize("strategy", ["mwms", "ps"])
def test_at_a_time_limit_each_strategy_checkpoints_at_one_step_and_the_next_launch_goes_on_from_it(runs, tmp_path,
                                                                                                  strategy):
    """Slurm's time-limit signal (SIGUSR1, sent here to ddlctl itself) in a job ddlctl may stop there
    (``$DDLCTL_SIGNAL_BEFORE``, as ``submit --requeue`` exports it): the mwms workers, whose SIGTERMs
    arrive apart, agree on one step and both save there; a ps chief gets its SIGTERM first and saves
    through its servers, stopped after it. A launch on the same checkpoint folder goes on from that step."""
    checkpoints = tmp_path / "ckpt"
    args = ("-s", strategy, *BUILTIN, "--", sys.executable, "-m", "ddlctl.workloads", "--steps",
            "120", "--batch-size", "16", "--min-step-ms", "50", "--checkpoint-every", "1000", "--checkpoint-dir",
            str(checkpoints))
    lead = "chief-0" if strategy == "ps" else "worker-0"
    job = Job(runs, *args, env={"DDLCTL_SIGNAL_BEFORE": "40"})
    job.wait_steps(lead, 30)
    os.kill(job.proc.pid, signal.SIGUSR1)
    assert job.wait() == 143, job.stderr()[-3000:]
    assert job.outcome()["failure"].startswith("the time limit is near (Slurm's SIGUSR1): every task checkpoints "
                                               "and stops (SIGTERM; SIGKILL 10s later)")
    savers = ["chief-0"] if strategy == "ps" else ["worker-0", "worker-1"]
    said = [re.findall(r"checkpoint at step (\d+) on SIGTERM: stopping", log(job, task)) for task in savers]
    assert all(len(found) == 1 for found in said) and len({found[0] for found in said}) == 1, said
    step = int(said[0][0])
    assert step >= 30 and (checkpoints / f"ckpt-{step}.index").exists()
    ended = {t["name"]: t["exit_code"] for t in job.outcome()["tasks"]}
    assert all(ended[task.replace("-", ":")] == 143 for task in savers), ended
    nothing_left(job)
    (tmp_path / "again").mkdir()
    again = Job(tmp_path / "again", *args)
    assert again.wait() == 0, again.stderr()[-3000:]
    assert f"resumed from checkpoint ckpt-{step} at step {step} " in log(again, lead)
    assert json.loads((again.run_dir / "tasks" / lead / "result.json").read_text())["steps"] == 120


def test_a_program_of_ones_own_asked_to_stop_checkpoints_through_should_stop(runs):
    """``ddlctl.should_stop()`` in a program of one's own: ddlctl's stop (here its own SIGTERM, as a
    preemption gives it) turns True at the program's next step, which saves and exits."""
    job = Job(runs, "-s", "one_device", "--grace", "5", "--", sys.executable, str(PROGRAMS / "preemptible.py"), "600")
    job.wait_steps("worker-0", 5)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait() == 143, job.stderr()[-3000:]
    stopped = json.loads((job.run_dir / "tasks" / "worker-0" / "stopped.json").read_text())["step"]
    assert stopped >= 5 and f"checkpoint at step {stopped}: stopping" in log(job, "worker-0")
    assert stopped == job.steps("worker-0"), "at the step it was at, not killed later"
    assert [t["exit_code"] for t in job.outcome()["tasks"]] == [143]
    nothing_left(job)


def test_an_interrupted_run_goes_on_with_launch_resume_from_its_checkpoint_as_its_next_attempt(runs, tmp_path):
    """launch --resume RUN_DIR: a run Ctrl-C ended goes on in its folder as attempt 2, with its own
    options and command (an --env value taken from ddlctl's environment again, written nowhere) and
    from its newest checkpoint; the report covers both attempts."""
    job = Job(runs, "-s", "mwms", "-e", "DDLCTL_TEST_SECRET=s3cret", *BUILTIN, "--", sys.executable, "-m",
              "ddlctl.workloads", "--steps", "160", "--batch-size", "16", "--min-step-ms", "40", "--checkpoint-every",
              "40")
    job.wait_steps("worker-0", 50)
    job.proc.send_signal(signal.SIGINT)
    assert job.wait() == 130, job.stderr()[-3000:]
    recorded = (job.run_dir / "launch.json").read_text()
    assert "s3cret" not in recorded and '"DDLCTL_TEST_SECRET"' in recorded
    elsewhere = tmp_path / "elsewhere"  # (the command runs from the folder it was launched in, whatever this is)
    elsewhere.mkdir()
    refused = run_ddlctl("launch", "--resume", str(job.run_dir), "--steps", "5", cwd=elsewhere)
    assert refused.returncode == 2 and "--resume takes the run's own options and command: --steps 5" in refused.stderr
    env = {k: v for k, v in os.environ.items() if k != "DDLCTL_TEST_SECRET"}
    missing = subprocess.run(ddlctl_cmd("launch", "--resume", str(job.run_dir)), capture_output=True, text=True,
                             env=env, cwd=elsewhere, timeout=60)
    assert missing.returncode == 2 and "DDLCTL_TEST_SECRET" in missing.stderr, missing.stderr
    assert not (job.run_dir / "attempts").exists(), "refused before anything moved"
    done = run_ddlctl("launch", "--resume", str(job.run_dir), env={"DDLCTL_TEST_SECRET": "s3cret"}, cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ddlctl: resumed: attempt 2 of run {job.run_dir.name} goes on in {job.run_dir}" in done.stderr
    for task in ("worker-0", "worker-1"):
        resumed = re.findall(r"resumed from checkpoint ckpt-(\d+) at step (\d+)", log(job, task))
        assert len(resumed) == 1 and int(resumed[0][1]) >= 40, resumed
        assert json.loads((job.run_dir / "tasks" / task / "result.json").read_text())["steps"] == 160
    outcome = job.outcome()
    assert (outcome["attempt"], [a["failure"] for a in outcome["attempts"]]) == (2, ["interrupted by SIGINT"])
    rows = json.loads((job.run_dir / "summary.json").read_text())["attempts"]["attempts"]
    assert [(r["ended_by"], r["steps"][0]) for r in rows] == [("interrupted by SIGINT", 1),
                                                             ("completed", int(resumed[0][1]) + 1)]
    assert (job.run_dir / "attempts" / "1" / "outcome.json").is_file() and processes_of_run(job.run_dir.name) == []
