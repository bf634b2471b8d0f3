"""Real hangs of real TensorFlow tasks on localhost: whom ddlctl blames, how long after the stall it
says so, how the job ends, and that nothing is left (a stopped model-parallel stage:
test_model_parallel.py). The rules themselves are tested in milliseconds in test_hangs.py and
test_supervisor.py; the kinds measured with default thresholds in benchmarks/hang_bench.py."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlctl.testing.faults import Job, task_pid, wait_for
from tests.conftest import PROGRAMS, processes_of_run, run_ddlctl
from tests.system.test_faults import log, nothing_left

pytestmark = pytest.mark.cluster
QUICK = ("--no-telemetry", "--startup-timeout", "120", "--grace", "2")
HANG_KINDS = str(PROGRAMS / "hang_kinds.py")


def stalled_at(job: Job, task: str, words: str) -> float:
    """When ``task`` printed ``words`` (polled: within 0.1 s)."""
    wait_for(lambda: words in log(job, task) or job.proc.poll() is not None, 180, f"{task} to say {words!r}")
    return time.time()


def test_a_task_stopped_while_its_peer_steps_on_is_named_from_tensorflows_heartbeat_report(runs):
    job = Job(runs, "-s", "mwms", "--env", "HANG_KIND=local", *QUICK, "--", sys.executable, HANG_KINDS)
    job.wait_steps("worker-1", 20)
    stalled = job.kill("worker-1", signal.SIGSTOP)
    assert job.wait() == 124, job.stderr()[-3000:]
    outcome = job.outcome()
    assert (outcome["root_cause"]["task"], outcome["root_cause"]["reason"]) == ("worker:1", "hang")
    [hang] = outcome["hangs"]
    assert hang["rule"] == "named by worker:0's TensorFlow" and "stopped sending heartbeats" in hang["why"]
    stood = {t["task"]: t["state"] for t in hang["tasks"]}
    assert stood["worker:1"] == "stopped"
    assert hang["time"] - stalled < 30, "TensorFlow names it ~6 s after the stall"
    assert job.steps("worker-0") > job.steps("worker-1") + 50, "worker:0 stepped on meanwhile"
    nothing_left(job)


HUNG = {"worker:1": ("lock", "wait_forever_on_a_lock"), "worker:2": ("spin", "spin_forever"),
        "worker:3": ("pipe", "read_a_pipe_nobody_writes")}


def test_tasks_hung_in_their_own_code_are_blamed_from_their_stacks_not_their_waiting_peer(runs):
    # three kinds at once, one worker each: a lock never released, a busy loop, a read nobody answers
    kinds = ",".join(kind for kind, _ in HUNG.values())
    # with telemetry (the others run without): a host with no GPU is a normal state for the hang watch
    job = Job(runs, "-s", "mwms", "--workers", "4", "--hang-timeout", "8", "--env", f"HANG_KIND={kinds}",
              *(o for o in QUICK if o != "--no-telemetry"), "--", sys.executable, HANG_KINDS)
    stalled = max(stalled_at(job, task.replace(":", "-"), f"{task} hangs now ({kind})")
                  for task, (kind, _) in HUNG.items())
    assert job.wait() == 124, job.stderr()[-3000:]
    outcome = job.outcome()
    assert outcome["root_cause"]["task"] in HUNG and outcome["root_cause"]["reason"] == "hang"
    [hang] = outcome["hangs"]
    stood = {t["task"]: (t["state"], t["where"]) for t in hang["tasks"]}
    for task, (_, function) in HUNG.items():
        assert stood[task][0] == "user" and stood[task][1].startswith("programs/hang_kinds.py:"), stood
        assert stood[task][1].endswith(f" in {function}"), stood
    assert stood["worker:0"][0] == "waiting" and "TensorFlow" in stood["worker:0"][1]
    assert "its main thread is in its own code at programs/hang_kinds.py:" in job.stderr()
    samples = (job.run_dir / "telemetry" / "localhost.jsonl").read_text().splitlines()
    assert len(samples) > 5 and all(t["gpu"] is None for t in hang["tasks"]), "no GPU: nothing said of GPUs"
    assert "GPU" not in hang["why"]
    assert 6 < hang["time"] - stalled < 8 + 15, "named after its 8 s threshold (and the stacks), not before"
    nothing_left(job)


def test_a_task_spinning_in_native_code_is_blamed_by_its_busy_cpu_while_its_peer_waits_idle(runs):
    # worker:1's tf.data filter lets nothing through from batch 15 on: its input pipeline spins in
    # native code while its main thread, like worker:0's (in the all-reduce), waits in TensorFlow.
    # Their stacks alike and their last steps equal, only their CPU tells them apart (telemetry on).
    job = Job(runs, "-s", "mwms", "--hang-timeout", "8", "--env", "HANG_KIND=filter", "--trace", "auto",
              *(o for o in QUICK if o != "--no-telemetry"), "--", sys.executable, HANG_KINDS)
    assert job.wait() == 124, job.stderr()[-3000:]
    # --trace auto: both asked for a capture of a few seconds before the hang was called, shown with
    # it (worker:1's profiler, amid its spinning pipeline's events, may not stop before it is ended)
    [event] = job.outcome()["auto_traces"]
    assert event["reason"] == "near-hang" and sorted(event["asked"]) == ["worker:0", "worker:1"], event
    report = " ".join(run_ddlctl("report", str(job.run_dir)).stdout.split())
    assert f"the profiler before it (trace auto: {event['why']}): worker:0 " in report
    assert "worker:1 " in report.split("the profiler before it")[1].split("diagnosis")[0] or \
        f"trace auto asked worker:1 for a capture ({event['why']}), and none came back: it ended, or was ended, " \
        "before its profiler stopped" in report
    [hang] = job.outcome()["hangs"]
    stood = {t["task"]: t["state"] for t in hang["tasks"]}
    assert stood == {"worker:0": "waiting", "worker:1": "waiting"}, hang["tasks"]
    assert hang["culprit"] == "worker:1" and hang["why"].startswith("its process used "), hang
    cpus = {t["task"]: t["cpu"]["cpu_mean"] for t in hang["tasks"]}
    assert cpus["worker:1"] > 4 * cpus["worker:0"], cpus
    assert "it works or spins in native code and they wait for it" in job.stderr()
    nothing_left(job)


@pytest.mark.parametrize("how", ["declared", "undeclared-raise", "native"])
def test_a_program_that_ended_but_whose_process_never_exits_is_ended_as_the_exit_it_made(runs, how):
    """The process blocks at interpreter shutdown with no Python frame (tests/programs/stuck_in_exit.py):
    past its declared last step it is looked at once its threshold passes; without a declared total
    the hang watch finds it. Either way ddlctl ends it as the exit its program made: 0 after a
    normal end, 1 after an uncaught exception (the job then fails with that traceback). Blocked
    after Python's shutdown (native), the stack request's SIGUSR2 ends it: counted the same way."""
    env = {"declared": ("DECLARE=1",), "undeclared-raise": ("DECLARE=0", "RAISE=1"), "native": ("NATIVE=1",)}[how]
    job = Job(runs, "-s", "one_device", "--hang-timeout", "3", *(x for e in env for x in ("--env", e)), *QUICK,
              "--", sys.executable, str(PROGRAMS / "stuck_in_exit.py"))
    assert job.wait(120) == (1 if how == "undeclared-raise" else 0), job.stderr()[-3000:]
    outcome = job.outcome()
    [hang] = outcome["hangs"]
    assert (hang["kind"], hang["culprit"], [t["state"] for t in hang["tasks"]]) == ("exit", "worker:0", ["exiting"])
    assert "TRAINED" in log(job, "worker-0")
    if how == "undeclared-raise":
        assert outcome["root_cause"]["task"] == "worker:0" and "counted as exit code 1" in job.stderr()
        assert "RuntimeError: the evaluation after training failed" in job.stderr()
    else:
        assert outcome.get("root_cause") is None and "counted as exit code 0" in job.stderr()
        assert ("request for its stacks ended it" in job.stderr()) == (how == "native")
    nothing_left(job)


def test_a_finished_program_waiting_for_a_thread_that_never_ends_is_said_and_ctrl_c_ends_everything(runs):
    job = Job(runs, "-s", "one_device", "--hang-timeout", "3", "--env", "THREAD=1", *QUICK, "--", sys.executable,
              str(PROGRAMS / "stuck_in_exit.py"))
    wait_for(lambda: "waits for a thread" in job.stderr() or job.proc.poll() is not None, 60, "ddlctl to say why")
    assert job.proc.poll() is None, job.stderr()[-3000:]
    assert "worker:0 reached its last step" in job.stderr() and "in prefetch; ddlctl waits for it" in job.stderr()
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(60) == 130, job.stderr()[-3000:]
    nothing_left(job)


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.mark.skipif(os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists(),
                    reason="needs root and the cgroup v1 freezer (a frozen process is in state D, as on a dead NFS)")
def test_a_task_blocked_in_the_kernel_is_blamed_by_its_state_and_left_once_sigkill_cannot_end_it(runs):
    """A frozen cgroup holds the task in state D, as a dead network filesystem or a driver would:
    it is blamed for the hang by its state and wait channel, SIGKILL cannot end it, and ddlctl (and
    its host agent) leave it, saying so, instead of waiting forever; thawed, it dies of the pending
    SIGKILL."""
    job = Job(runs, "-s", "one_device", "--hang-timeout", "3", "--env", "STEPS=100000", *QUICK, "--",
              sys.executable, str(PROGRAMS / "stuck_in_exit.py"))
    job.wait_steps("worker-0", 10)
    pid = task_pid(job.run_dir, "worker-0")
    group = FREEZER / f"ddlctl-test-{pid}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        assert job.wait(120) == 124, job.stderr()[-3000:]
        outcome = job.outcome()
        [hang] = outcome["hangs"]
        assert hang["culprit"] == "worker:0" and "blocked in the kernel (state D" in hang["why"], hang
        assert [(r["task"], r["pid"]) for r in outcome["left_running"]] == [("worker:0", pid)]
        assert f"worker:0 on localhost (pid {pid}) has not ended 10s after SIGKILL" in job.stderr()
        assert psutil.Process(pid).status() == psutil.STATUS_DISK_SLEEP
        wait_for(lambda: [p.pid for p in processes_of_run(job.run_dir.name)] == [pid], 60,
                 "the host agent to leave the frozen task")
    finally:
        (group / "freezer.state").write_text("THAWED")
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 20,
                 "the thawed task to die of its pending SIGKILL")
        group.rmdir()
    nothing_left(job)


def test_a_worker_that_cannot_reach_the_leader_is_blamed_not_the_leader_waiting_for_it(runs):
    # (a firewall between hosts, as a TF_CONFIG naming a dead port makes it): both wait in
    # TensorFlow before any step; the leader's coordination service says whom it waits for
    job = Job(runs, "-s", "mwms", "--no-telemetry", "--startup-timeout", "30", "--grace", "2", "--",
              sys.executable, str(PROGRAMS / "cannot_reach_leader.py"))
    assert job.wait() == 124, job.stderr()[-3000:]
    outcome = job.outcome()
    assert (outcome["root_cause"]["task"], outcome["root_cause"]["reason"]) == ("worker:1", "hang")
    assert "worker:1 on localhost failed: hung (worker:0's coordination service still waits for it to join the " \
           "cluster (\"Waiting for 1/2 tasks to connect. Example stragglers: worker:1\"): it runs but never " \
           "connected: can it reach worker:0 at localhost:" in job.stderr(), job.stderr()[-3000:]
    nothing_left(job)


def test_a_worker_reading_its_data_before_it_listens_and_before_its_first_step_is_waited_for_not_failed(runs):
    # 12 s of reading before listening and 20 s before the first step, against a startup timeout of
    # 10 s: before, "never started listening" and then "hung (its main thread is in its own code
    # ...)", exit 124
    job = Job(runs, "-s", "mwms", "--no-telemetry", "--startup-timeout", "10", "--grace", "2", "--",
              sys.executable, str(PROGRAMS / "prepares_data.py"), env={**os.environ, "PREP_S": "12", "PREP2_S": "20"})
    assert job.wait() == 0, job.stderr()[-3000:]
    said = [line for line in job.stderr().splitlines() if "preparing, not hung" in line]
    # (under load its host's zygote may still import TensorFlow at the first timeout, or have
    # forked it just before: at work too, said so; CI59 saw "started meanwhile", then it listened)
    # (the wait said is the one measured: 10 s, or more when ddlctl's own look came late under load
    # - CI saw "not listening on its port after 12s")
    listening = [line for line in said if re.match(r"ddlctl: not listening on its port after 1\ds, but at work: ", line)
                 and "worker:1 (" in line]
    first_step = [line for line in said
                  if re.match(r"ddlctl: no first step after 1\ds, but at work: worker:1 \(", line)]
    assert listening and first_step and len(listening) + len(first_step) == len(said), job.stderr()[-3000:]
    # (a later look may find it past its strategy's creation, in TensorFlow called from the program,
    # before ddlctl's port probe saw it listen: at work too - a run beside a busy loop saw it so)
    assert all("(in its own code at programs/prepares_data.py:" in line or "zygote" in line
               or "called from programs/prepares_data.py:" in line for line in listening), listening
    # the first-step clock starts once ddlctl sees the whole cluster listening, which under load
    # may be seconds after worker:1 began its second reading, or before its strategy's creation
    # returned (then a look may find it moving on in TensorFlow: at work too); reading 20 s, it
    # is found reading at one look or another whatever the load (a suite run saw a single look,
    # whose second half fell after a 12 s reading: "in TensorFlow (eager/execute.py ...)")
    reading = [line for line in first_step if "(in its own code at programs/prepares_data.py:" in line]
    assert reading and all(" MiB/s read and written)" in line for line in reading), said
    outcome = job.outcome()
    before = [event["before"] for event in outcome["preparing"]]
    assert before == sorted(before, key=lambda b: b == "first step") and before[-1] == "first step", before
    assert any(event["before"] == "first step" and event["tasks"][0]["io_bytes_s"] > 2**20
               and event["tasks"][0]["where"].startswith("in its own code") for event in outcome["preparing"])
    assert not outcome["hangs"] and "worker:1 done" in log(job, "worker-1")
    report = (runs.parent / "ddlctl.out").read_text()
    assert "worker:1 was at work before listening on its port " in report and \
        "worker:1 was at work before its first step " in report, report
    nothing_left(job)


def test_a_task_stopped_inside_a_declared_phase_is_hung_at_its_usual_threshold_not_after_the_phases_half_hour(runs):
    """A declared phase (a checkpoint save) may go on without a step for 30 min; a process stopped
    (or blocked in the kernel: a save to a dead network filesystem) inside it does no work. Before,
    it was found after those 30 min; now at its usual threshold and two looks."""
    program = ("import os, signal, time, ddlctl\n"
               "for i in range(10):\n    with ddlctl.step():\n        time.sleep(0.05)\n"
               "with ddlctl.phase('checkpoint'):\n"
               "    print('saving', flush=True)\n    os.kill(os.getpid(), signal.SIGSTOP)\n")
    job = Job(runs, "-s", "one_device", "--hang-timeout", "4", "--max-restarts", "0", *QUICK, "--",
              sys.executable, "-c", program)
    stalled = stalled_at(job, "worker-0", "saving")
    assert job.wait(120) == 124, job.stderr()[-3000:]
    took = time.time() - stalled
    outcome = job.outcome()
    assert (outcome["root_cause"]["task"], outcome["root_cause"]["reason"]) == ("worker:0", "hang")
    said = job.stderr().replace("\n", " ")
    assert "in its checkpoint phase, but its process is stopped (state T): the phase's 30 min are for work" in said, \
        said[-3000:]
    assert "worker:0 on localhost failed: hung (its process is stopped (state T)" in said, said[-3000:]
    assert took < 4 + 5 + 30, f"found {took:.0f}s after the stop"  # threshold, two looks, a loaded machine
    nothing_left(job)
