"""The real Supervisor, driven by fake host agents (ddlctl/testing/fakeagents.py): every decision path of
the loop in milliseconds, no process, no TensorFlow. The real-process tests (test_faults,
test_ssh_faults, test_slurm) prove the wiring; these prove the behaviour, path by path."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

from ddlctl.supervise.job import TaskState
from ddlctl.testing.fakeagents import Behaviour, World

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf221"
TRACEBACK = b"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nValueError: bad batch\n"


def states(result) -> dict[str, TaskState]:
    return {t.name: t.state for t in result.tasks}


def restarts_of(result) -> dict[str, int]:
    return {t.name: t.restarts for t in result.tasks}


def ps_world(**kw) -> World:
    """chief + 2 workers + 1 ps (the servers run until stopped); the chief finishes at 4 s."""
    behaviours = {"chief:0": Behaviour(exit_after=4.0), "worker:0": Behaviour(exit_after=None),
                  "worker:1": Behaviour(exit_after=None), "ps:0": Behaviour(exit_after=None)}
    return World("ps", hosts=("node1", "node2"), workers=2, ps=1, behaviours={**behaviours, **kw})


def mwms_world(hosts=("node1", "node2"), **kw) -> World:
    """Two mwms workers that ignore SIGTERM (as TensorFlow's preemption notifier makes them)."""
    behaviours = {"worker:0": Behaviour(exit_after=4.0, ignores_term=True),
                  "worker:1": Behaviour(exit_after=4.0, ignores_term=True)}
    return World("mwms", hosts=hosts, workers=2, behaviours={**behaviours, **kw})


# -- success ----------------------------------------------------------------------------------------

def test_ps_job_ends_when_the_chief_succeeds_and_its_servers_are_stopped(tmp_path):
    world = ps_world()
    result, plan = world.run(tmp_path)
    assert (result.ok, result.exit_code) == (True, 0)
    assert states(result) == {"chief:0": TaskState.SUCCEEDED, "worker:0": TaskState.STOPPED,
                              "worker:1": TaskState.STOPPED, "ps:0": TaskState.STOPPED}
    assert world.starts[-1] == "chief:0", "servers start before the program that needs them"
    assert all(world.task(n).signals == ["TERM"] for n in ("worker:0", "worker:1", "ps:0"))
    pids = json.loads((Path(plan.run_dir) / "pids.json").read_text())
    assert set(pids) == {"chief:0", "worker:0", "worker:1", "ps:0"}


# -- restarts ---------------------------------------------------------------------------------------

def test_a_killed_ps_worker_is_restarted_in_place_with_its_restart_count(tmp_path):
    world = ps_world()
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path, max_restarts=1)
    assert result.ok, result.failure
    assert restarts_of(result) == {"chief:0": 0, "worker:0": 0, "worker:1": 1, "ps:0": 0}
    (event,) = result.restarts
    assert (event["task"], event["cause"], event["scope"]) == ("worker:1", "signal", "task")
    assert event["tasks"] == ["worker:1"]
    again = [s for s in world.started_specs if s.name == "worker:1"][-1]
    assert again.env["DDLCTL_RESTART_COUNT"] == "1"
    assert "listening_at" in event and "restarted_at" in event


def test_mwms_restarts_the_whole_group_and_kills_workers_that_ignore_sigterm(tmp_path):
    world = mwms_world()
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path, max_restarts=1)
    assert result.ok, result.failure
    assert restarts_of(result) == {"worker:0": 1, "worker:1": 1}
    first_worker0 = [s for s in world.started_specs if s.name == "worker:0"]
    assert len(first_worker0) == 2
    # worker:0 took no SIGTERM: it was killed after the restart grace
    assert any("restarting the whole worker group" in m for m in world.messages)
    assert result.restarts[0]["scope"] == "group"


def test_a_fault_during_a_restart_joins_it_with_the_wider_scope_and_one_restart_counted(tmp_path):
    world = ps_world()
    world.at(1.0, world.kill, "worker:1")
    world.at(1.1, world.kill, "ps:0")  # during the worker's restart (its backoff is 0.5 s)
    result, _ = world.run(tmp_path, max_restarts=1)
    assert result.ok, result.failure
    assert len(result.restarts) == 1, "the ps fault joined the restart under way"
    assert result.restarts[0]["task"] == "worker:1"
    assert restarts_of(result) == {"chief:0": 1, "worker:0": 1, "worker:1": 1, "ps:0": 1}
    assert any("restart 1 of 1" in m for m in world.messages)


def test_restarts_wait_a_growing_backoff(tmp_path):
    world = ps_world(**{"chief:0": Behaviour(exit_after=8.0)})
    world.at(1.0, world.kill, "worker:1")
    world.at(3.0, world.kill, "worker:1")
    starts: list[float] = []
    original = world.sessions["node1"].start, world.sessions["node2"].start

    def timed(session_start):
        def start(spec, grace_s):
            if spec.name == "worker:1":
                starts.append(world.now - 1000.0)
            return session_start(spec, grace_s)
        return start

    world.sessions["node1"].start, world.sessions["node2"].start = (timed(s) for s in original)
    result, _ = world.run(tmp_path, max_restarts=2, backoff_base_s=0.5)
    assert result.ok, result.failure
    assert len(starts) == 3
    assert 0.5 <= starts[1] - 1.0 < 0.8, "the first restart waits 0.5 s"
    assert 1.0 <= starts[2] - 3.0 < 1.3, "the second waits 1 s"


def test_no_restart_left_fails_with_the_killed_tasks_exit_code_and_error_record(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.kill, "worker:1")
    result, plan = world.run(tmp_path, max_restarts=0)
    assert (result.ok, result.exit_code) == (False, 137)
    assert (result.failure.task, result.failure.reason) == ("worker:1", "exited")
    assert "not restarted (--max-restarts 0)" in result.failure.message
    error = json.loads((Path(plan.run_dir) / "tasks" / "worker-1" / "error.json").read_text())
    assert (error["task"], error["signal"], error["cause"]) == ("worker:1", "SIGKILL", "signal")
    assert world.task("worker:0").signals[:2] == ["TERM", "KILL"], "MWMS ignores TERM: killed after the grace"


def test_a_ps_worker_without_restarts_leaves_the_job_degraded_not_failed(tmp_path):
    world = ps_world()
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path, max_restarts=0)
    assert result.ok, result.failure
    (degraded,) = result.degraded
    assert (degraded["task"], degraded["action"]) == ("worker:1", "continue")
    assert states(result)["worker:1"] is TaskState.FAILED


def test_a_python_exception_is_not_retried_under_restart_on_fault(tmp_path):
    world = mwms_world()
    world.at(1.0, world.crash, "worker:0", 1, TRACEBACK)
    result, _ = world.run(tmp_path, max_restarts=3)
    assert (result.ok, result.exit_code) == (False, 1)
    assert result.failure.task == "worker:0"
    assert result.failure.traceback[-1] == "ValueError: bad batch"
    assert "--restart-on any retries it" in result.failure.message
    assert world.starts.count("worker:0") == 1


def test_an_exit_is_judged_by_its_own_attempts_output_not_an_earlier_attempts_traceback(tmp_path):
    world = mwms_world()
    world.at(1.0, world.crash, "worker:0", 1, TRACEBACK)  # attempt 1: a Python exception (retried under any)
    world.at(6.0, world.crash, "worker:0", 3, b"")  # attempt 2: exit code 3, nothing said
    result, _ = world.run(tmp_path, max_restarts=1, restart_on="any")
    assert (result.ok, result.exit_code) == (False, 3)
    assert world.starts.count("worker:0") == 2
    assert "exit code 3; no restarts left" in result.failure.message
    assert "Python exception" not in result.failure.message, "attempt 1's traceback is not attempt 2's end"


def test_a_dead_evaluator_is_left_out_and_training_goes_on(tmp_path):
    world = ps_world()
    world.evaluator = True
    world.behaviours["evaluator:0"] = Behaviour(exit_after=None)
    world.at(1.0, world.kill, "evaluator:0")
    result, _ = world.run(tmp_path)
    assert result.ok, result.failure
    assert any("training goes on without it" in m for m in world.messages)


# -- ports ------------------------------------------------------------------------------------------

def test_a_port_taken_before_bind_gets_new_ports_for_the_whole_spec_uncounted(tmp_path):
    taken = (FIXTURES / "server_port_taken.log").read_bytes()
    world = mwms_world(**{"worker:1": Behaviour(exit_after=0.3, code=1, output=taken, ignores_term=True)})
    world.retries[("worker:1", 1)] = Behaviour(exit_after=4.0, ignores_term=True)
    plan = world.plan(tmp_path / "probe")
    port1 = plan.task("worker:1").port
    world.sessions["node2"].taken_ports.add(port1)
    result, _ = world.run(tmp_path, max_restarts=0)
    assert result.ok, result.failure
    (event,) = result.restarts
    assert (event["cause"], event["scope"]) == ("port-in-use", "group")
    assert event["new_ports"] == {"worker:1": port1 + 1000}
    restarted = [s for s in world.started_specs if s.name == "worker:0"][-1]
    assert f":{port1 + 1000}" in json.dumps(restarted.tf_config), "worker:0's TF_CONFIG names the new port"


# -- hosts ------------------------------------------------------------------------------------------

def test_a_lost_host_that_comes_back_gets_its_tasks_restarted_on_the_new_session(tmp_path):
    world = mwms_world()
    world.at(1.0, lambda: world.sessions["node2"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node2"), max_restarts=1)
    assert result.ok, result.failure
    assert world.reconnects == ["node2"]
    assert result.hosts_lost[0]["host"] == "node2"
    assert result.restarts[0]["cause"] == "host-lost"
    assert world.task("worker:1").session is world.sessions["node2"]
    assert any("reconnected to node2" in m for m in world.messages)


def test_a_lost_host_that_stays_away_fails_the_job_after_the_host_timeout(tmp_path):
    world = mwms_world()
    world.at(1.0, lambda: world.sessions["node2"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node2", comes_back=False), max_restarts=1,
                          host_timeout_s=0.6)
    assert (result.ok, result.exit_code) == (False, 255)
    assert (result.failure.reason, result.failure.task) == ("host-lost", "worker:1")
    assert "did not come back within --host-timeout 0.6s" in result.failure.message
    assert len(world.reconnects) >= 1


def test_a_group_restart_copies_worker0s_checkpoint_to_a_host_that_does_not_share_it(tmp_path):
    world = mwms_world()
    plan = world.plan(tmp_path / "probe")
    source = plan.task("worker:0").env["DDLCTL_CHECKPOINT_DIR"]
    target = plan.task("worker:1").env["DDLCTL_CHECKPOINT_DIR"]
    world.sessions["node1"].put_file(source, "ckpt-1.index", b"x" * 10)
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path, max_restarts=1)
    assert result.ok, result.failure
    assert world.sessions["node2"].files[f"{target}/ckpt-1.index"] == b"x" * 10


def test_a_checkpoint_that_cannot_be_shared_fails_the_group_restart(tmp_path):
    world = mwms_world()
    plan = world.plan(tmp_path / "probe")
    world.sessions["node1"].put_file(plan.task("worker:0").env["DDLCTL_CHECKPOINT_DIR"], "ckpt", b"x")
    world.sessions["node2"].file_error = "No space left on device"
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path, max_restarts=1)
    assert (result.ok, result.exit_code) == (False, 1)
    assert result.failure.reason == "start-failed"
    assert "No space left on device" in result.failure.message and "node2" in result.failure.message
    assert world.starts.count("worker:0") == 1, "no worker started again from a different state"


def three_mwms_hosts() -> World:
    """Three mwms workers, one per host, that finish 4 s after each start."""
    return World("mwms", hosts=("node1", "node2", "node3"), workers=3,
                 behaviours={f"worker:{i}": Behaviour(exit_after=4.0, ignores_term=True) for i in range(3)})


def test_min_workers_a_host_gone_for_good_leaves_and_the_others_regroup_into_a_smaller_cluster(tmp_path):
    world = three_mwms_hosts()
    world.at(1.0, lambda: world.sessions["node3"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node3", comes_back=False), max_restarts=1,
                          host_timeout_s=0.6, min_workers=2)
    assert (result.ok, result.exit_code) == (True, 0), result.failure
    change, = result.membership
    assert (change["workers"], change["left"], change["host"], change["cause"]) == (
        ["worker:0", "worker:1"], ["worker:2"], "node3", "host-lost")
    assert result.restarts[0]["left"] == ["worker:2"] and result.restarts[0]["scope"] == "group"
    restarted = {s.name: s for s in world.started_specs[3:]}
    assert set(restarted) == {"worker:0", "worker:1"}, "the one gone is not started again"
    for index, name in enumerate(("worker:0", "worker:1")):
        spec = restarted[name]
        assert spec.tf_config["task"] == {"type": "worker", "index": index}
        assert len(spec.tf_config["cluster"]["worker"]) == 2 and spec.env["DDLCTL_NUM_WORKERS"] == "2"
    assert states(result)["worker:2"] is TaskState.FAILED
    assert states(result)["worker:0"] is TaskState.SUCCEEDED and states(result)["worker:1"] is TaskState.SUCCEEDED
    assert any("worker:2 left the job" in m and "--min-workers 2" in m for m in world.messages)


def test_min_workers_when_worker0_leaves_the_next_leads_from_its_own_newer_checkpoint_copy(tmp_path):
    world = three_mwms_hosts()
    plan = world.plan(tmp_path / "probe")
    spec1 = plan.task("worker:1")
    shared, copy = spec1.env["DDLCTL_CHECKPOINT_DIR"], f"{spec1.task_dir}/ckpt-scratch"
    node2 = world.sessions["node2"]
    node2.put_file(shared, "checkpoint", b'model_checkpoint_path: "ckpt-75"\n')  # an older copy of worker:0's
    node2.put_file(copy, "checkpoint", b'model_checkpoint_path: "ckpt-150"\n')
    node2.put_file(copy, "ckpt-150.index", b"i" * 7)
    world.at(1.0, lambda: world.sessions["node1"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node1", comes_back=False), max_restarts=1,
                          host_timeout_s=0.6, min_workers=2)
    assert result.ok, result.failure
    assert node2.files[f"{shared}/checkpoint"] == b'model_checkpoint_path: "ckpt-150"\n'
    assert node2.files[f"{shared}/ckpt-150.index"] == b"i" * 7
    leader = [s for s in world.started_specs if s.name == "worker:1"][-1]
    assert leader.tf_config["task"]["index"] == 0, "worker:1 leads the regrouped cluster"
    assert world.sessions["node3"].files[f"{shared}/ckpt-150.index"] == b"i" * 7, "and shares its checkpoint"


def test_min_workers_that_cannot_be_kept_fail_the_job_naming_the_host_as_without_it(tmp_path):
    world = three_mwms_hosts()
    world.at(1.0, lambda: world.sessions["node3"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node3", comes_back=False), max_restarts=1,
                          host_timeout_s=0.6, min_workers=3)
    assert (result.ok, result.exit_code) == (False, 255)
    assert (result.failure.reason, result.failure.task) == ("host-lost", "worker:2")
    assert "did not come back within --host-timeout 0.6s" in result.failure.message
    assert result.membership == ()


def test_min_workers_a_ps_worker_whose_host_is_gone_leaves_and_training_goes_on(tmp_path):
    world = World("ps", hosts=("node1", "node2"), workers=2, ps=1, slots=1,
                  behaviours={"chief:0": Behaviour(exit_after=4.0), "worker:0": Behaviour(exit_after=None),
                              "worker:1": Behaviour(exit_after=None), "ps:0": Behaviour(exit_after=None)})
    plan = world.plan(tmp_path / "probe")
    lost = plan.task("worker:1").host.label
    assert lost not in (plan.task("chief:0").host.label, plan.task("ps:0").host.label), "a host of its own"
    world.at(1.0, lambda: world.sessions[lost].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to(lost, comes_back=False), max_restarts=1,
                          host_timeout_s=0.6, min_workers=1)
    assert result.ok, result.failure
    assert result.membership[0]["workers"] == ["worker:0"] and result.membership[0]["left"] == ["worker:1"]
    assert world.starts.count("worker:1") == 1 and world.starts.count("chief:0") == 1


def shrinking_world(tmp_path: Path) -> tuple[World, Callable]:
    """Three mwms workers on three hosts until node3 is lost at 1 s (its worker leaves, the others
    start again as two), then three again once taken back; the job checkpoints 1 s after ddlctl
    starts waiting for a checkpoint. Returns the world and what reconnects to node3."""
    world = World("mwms", hosts=("node1", "node2", "node3"), workers=3,
                  behaviours={f"worker:{i}": Behaviour(exit_after=None, ignores_term=True) for i in range(3)},
                  retries={("worker:0", 2): Behaviour(exit_after=4.0), ("worker:1", 2): Behaviour(exit_after=4.0),
                           ("worker:2", 1): Behaviour(exit_after=4.0)})
    plan = world.plan(tmp_path / "probe")
    shared = plan.task("worker:0").env["DDLCTL_CHECKPOINT_DIR"]
    world.sessions["node1"].put_file(shared, "checkpoint", b'model_checkpoint_path: "ckpt-40"\n', mtime_ns=1)

    class Messages(list):
        def append(self, message: str) -> None:
            super().append(message)
            if "next checkpoint" in message:
                world.at(world.now - 1000.0 + 1.0, world.sessions["node1"].put_file, shared, "checkpoint",
                         b'model_checkpoint_path: "ckpt-80"\n', 2)

    world.messages = Messages()
    world.at(1.0, lambda: world.sessions["node3"].lose("connection reset"))
    return world, world.reconnect_to("node3")


def test_min_workers_a_host_that_answers_again_is_taken_back_at_the_next_checkpoint_uncounted(tmp_path):
    # they train until taken back (the host timeout and probes run in real time, the world's clock faster)
    world, back = shrinking_world(tmp_path)

    def reconnect(host):  # refused until its workers left the job, then it answers
        if not any("left the job" in m for m in world.messages):
            world.reconnects.append(host)
            raise ConnectionRefusedError(f"{host}: connection refused")
        return back(host)

    result, _ = world.run(tmp_path, reconnect=reconnect, max_restarts=1, host_timeout_s=0.6, min_workers=2,
                          rejoin_after_s=2.0)
    assert (result.ok, result.exit_code) == (True, 0), result.failure
    left, joined = result.membership
    assert (left["workers"], left["left"]) == (["worker:0", "worker:1"], ["worker:2"])
    assert (joined["workers"], joined["joined"], joined["cause"]) == (["worker:0", "worker:1", "worker:2"],
                                                                      ["worker:2"], "grow")
    assert [(e["cause"], e["scope"]) for e in result.restarts] == [("host-lost", "group"), ("grow", "group")]
    last = {s.name: s for s in world.started_specs}
    assert [last[f"worker:{i}"].tf_config["task"]["index"] for i in range(3)] == [0, 1, 2]
    assert all(len(s.tf_config["cluster"]["worker"]) == 3 for s in last.values())
    assert world.starts.count("worker:2") == 2 and world.starts.count("worker:0") == 3
    assert any("planned: no restart counted" in m for m in world.messages), "--max-restarts 1 was enough"
    assert any("taking worker:2 back at the job's next checkpoint" in m for m in world.messages)
    assert states(result)["worker:2"] is TaskState.SUCCEEDED


def test_min_workers_a_host_away_a_short_while_is_tried_every_two_seconds_not_ever_later(tmp_path):
    """A host whose workers left is tried every 2 s during its first 30 s away (then less often): one
    back after 3 s is found at the next try, 2 s later, where the doubling delays (2, 4, 8 s) waited 4."""
    world, back = shrinking_world(tmp_path)
    tries: list[float] = []

    def reconnect(host):  # refused for 3 s after its workers left the job, then it answers
        if any("left the job" in m for m in world.messages):
            tries.append(world.now)  # the world's clock: what ddlctl's schedule follows
            if tries[-1] - tries[0] >= 3.0:
                return back(host)
        raise ConnectionRefusedError(f"{host}: connection refused")

    result, _ = world.run(tmp_path, reconnect=reconnect, max_restarts=1, host_timeout_s=0.6, min_workers=2,
                          rejoin_after_s=0.5)
    assert (result.ok, result.exit_code) == (True, 0), result.failure
    assert [(e["cause"], e["scope"]) for e in result.restarts] == [("host-lost", "group"), ("grow", "group")]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert len(tries) >= 3 and max(gaps) < 3.0, gaps
    assert 3.0 <= tries[-1] - tries[0] < 5.5, gaps


# -- hangs ------------------------------------------------------------------------------------------

def test_a_hang_blames_the_stopped_process_and_saves_every_tasks_stacks(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.stop, "worker:1")
    result, plan = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.ok, result.exit_code) == (False, 124)
    assert (result.failure.reason, result.failure.task) == ("hang", "worker:1")
    assert "its process is stopped (state T)" in result.failure.message
    dumps = Path(plan.run_dir) / "hang" / "1"
    assert sorted(p.name for p in dumps.iterdir()) == ["worker-0.txt", "worker-1.txt"]
    assert " T " in (dumps / "worker-1.txt").read_text()


def test_a_task_in_a_declared_phase_is_given_its_half_hour_unless_its_process_is_stopped_or_blocked(tmp_path):
    # a checkpoint phase with no step for 20 s against a 3 s threshold: work, waited for (its
    # process answers in its own code at the looks), and the job ends well
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True)})
    for name in ("worker:0", "worker:1"):
        world.at(1.0, world.enter_phase, name, "checkpoint")
        world.at(21.0, world.crash, name, 0, b"saved\n")
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.ok, result.exit_code, result.hangs) == (True, 0, ()), (result.failure, world.messages)
    # stopped (SIGSTOP) or blocked in the kernel (a save to a dead NFS) inside it: hung at its
    # threshold and two looks, not after the phase's 30 min
    for fault, state in ((World.stop, "its process is stopped (state T)"), (World.block, "blocked in the kernel")):
        world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True),
                              "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True)})
        for name in ("worker:0", "worker:1"):  # (worker:0 goes on saving)
            world.at(1.0, world.enter_phase, name, "checkpoint")
        world.at(2.0, fault, world, "worker:1")
        (tmp_path / state[:9]).mkdir()
        result, _ = world.run(tmp_path / state[:9], hang_timeout_s=3.0)
        assert (result.ok, result.exit_code) == (False, 124), world.messages
        assert (result.failure.reason, result.failure.task) == ("hang", "worker:1"), result.failure
        assert state in result.failure.message and "in its checkpoint phase, but " in result.failure.message
        (said,) = [m for m in world.messages if m.startswith("hang: worker:1: no progress for ")]
        idle = float(said.split("no progress for ")[1].split("s")[0])
        assert 3.0 < idle < 3.0 + 2 * 5.0 + 2.0, said  # its threshold, then two looks 5 s apart
    # blocked in the kernel but writing (a large save to a slow disk waits there between writes):
    # going on, waited for
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True, io=8e6)})
    for name in ("worker:0", "worker:1"):
        world.at(1.0, world.enter_phase, name, "checkpoint")
        world.at(21.0, world.crash, name, 0, b"saved\n")
    world.at(2.0, world.block, "worker:1")
    world.at(20.0, lambda: setattr(world.task("worker:1").behaviour, "blocked", False))
    (tmp_path / "writing").mkdir()
    result, _ = world.run(tmp_path / "writing", hang_timeout_s=3.0)
    assert (result.ok, result.exit_code, result.hangs) == (True, 0, ()), (result.failure, world.messages)


def test_a_hang_without_a_stopped_process_blames_the_first_to_stop_stepping(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=2.0, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True)})
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.failure.reason, result.failure.task) == ("hang", "worker:1")
    assert "it stopped making progress first" in result.failure.message


def test_ddlctl_stopped_for_longer_than_every_threshold_blames_no_task_for_its_own_silence(tmp_path):
    """Ctrl-Z (or SIGSTOP, a debugger) holds ddlctl for 30 s while its tasks train on: its wait for
    the hosts comes back empty and its clock has moved 30 s, far past the hang threshold. That
    silence was ddlctl's: no hang, the job ends well, the pause is said and kept."""
    world = mwms_world(**{"worker:0": Behaviour(exit_after=6.0), "worker:1": Behaviour(exit_after=6.0)})
    world.at(2.0, world.pause, 30.0)
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.ok, result.exit_code, result.hangs) == (True, 0, ()), (result.failure, world.messages)
    assert [m for m in world.messages if "did not run" in m] == [
        "this process did not run for 30s (stopped: Ctrl-Z, SIGSTOP or a debugger; or its machine was suspended): "
        "no host or task is blamed for that silence"]
    (pause,) = result.paused
    assert pause["seconds"] == 30.0
    # a task that really stops stepping after the pause is still found (its clock started again)
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=8.0, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(2.0, world.pause, 30.0)
    (tmp_path / "again").mkdir()
    result, _ = world.run(tmp_path / "again", hang_timeout_s=3.0)
    assert (result.failure.reason, result.failure.task) == ("hang", "worker:0"), result.failure


USER_LOCK = """Thread 0x2 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x1 (most recent call first):
  File "/home/me/train.py", line 42 in on_train_batch_end
  File "/venv/lib/python3.11/site-packages/keras/src/callbacks/callback_list.py", line 106 in on_train_batch_end
  File "/home/me/train.py", line 77 in <module>
"""
IN_COLLECTIVE = """Current thread 0x1 (most recent call first):
  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute
  File "/venv/lib/python3.11/site-packages/keras/src/trainers/trainer.py", line 9 in fit
  File "/home/me/train.py", line 77 in <module>
"""


def test_a_stopped_ps_worker_is_named_from_its_state_and_the_job_goes_on_degraded(tmp_path):
    # the chief's steps run on the workers in turn; worker:1 stopped: the chief waits on its closure
    world = ps_world(**{"chief:0": Behaviour(exit_after=8.0, runs_on=("worker:0", "worker:1")),
                        "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.stop, "worker:1")
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.ok, [d["task"] for d in result.degraded]) == (True, ["worker:1"])
    [hang] = result.hangs
    assert (hang["culprit"], hang["why"]) == ("worker:1", "its process is stopped (state T)")
    assert hang["rule"] == "--hang-timeout 3s" and 3.0 <= hang["idle_s"] <= 3.2
    stood = {t["task"]: t["state"] for t in hang["tasks"]}
    assert stood == {"chief:0": "waiting", "worker:0": "waiting", "worker:1": "stopped", "ps:0": "waiting"}


def test_peers_waiting_for_a_replacement_are_not_hung_before_it_listens(tmp_path):
    # worker:1 is replaced (its replacement takes 6 s to listen) and worker:0 is lost with no restart
    # left: the chief waits for the replacement longer than --hang-timeout, then trains on degraded
    world = ps_world(**{"chief:0": Behaviour(exit_after=14.0, runs_on=("worker:0", "worker:1"))})
    world.retries[("worker:1", 1)] = Behaviour(exit_after=None, listen_after=6.0)
    world.at(5.0, world.kill, "worker:1")
    world.at(6.5, world.kill, "worker:0")  # the replacement started (no backoff yet), not listening
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=1)
    assert result.ok and result.hangs == (), result.failure
    assert [e["task"] for e in result.restarts] == ["worker:1"] and [d["task"] for d in result.degraded] == ["worker:0"]


def test_a_ps_worker_that_stalls_without_stopping_is_blamed_by_its_credits_not_the_chief(tmp_path):
    world = ps_world(**{"chief:0": Behaviour(exit_after=8.0, runs_on=("worker:0", "worker:1")),
                        "worker:1": Behaviour(exit_after=None, stalls_at=1.0)})
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    [hang] = result.hangs
    assert (hang["culprit"], hang["why"]) == ("worker:1", "it stopped making progress first")
    assert [d["task"] for d in result.degraded] == ["worker:1"]


def test_a_task_in_its_own_code_is_blamed_not_the_peer_waiting_in_the_collective(tmp_path):
    # both stop at the same step: the tie goes to the stacks, not to whoever was seen last
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True,
                                                stack=IN_COLLECTIVE),
                          "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True, stack=USER_LOCK)})
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    assert (result.failure.task, result.failure.reason) == ("worker:1", "hang")
    assert "its own code at me/train.py:42 in on_train_batch_end" in result.failure.message
    assert "worker:0 waiting in TensorFlow (eager/execute.py:53 in quick_execute" in result.failure.message


def test_a_task_that_stops_while_its_peers_keep_stepping_is_hung(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.stop, "worker:1")
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "hang", 124)
    [hang] = result.hangs
    assert hang["tasks"][0]["idle_s"] < 0.2, "worker:0 stepped on"
    assert 3.0 <= hang["idle_s"] <= 3.2, "named once its own threshold passed"


def test_the_default_threshold_is_ten_times_the_p99_interval_or_sixty_seconds(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(5.0, world.stop, "worker:1")
    result, _ = world.run(tmp_path, hang_timeout_s=None, startup_timeout_s=30.0)
    assert result.failure.task == "worker:1"
    assert "threshold 60s: the 60s floor" in result.failure.message
    assert 60.0 <= result.hangs[0]["idle_s"] <= 60.2


def test_a_job_that_never_steps_is_hung_after_the_startup_timeout_by_default(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, steps=False)})
    result, _ = world.run(tmp_path, hang_timeout_s=None, startup_timeout_s=8.0)
    assert (result.failure.reason, result.exit_code) == ("hang", 124)
    assert "before the first step: the startup timeout" in result.failure.message
    assert result.failure.task == "worker:0", "nobody says more: the coordination leader"
    assert 8.0 <= result.hangs[0]["idle_s"] <= 8.2


TOKENIZING = """Current thread 0x1 (most recent call first):
  File "/home/me/prepare.py", line 12 in tokenize
  File "/home/me/train.py", line 30 in <module>
"""


def test_a_worker_preparing_its_data_before_its_first_step_is_waited_for_and_said_not_blamed(tmp_path):
    # worker:1 tokenizes for 20 s before its first step (its CPU busy in its own code); worker:0
    # waits for it in the first all-reduce, idle
    world = mwms_world(**{"worker:0": Behaviour(exit_after=25.0, ignores_term=True, prepares_for=20.0),
                          "worker:1": Behaviour(exit_after=25.0, ignores_term=True, prepares_for=20.0, busy=0.9,
                                                stack=TOKENIZING)})
    result, _ = world.run(tmp_path, hang_timeout_s=None, startup_timeout_s=8.0)
    assert result.ok and not result.hangs, result.failure
    said = [m for m in world.messages if "preparing, not hung" in m]
    assert said[0] == ("no first step after 8s, but at work: worker:1 (in its own code at me/prepare.py:12 in "
                       "tokenize, 90% of a CPU): preparing, not hung; looked at again in 8s (for up to 30 min after "
                       "its start; --startup-timeout for longer)"), said
    assert len(said) == 2 and [event["before"] for event in result.preparing] == ["first step", "first step"]
    assert result.preparing[0]["tasks"] == [{"task": "worker:1", "where": "in its own code at me/prepare.py:12 "
                                                                          "in tokenize", "cpu": 0.9, "io_bytes_s": 0}]


def test_before_the_first_step_an_idle_task_or_one_busy_at_one_place_in_tensorflow_is_hung_on_time(tmp_path):
    # busy without moving in TensorFlow: a collective spinning on a GPU host, a filter spinning in
    # tf.data: it may wait, not work; and an idle one in its own code (a sleep, a lock) is stuck
    for busy, stack, culprit in ((0.0, TOKENIZING, "worker:1"), (1.0, None, "worker:0")):
        world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                              "worker:1": Behaviour(exit_after=None, ignores_term=True, steps=False, busy=busy,
                                                    stack=stack)})
        (tmp_path / str(busy)).mkdir()
        result, _ = world.run(tmp_path / str(busy), hang_timeout_s=None, startup_timeout_s=8.0)
        assert (result.failure.reason, result.exit_code, result.failure.task) == ("hang", 124, culprit)
        assert 8.0 <= result.hangs[0]["idle_s"] <= 8.2, "the looks are taken ahead: the verdict comes on time"
        assert not result.preparing and not [m for m in world.messages if "at work" in m]


def test_a_task_that_prepares_before_it_listens_gets_its_startup_timeout_again_and_an_idle_one_fails_where_it_stands(
        tmp_path):
    world = mwms_world(**{"worker:1": Behaviour(exit_after=25.0, ignores_term=True, listen_after=20.0, busy=0.5,
                                                stack=TOKENIZING)})
    (tmp_path / "busy").mkdir()
    result, _ = world.run(tmp_path / "busy", startup_timeout_s=8.0)
    assert result.ok, result.failure
    said = [m for m in world.messages if "preparing, not hung" in m]
    assert len(said) == 2 and said[0].startswith("not listening on its port after 8s, but at work: worker:1 (in its "
                                                 "own code at me/prepare.py:12 in tokenize, 50% of a CPU)")
    assert [event["before"] for event in result.preparing] == ["listening", "listening"]
    world = mwms_world(**{"worker:1": Behaviour(exit_after=25.0, ignores_term=True, listen_after=20.0,
                                                stack=TOKENIZING)})
    (tmp_path / "idle").mkdir()
    result, _ = world.run(tmp_path / "idle", startup_timeout_s=8.0)
    assert result.failure.reason == "startup-timeout" and not result.preparing
    assert result.failure.message.startswith("startup timeout: 1 task(s) never started listening within 8s: worker:1 "
                                             "on node2 (port "), result.failure.message
    assert result.failure.message.endswith("; me/prepare.py:12 in tokenize)")


def test_a_task_at_work_for_half_an_hour_without_beginning_is_judged_by_its_timeout_again(tmp_path, monkeypatch):
    # a busy loop of its own before its first step looks like preparing: it is given up to
    # PREPARING_MAX_S (shortened here), then hung
    from ddlctl.supervise.hangs import blame as hangs
    monkeypatch.setattr(hangs, "PREPARING_MAX_S", 30.0)
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, steps=False, busy=1.0,
                                                stack=TOKENIZING)})
    result, _ = world.run(tmp_path, hang_timeout_s=None, startup_timeout_s=8.0)
    assert (result.failure.reason, result.failure.task) == ("hang", "worker:1")
    assert "its main thread is in its own code at me/prepare.py:12 in tokenize" in result.failure.message
    assert len(result.preparing) == 3 and result.hangs[0]["idle_s"] <= 8.2 and 30.0 <= result.wall_time_s <= 40.0


# the main thread of a process whose program has ended (a real dump: tests/programs/stuck_in_exit.py)
EXITING = """Thread 0x00007f2a1c9fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007ff0a5e3bb80 (most recent call first):
  Garbage-collecting
  <no Python frame>
"""
SAVING = """Current thread 0x1 (most recent call first):
  File "/venv/lib/python3.11/site-packages/h5py/_hl/dataset.py", line 998 in __setitem__
  File "/home/me/train.py", line 90 in <module>
"""


def test_a_finished_task_stuck_in_its_exit_is_ended_as_the_exit_its_program_made(tmp_path):
    # worker:0 (the coordination leader) finishes and exits; worker:1 reaches its declared last step
    # too, but its interpreter never finishes shutting down (the flake TF's teardown once gave CI)
    world = mwms_world(**{"worker:0": Behaviour(exit_after=3.0, ignores_term=True, total=40),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, total=40, stack=EXITING)})
    result, plan = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.ok, result.exit_code, result.failure) == (True, 0, None)
    assert states(result) == {"worker:0": TaskState.SUCCEEDED, "worker:1": TaskState.SUCCEEDED}
    assert world.task("worker:1").signals == ["KILL"], "ended once, by ddlctl"
    [hang] = result.hangs
    assert (hang["kind"], hang["culprit"]) == ("exit", "worker:1") and hang["why"].startswith("its program has ended")
    assert 3.0 <= hang["idle_s"] <= 3.2 and hang["rule"] == "after its last step: --hang-timeout 3s"
    assert any("worker:1's program has ended but its process has not exited (3s after its last progress" in m
               and "counted as exit code 0" in m for m in world.messages), world.messages
    assert (Path(plan.run_dir) / "hang" / "1" / "worker-1.txt").exists()


def test_a_finished_task_past_pythons_shutdown_dies_of_the_stack_request_and_counts_as_its_exit(tmp_path):
    # stuck in native teardown, faulthandler gone: the stack request's SIGUSR2 kills it
    world = mwms_world(**{"worker:0": Behaviour(exit_after=3.0, ignores_term=True, total=40),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, total=40, past_python=True)})
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=1)
    assert (result.ok, result.exit_code, result.restarts) == (True, 0, ()), result.failure
    assert states(result)["worker:1"] is TaskState.SUCCEEDED and world.task("worker:1").signals == []
    assert any("Python had shut down" in m and "request for its stacks ended it" in m and "exit code 0" in m
               for m in world.messages), world.messages


def test_a_task_exiting_as_usual_when_a_look_ends_it_is_not_recorded_stuck(tmp_path):
    # the agents starved on a loaded machine: no step report past the threshold, so ddlctl asks for
    # every task's stacks; worker:1 had taken its last step and was in its native teardown, where the
    # request's SIGUSR2 ends it. It was not stuck there (a real mwms job under load recorded it so)
    world = mwms_world(**{"worker:0": Behaviour(total=40, exit_after=4.0, ignores_term=True),
                          "worker:1": Behaviour(total=40, exit_after=None, ignores_term=True, past_python=True)})
    for host in ("node1", "node2"):
        world.at(1.0, world.starve, host)
    result, _ = world.run(tmp_path, hang_timeout_s=2.0, max_restarts=0)
    assert (result.ok, result.hangs, result.exit_code) == (True, (), 0), world.messages
    assert states(result)["worker:1"] is TaskState.SUCCEEDED
    said = [m for m in world.messages if "request ended it" in m]
    assert len(said) == 1 and "worker:1's program had ended and its process was exiting" in said[0], world.messages
    assert "within its hang threshold" in said[0] and "counted as exit code 0" in said[0]


def test_a_task_killed_by_sigusr2_without_a_stack_request_is_a_signal_fault(tmp_path):
    world = mwms_world()
    world.at(1.0, world.kill, "worker:1", signal.SIGUSR2)
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.failure.task, result.exit_code) == ("worker:1", 128 + signal.SIGUSR2)
    assert "killed by SIGUSR2" in result.failure.message


def test_a_finished_task_waiting_for_a_thread_is_said_once_and_waited_for(tmp_path):
    from tests.unit.test_hangs import JOINING

    world = mwms_world(**{"worker:0": Behaviour(exit_after=10.0, ignores_term=True, total=40),
                          "worker:1": Behaviour(exit_after=10.0, ignores_term=True, total=40, stack=JOINING)})
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.ok, result.hangs, world.task("worker:1").signals) == (True, (), [])
    said = [m for m in world.messages if "waits for a thread" in m]
    assert len(said) == 1 and said[0].startswith("worker:1 reached its last step 3s ago"), world.messages
    assert "a thread at exp/joining.py:6 in prefetch; ddlctl waits for it" in said[0]


def test_a_task_blocked_in_the_kernel_is_blamed_by_its_state_and_left_when_sigkill_cannot_end_it(tmp_path):
    # worker:0 stalls in its own code at the same moment: the blocked process still comes first
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, stalls_at=1.0, stack=USER_LOCK),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.block, "worker:1")
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "hang", 124)
    assert "blocked in the kernel (state D at nfs_wait_on_request)" in result.failure.message
    assert [(r["task"], r["pid"]) for r in result.left_running] == [("worker:1", world.task("worker:1").pid)]
    assert any("worker:1 on node2" in m and "has not ended 10s after SIGKILL" in m for m in world.messages)


def test_a_restart_that_cannot_stop_its_blocked_task_fails_instead_of_waiting_forever(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.block, "worker:1")
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=1)
    assert not result.ok and "it cannot be restarted while it lives" in result.failure.message
    assert [r["task"] for r in result.left_running] == ["worker:1"]


def test_a_finished_task_still_at_work_after_its_last_step_is_left_alone(tmp_path):
    # past its last step it saves for 12 s (three thresholds): looked at, quietly, and left alone
    world = mwms_world(**{"worker:0": Behaviour(exit_after=13.0, ignores_term=True, total=40, stack=SAVING),
                          "worker:1": Behaviour(exit_after=13.0, ignores_term=True, total=40, stack=SAVING)})
    result, plan = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.ok, result.hangs, world.task("worker:1").signals) == (True, (), [])
    assert not (Path(plan.run_dir) / "hang").exists(), "nothing to keep: no hang folder"
    assert not any("hang" in m for m in world.messages), world.messages


def test_a_task_that_never_declared_its_steps_and_hangs_in_its_exit_after_an_exception_fails_with_it(tmp_path):
    # no declared total: the hang watch finds it; its program ended in an uncaught exception
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, stalls_at=1.0, stack=EXITING)})
    world.at(1.0, world.say, "worker:1", TRACEBACK)
    world.at(1.0, world.stop, "worker:0")  # its peer waits for it (SIGSTOP stands in: it stops stepping)
    result, _ = world.run(tmp_path, hang_timeout_s=3.0, max_restarts=0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "exited", 1)
    assert "exit code 1 after a Python exception" in result.failure.message, result.failure.message
    assert any("counted as exit code 1" in m for m in world.messages), world.messages
    [hang] = result.hangs
    assert hang["culprit"] == "worker:1"


def test_steps_that_reach_ddlctl_only_with_the_stacks_are_progress_not_a_hang(tmp_path):
    # both hosts' agents starved on a loaded machine: no step report for longer than the threshold,
    # but the workers stepped meanwhile to their last step and are ending; their counts come with
    # the stacks (a real run under load: both recorded "stuck in their exit" before, just done)
    world = mwms_world(**{f"worker:{i}": Behaviour(total=40, exit_after=4.0, ignores_term=True, stack=EXITING)
                          for i in range(2)})
    for host in ("node1", "node2"):
        world.at(1.0, world.starve, host)
    result, plan = world.run(tmp_path, hang_timeout_s=2.0, max_restarts=0)
    assert (result.ok, result.hangs, result.exit_code) == (True, (), 0), world.messages
    said = [m for m in world.messages if "reached ddlctl meanwhile" in m]
    assert said and "worker:0, worker:1: progress recorded before the stacks were taken" in said[0], world.messages
    assert [world.task(f"worker:{i}").signals for i in range(2)] == [[], []], "each ended on its own"


def test_a_peer_that_names_a_hung_task_gets_it_blamed_not_itself(tmp_path):
    heartbeat = (FIXTURES / "mwms_worker1_stopped.worker0.log").read_bytes()
    world = mwms_world(**{"worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.stop, "worker:1")
    world.at(1.5, world.crash, "worker:0", 1, heartbeat)
    result, plan = world.run(tmp_path, max_restarts=0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "hang", 124)
    assert (Path(plan.run_dir) / "hang" / "1" / "worker-1.txt").exists(), "its stacks were kept first"


def test_a_peer_named_after_it_ended_with_exit_code_0_ended_early_and_is_not_restarted(tmp_path):
    report = (FIXTURES / "mwms_worker1_ended_early.worker2.log").read_bytes()
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=1.0)})  # ends on its own, exit code 0
    world.at(1.5, world.crash, "worker:0", 1, report)  # its next all-reduce fails, naming worker:1
    result, plan = world.run(tmp_path, max_restarts=2)
    assert (result.failure.task, result.exit_code) == ("worker:1", 1)
    assert result.failure.message.startswith("ended on its own (exit code 0")
    assert (result.failure.reporter, result.failure.traceback[0]) == ("worker:0", "Traceback (most recent call last):")
    assert world.starts.count("worker:1") == 1 and not result.restarts
    assert states(result)["worker:1"] is TaskState.SUCCEEDED  # its own end was a success


def test_a_worker_that_ended_before_joining_is_named_once_the_leader_says_it_waits_for_it(tmp_path):
    waiting = (FIXTURES / "mwms_worker1_never_joined.worker0.log").read_bytes()
    for first, then in ((0.2, 1.0), (1.0, 0.2)):  # worker:1 ends before the leader says it waits, or after
        world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                              "worker:1": Behaviour(exit_after=first, steps=False)})  # "not the chief": exit 0
        world.at(then, world.say, "worker:0", waiting)
        (tmp_path / str(first)).mkdir()
        result, _ = world.run(tmp_path / str(first), max_restarts=2, startup_timeout_s=30.0)
        assert (result.failure.task, result.exit_code) == ("worker:1", 1)
        assert result.failure.message.startswith("ended on its own (exit code 0) while worker:0 waits for it to join "
                                                 "the cluster (\"Waiting for 1/2 tasks to connect. Example stragglers: "
                                                 "worker:1\"): under mwms every worker must create the strategy")
        assert result.wall_time_s < 6, "not after the startup timeout (30 s), stopping worker:0 included"
        assert world.starts.count("worker:1") == 1 and not result.hangs


def test_a_hang_while_a_worker_has_ended_on_its_own_blames_that_worker(tmp_path):
    # the leader's words are not shown (TF_CPP_MIN_LOG_LEVEL=1): the hang watch finds it
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                          "worker:1": Behaviour(exit_after=0.2, steps=False)})
    result, _ = world.run(tmp_path, max_restarts=0, hang_timeout_s=None, startup_timeout_s=2.0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "exited", 1)
    assert result.failure.message.startswith("ended on its own (exit code 0) while the others wait for it (worker:0 ")
    assert "no progress for 2s (threshold 2s: before the first step" in result.failure.message
    [hang] = result.hangs
    assert hang["culprit"] == "worker:1"


def test_workers_that_step_without_ever_listening_trained_alone_and_it_is_said(tmp_path):
    # a program with MirroredStrategy under -s mwms: each worker trains, none joins the cluster
    world = mwms_world(**{"worker:0": Behaviour(exit_after=4.0, listen_after=None),
                          "worker:1": Behaviour(exit_after=4.0, listen_after=None)})
    result, _ = world.run(tmp_path)
    assert result.ok and result.unjoined == ("worker:0", "worker:1")
    said = [m for m in world.messages if "without listening" in m]
    assert said == ["worker:0, worker:1 took steps without listening on their ports (TF_CONFIG): their program did "
                    "not join the mwms cluster (it creates no tf.distribute.MultiWorkerMirroredStrategy, or not from "
                    "TF_CONFIG): each worker trains alone, on its own copy of the model"]
    assert not [m for m in world.messages if m.startswith("cluster up")], "no task listened"
    # a short job (ended within 2 s of its first step): said as the job ends
    short = mwms_world(**{"worker:0": Behaviour(exit_after=1.0, listen_after=None),
                          "worker:1": Behaviour(exit_after=1.0)})
    (tmp_path / "short").mkdir()
    result, _ = short.run(tmp_path / "short")
    assert result.unjoined == ("worker:0",) and [m for m in short.messages if "without listening" in m] == [
        "worker:0 took steps without listening on its port (TF_CONFIG): its program did not join the mwms cluster "
        "(it creates no tf.distribute.MultiWorkerMirroredStrategy, or not from TF_CONFIG): each worker trains alone, "
        "on its own copy of the model"]
    # a restarted worker reads its earlier attempt's steps before it listens again: not said
    again = mwms_world()
    again.at(1.0, again.kill, "worker:1")
    for name in ("worker:0", "worker:1"):
        again.retries[(name, 1)] = Behaviour(exit_after=8.0, listen_after=4.0, steps=False, ignores_term=True)
    (tmp_path / "again").mkdir()
    result, _ = again.run(tmp_path / "again", max_restarts=1)
    assert result.ok and result.unjoined == () and restarts_of(result) == {"worker:0": 1, "worker:1": 1}
    # those that join (they listen 0.2 s after their start) are not said
    joined = mwms_world()
    (tmp_path / "joined").mkdir()
    result, _ = joined.run(tmp_path / "joined")
    assert result.ok and result.unjoined == () and any(m.startswith("cluster up") for m in joined.messages)


def test_a_running_worker_the_leader_still_waits_for_is_blamed_at_the_startup_timeout_not_the_leader(tmp_path):
    waiting = (FIXTURES / "mwms_worker1_never_joined.worker0.log").read_bytes()
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True, steps=False),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True, steps=False)})
    world.at(0.5, world.say, "worker:0", waiting)  # and worker:1 never connects (a firewall between them)
    result, _ = world.run(tmp_path, hang_timeout_s=None, startup_timeout_s=3.0)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "hang", 124)
    assert result.failure.message.startswith("hung (worker:0's coordination service still waits for it to join the "
                                             "cluster (\"Waiting for 1/2 tasks to connect. Example stragglers: "
                                             "worker:1\"): it runs but never connected: can it reach worker:0 at ")


def test_a_running_peer_that_reports_a_stopped_task_gets_it_blamed_at_once(tmp_path):
    report = (FIXTURES / "mwms_worker1_stopped_peer_steps_on.worker0.log").read_bytes()
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.stop, "worker:1")
    world.at(2.0, world.say, "worker:0", report)  # and it goes on stepping
    result, plan = world.run(tmp_path, max_restarts=0, hang_timeout_s=None)
    assert (result.failure.task, result.failure.reason, result.exit_code) == ("worker:1", "hang", 124)
    assert "worker:0 reports" in result.failure.message and "stopped sending heartbeats" in result.failure.message
    [hang] = result.hangs
    assert hang["rule"] == "named by worker:0's TensorFlow" and 0.9 <= hang["idle_s"] <= 1.2
    assert (Path(plan.run_dir) / "hang" / "1" / "worker-1.txt").exists()


def test_a_task_that_never_listens_fails_the_startup_naming_it(tmp_path):
    world = mwms_world(**{"worker:1": Behaviour(exit_after=None, listen_after=None, ignores_term=True)})
    result, _ = world.run(tmp_path, startup_timeout_s=2.0)
    assert (result.ok, result.exit_code) == (False, 1)
    assert result.failure.reason == "startup-timeout"
    assert result.failure.missing == ("worker:1",)
    assert "worker:1 on node2" in result.failure.message


# -- signals ----------------------------------------------------------------------------------------

def test_ctrl_c_stops_every_task_never_restarts_and_exits_130(tmp_path):
    world = ps_world()
    world.at(1.0, world.signal_me, signal.SIGINT)
    result, _ = world.run(tmp_path, max_restarts=5)
    assert (result.ok, result.exit_code, result.failure.reason) == (False, 130, "interrupted")
    assert result.restarts == ()
    assert all(world.task(n).signals[0] == "TERM" for n in ("chief:0", "worker:0", "worker:1", "ps:0"))


def test_a_second_ctrl_c_kills_at_once_without_waiting_for_the_grace(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.signal_me, signal.SIGINT)
    world.at(1.2, world.signal_me, signal.SIGINT)
    result, _ = world.run(tmp_path, grace_s=60.0)
    assert result.exit_code == 130
    assert world.task("worker:0").signals[:2] == ["TERM", "KILL"]
    assert world.now - 1000.0 < 5.0, "ended long before the 60 s grace"


def test_a_third_signal_leaves_at_once(tmp_path):
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, stopped=True, kill_takes=5.0),
                          "worker:1": Behaviour(exit_after=None, ignores_term=True)})
    for when in (1.0, 1.1, 1.2):
        world.at(when, world.signal_me, signal.SIGTERM)
    result, _ = world.run(tmp_path)
    assert world.hard_exits[:1] == [128 + signal.SIGTERM]
    assert result.exit_code == 128 + signal.SIGTERM


# -- telemetry --------------------------------------------------------------------------------------

def test_a_dead_telemetry_agent_leaves_a_gap_and_the_job_goes_on(tmp_path):
    world = ps_world()
    world.telemetry = True
    world.at(1.0, world.kill, "agent:0")
    result, _ = world.run(tmp_path)
    assert result.ok
    assert result.telemetry_gaps and "telemetry agent on node1 stopped" in result.telemetry_gaps[0]
    assert (result.agents[0].name, result.agents[0].state) == ("agent:0", TaskState.FAILED)


def test_a_telemetry_agent_lost_with_its_host_starts_again_when_the_host_is_back(tmp_path):
    # before: "no telemetry from it after this", though the host came back and trained on
    world = mwms_world()
    world.telemetry = True
    world.at(1.0, lambda: world.sessions["node2"].lose("connection reset"))
    result, _ = world.run(tmp_path, reconnect=world.reconnect_to("node2"), max_restarts=1)
    assert result.ok, result.failure
    agents = {a.name: a for a in result.agents}
    back = next(a for a in agents.values() if a.host == "node2")
    assert back.restarts == 1 and back.status is not None and not back.status.lost, back
    assert world.task(back.name).session is world.sessions["node2"], "started on the host's new session"
    assert len(result.telemetry_gaps) == 1 and "started again with its host" in result.telemetry_gaps[0]
    assert any(m.startswith("telemetry agent on node2 started again with its host") for m in world.messages)
    assert next(a for a in agents.values() if a.host == "node1").restarts == 0


# -- no TensorFlow ----------------------------------------------------------------------------------



# -- GPUs in a hang ---------------------------------------------------------------------------------

def gpu_world(utils: dict[int, float], **kw) -> World:
    """Two mwms workers on one host with two GPUs (one each), both stalled at 1 s, waiting in a
    library; the telemetry agent reads ``utils`` (GPU index -> utilisation %) once they stall."""
    world = mwms_world(hosts=("node1",), **{
        "worker:0": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True, stack=IN_COLLECTIVE),
        "worker:1": Behaviour(exit_after=None, stalls_at=1.0, ignores_term=True, stack=IN_COLLECTIVE), **kw})
    world.telemetry, world.gpus = True, 2
    world.gpu_util = lambda _host, age: {0: 60.0, 1: 60.0} if age < 1.0 else utils
    return world


def test_the_task_whose_gpu_sits_idle_while_its_peers_gpu_spins_in_a_collective_is_blamed(tmp_path):
    # the NCCL pattern: worker:0 waits in an all-reduce kernel that spins its GPU, worker:1 never
    # joined it (its GPU idle); their stacks alike and their last steps equal, only the GPUs tell
    world = gpu_world({0: 100.0, 1: 0.0})
    result, plan = world.run(tmp_path, hang_timeout_s=5.0)
    assert [s.gpus for s in plan.tasks] == [(0,), (1,)]
    assert (result.failure.task, result.failure.reason) == ("worker:1", "hang")
    [hang] = result.hangs
    assert hang["culprit"] == "worker:1"
    assert hang["why"].startswith("its GPU 1 on node1 sat idle (0% busy over the 5s since its last progress): "
                                  "the stall is on the host, while the GPUs of worker:0 ran kernels all along: "
                                  "they wait for it in a collective"), hang["why"]
    gpus = {t["task"]: t["gpu"] for t in hang["tasks"]}
    assert gpus["worker:0"]["state"] == "busy" and gpus["worker:0"]["util_mean"] == 100.0
    assert gpus["worker:1"]["state"] == "idle" and gpus["worker:1"]["gpus"] == [1]
    assert gpus["worker:0"]["readings"] >= 4, "one a second over the stall"
    said = "\n".join(world.messages)
    assert "; its main thread waiting in TensorFlow (eager/execute.py:53" in said
    assert "the others: worker:0 waiting in TensorFlow (eager/execute.py:53 in quick_execute, called from " \
        "me/train.py:77 in <module>) (GPU 0 on node1 100% busy)" in said, said


def test_gpus_that_spin_or_idle_alike_blame_nobody_by_them_and_a_spinning_culprit_is_said_so(tmp_path):
    world = gpu_world({0: 100.0, 1: 100.0}, **{
        "worker:1": Behaviour(exit_after=None, stalls_at=0.5, ignores_term=True, stack=IN_COLLECTIVE)})
    result, _ = world.run(tmp_path, hang_timeout_s=5.0)
    [hang] = result.hangs
    assert hang["culprit"] == "worker:1" and hang["why"].startswith("it stopped making progress first; its GPU 1 "
                                                                    "on node1 ran kernels all along"), hang["why"]
    assert "a kernel that does not end" in hang["why"]
    idle = gpu_world({0: 0.0, 1: 0.0}, **{
        "worker:0": Behaviour(exit_after=None, stalls_at=0.5, ignores_term=True, stack=IN_COLLECTIVE)})
    (tmp_path / "idle").mkdir()
    result, _ = idle.run(tmp_path / "idle", hang_timeout_s=5.0)
    [hang] = result.hangs
    assert hang["culprit"] == "worker:0" and hang["why"].endswith("sat idle (0% busy over the 5s since its last "
                                                                  "progress): the stall is on the host"), hang["why"]


def test_a_hang_without_gpu_telemetry_says_nothing_of_gpus(tmp_path):
    world = gpu_world({0: 100.0, 1: 0.0})
    world.gpu_util = None
    result, _ = world.run(tmp_path, hang_timeout_s=3.0)
    [hang] = result.hangs
    assert hang["why"] == "it stopped making progress first" and all(t["gpu"] is None for t in hang["tasks"])


def test_the_task_whose_process_keeps_a_cpu_busy_while_its_waiting_peers_idle_is_blamed(tmp_path):
    # no GPU: worker:0 waits in a collective (gRPC: no CPU), worker:1's input pipeline spins in
    # native code (a tf.data filter that lets nothing through); both stacks wait in TensorFlow
    busy = {"worker:0": 2.0, "worker:1": 97.0}
    world = gpu_world({})
    world.gpu_util, world.gpus = None, 0
    world.task_cpu = lambda task, age: 60.0 if age < 1.0 else busy[task]
    result, _ = world.run(tmp_path, hang_timeout_s=5.0)
    [hang] = result.hangs
    assert hang["culprit"] == "worker:1", hang
    assert hang["why"].startswith("its process used 97% of a CPU core over the 5s since its last progress, the "
                                  "others' at most 2%: it works or spins in native code and they wait for it; its "
                                  "main thread waiting in TensorFlow"), hang["why"]
    cpus = {t["task"]: t["cpu"] for t in hang["tasks"]}
    assert cpus["worker:0"]["cpu_mean"] == 2.0 and cpus["worker:1"]["readings"] >= 4
    # both busy (one works, the other too: not a wait): the CPU tells nothing
    both = gpu_world({})
    both.gpu_util, both.gpus = None, 0
    both.task_cpu = lambda task, age: {"worker:0": 40.0, "worker:1": 97.0}[task]
    (tmp_path / "both").mkdir()
    result, _ = both.run(tmp_path / "both", hang_timeout_s=5.0)
    [hang] = result.hangs
    assert "CPU" not in hang["why"] and hang["why"] == "it stopped making progress first", hang["why"]
    # GPUs read: their readings decide, not the CPU (NCCL's proxy thread spins on a waiting rank's CPU)
    gpus = gpu_world({0: 60.0, 1: 60.0})
    gpus.task_cpu = lambda task, age: busy[task]
    (tmp_path / "gpus").mkdir()
    result, _ = gpus.run(tmp_path / "gpus", hang_timeout_s=5.0)
    [hang] = result.hangs
    assert hang["why"].startswith("it stopped making progress first; its GPU"), hang["why"]


def test_the_jobs_phase_moves_forward_only_and_each_move_is_recorded(tmp_path):
    from ddlctl.supervise.job import PHASE_MOVES, Job, JobPhase

    # a job that ends as planned: every task listened, training finished, the servers stopped
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    result, _ = ps_world().run(tmp_path / "a")
    assert list(result.phases) == ["starting", "running", "stopping", "ended"], result.phases
    assert 0 == result.phases["starting"] < result.phases["running"] < result.phases["stopping"] \
        <= result.phases["ended"]
    # MWMS ignores SIGTERM: KILL once the grace period has passed
    world = mwms_world(**{"worker:0": Behaviour(exit_after=None, ignores_term=True)})
    world.at(1.0, world.kill, "worker:1")
    result, _ = world.run(tmp_path / "b", max_restarts=0)
    assert list(result.phases) == ["starting", "running", "stopping", "killing", "ended"], result.phases
    assert result.phases["killing"] - result.phases["stopping"] >= 2.0, "after the grace (2 s)"
    # never backwards, never twice
    job = Job(plan=None, options=None, sessions={}, clock=lambda: 1.0)  # type: ignore[arg-type]
    assert not job.enter(JobPhase.KILLING) and job.enter(JobPhase.STOPPING) and not job.enter(JobPhase.RUNNING)
    assert not job.enter(JobPhase.STOPPING) and job.stopping and job.phase is JobPhase.STOPPING
    assert all(phase not in PHASE_MOVES[later] for phase in JobPhase for later in PHASE_MOVES[phase])
