"""The restart policy and TensorFlow's own words about who is at fault (pure functions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddlctl.diagnose.tfmessages import blame_peer
from ddlctl.supervise.policy import Fault, backoff_s, classify, decide
from ddlctl.transport.base import ExitStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf221"
PS_ROLES = {"chief:0": "chief", "worker:0": "worker", "worker:1": "worker", "ps:0": "ps", "evaluator:0": "evaluator"}
MWMS_ROLES = {"worker:0": "worker", "worker:1": "worker"}
KILLED = ExitStatus(signal=9)
TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad\n"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- TensorFlow 2.21 messages, verbatim --------------------------------------------------------

def test_killed_peer_is_named_by_the_collective_abort():
    blame = blame_peer(fixture("mwms_worker1_killed.worker0.log"), "worker:0")
    assert (blame.task, blame.kind) == ("worker:1", "unavailable")
    assert "remote target /job:worker/replica:0/task:1" in blame.line


def test_hung_non_leader_is_named_by_the_heartbeat_message():
    blame = blame_peer(fixture("mwms_worker1_stopped.worker0.log"), "worker:0")
    assert (blame.task, blame.kind) == ("worker:1", "heartbeat")


def test_hung_leader_is_implied_by_a_heartbeat_deadline_that_names_nobody():
    blame = blame_peer(fixture("mwms_worker0_stopped.worker1.log"), "worker:0")
    assert (blame.task, blame.kind) == ("worker:0", "leader")


def test_recoverable_ps_worker_loss_lines_blame_nobody_unless_they_are_the_final_error():
    text = fixture("ps_worker1_killed.chief.log")
    assert "failed with UnavailableError" in text
    assert blame_peer(text + "\n" + TRACEBACK, "chief:0") is None, "only the final error counts"


def test_a_plain_traceback_blames_nobody():
    assert blame_peer(TRACEBACK, "worker:0") is None


# -- classify -------------------------------------------------------------------------------------

def test_the_reporter_of_a_hung_peer_is_not_the_root_cause():
    fault = classify("worker:0", ExitStatus(code=1), fixture("mwms_worker1_stopped.worker0.log"), "mwms",
                     alive={"worker:1"}, known=set(MWMS_ROLES))
    assert (fault.task, fault.cause, fault.reporter) == ("worker:1", "hang", "worker:0")
    assert fault.exit_code == 124


def test_a_task_killed_from_outside_blames_no_peer_its_log_mentions():
    # a ps chief that lost worker:1 and went on, then was killed by SIGKILL (or a shell's 137)
    text = fixture("ps_worker1_killed.chief.log") + "step 72/240 loss 1.7052\n"
    for status in (KILLED, ExitStatus(code=137), ExitStatus(signal=15)):
        fault = classify("chief:0", status, text, "ps", alive=set(PS_ROLES), known=set(PS_ROLES))
        assert (fault.task, fault.cause, fault.reporter) == ("chief:0", "signal", "chief:0"), status
    # the same log and an abort of its own (SIGABRT) still names the peer
    fault = classify("chief:0", ExitStatus(signal=6), text, "ps", alive=set(PS_ROLES), known=set(PS_ROLES))
    assert (fault.task, fault.reporter) == ("worker:1", "chief:0")


def test_a_killed_peer_that_already_ended_is_a_signal_fault():
    fault = classify("worker:0", ExitStatus(code=1), fixture("mwms_worker1_killed.worker0.log"), "mwms",
                     alive=set(), known=set(MWMS_ROLES))
    assert (fault.task, fault.cause) == ("worker:1", "signal")


def test_a_peer_named_after_it_ended_on_its_own_ended_early_and_is_not_retried():
    # TensorFlow's words are those for a killed peer ("Socket closed" from task:1); ddlctl knows
    # worker:1 had ended with exit code 0 after 20 steps (tests/programs/ends_early.py's kind)
    text = fixture("mwms_worker1_ended_early.worker2.log")
    roles = {"worker:0": "worker", "worker:1": "worker", "worker:2": "worker"}
    gone = classify("worker:2", ExitStatus(code=1), text, "mwms", alive={"worker:0"}, known=set(roles))
    assert (gone.task, gone.cause) == ("worker:1", "signal")  # without knowing how it ended
    early = classify("worker:2", ExitStatus(code=1), text, "mwms", alive={"worker:0"}, known=set(roles),
                     finished={"worker:1": 20})
    assert (early.task, early.cause, early.reporter, early.exit_code) == ("worker:1", "ended-early", "worker:2", 1)
    assert early.detail.startswith("ended on its own (exit code 0, after 20 steps) while its peers went on "
                                   "(worker:2 then failed: \"Additional GRPC error information from remote target "
                                   "/job:worker/replica:0/task:1")
    assert "under mwms every worker must take the same number of steps" in early.detail
    # the reporter as far along: it failed in the step after (unrecorded): fewer batches; left
    # behind (it ran more collectives a step: an evaluation the other did not run), not the steps
    for reached, words in ((20, "take the same number of steps"),
                           (12, "run the same collective ops in the same order")):
        said = classify("worker:2", ExitStatus(code=1), text, "mwms", alive={"worker:0"}, known=set(roles),
                        finished={"worker:1": 20}, reached=reached).detail
        assert f"(worker:2, at step {reached}, then failed: " in said and f"every worker must {words}" in said
    # with two workers TensorFlow says the peer "stopped sending heartbeats", as of a hung one
    text = fixture("mwms_worker1_ended_early.worker0.log")
    assert classify("worker:0", ExitStatus(code=1), text, "mwms", alive=set(), known=set(MWMS_ROLES)).cause == "hang"
    early = classify("worker:0", ExitStatus(code=1), text, "mwms", alive=set(), known=set(MWMS_ROLES),
                     finished={"worker:1": 5})
    assert (early.task, early.cause) == ("worker:1", "ended-early") and "after 5 steps" in early.detail
    d = decide("mwms", early, roles, {"worker:0"}, used=0, max_restarts=3)
    assert d.action == "fail" and "not retried: the same program would end early again" in d.message
    assert decide("mwms", early, roles, {"worker:0"}, used=0, max_restarts=3, restart_on="any").action == "restart"
    # a ps chief naming a finished worker: no word about equal steps (ps workers take no steps)
    chief = fixture("mwms_worker1_ended_early.worker2.log").replace("/job:worker/replica:0/task:1",
                                                                   "/job:ps/replica:0/task:0")
    ps = classify("chief:0", ExitStatus(code=1), chief, "ps", alive=set(), known=set(PS_ROLES), finished={"ps:0": None})
    assert (ps.task, ps.cause) == ("ps:0", "ended-early") and ps.detail.startswith("ended on its own (exit code 0) ")
    assert "same number of steps" not in ps.detail


def test_collectives_that_do_not_match_are_the_programs_bug_not_the_peer_the_transport_names():
    # worker:1 evaluated (an all-reduce of shape [2]) where worker:0 stepped (shape [1]): TensorFlow's
    # error comes through the call to worker:0 ("remote target .../task:0"), which is alive and fine
    text = fixture("mwms_collective_shape_mismatch.worker1.log")
    fault_ = classify("worker:1", ExitStatus(code=1), text, "mwms", alive={"worker:0"}, known=set(MWMS_ROLES))
    assert (fault_.task, fault_.cause, fault_.exit_code) == ("worker:1", "collective-mismatch", 1)
    assert fault_.detail == ("exit code 1: its collective op did not match its peers' (\"Shape mismatch in the "
                             "collective instance 106. Op at device /job:worker/replica:0/task:1/device:CPU:0 expected "
                             "shape [2] but another member in the group expected shape [1].\")")
    d = decide("mwms", fault_, MWMS_ROLES, {"worker:0"}, used=0, max_restarts=3)
    assert d.action == "fail" and "every worker must run the same collective ops in the same order" in d.message
    again = decide("mwms", fault_, MWMS_ROLES, {"worker:0"}, used=0, max_restarts=3, restart_on="any")
    assert again.action == "restart"


@pytest.mark.parametrize(("status", "log", "cause"), [
    (KILLED, "", "signal"),
    (ExitStatus(code=137), "", "signal"),
    (ExitStatus(code=42), "", "preempted"),
    (ExitStatus(code=143), "", "preempted"),
    (ExitStatus(lost=True), "", "host-lost"),
    (ExitStatus(code=1), TRACEBACK, "traceback"),
    (ExitStatus(code=3), "no traceback here", "exit"),
    (ExitStatus(code=0), "", "exit"),
])
def test_own_causes(status, log, cause):
    fault = classify("worker:1", status, log, "ps", alive=set(), known=set(PS_ROLES))
    assert (fault.task, fault.cause) == ("worker:1", cause)


# -- decide: the table ------------------------------------------------------------------------------

def fault(task: str, cause: str = "signal") -> Fault:
    return Fault(task=task, cause=cause, reporter=task, status=KILLED if cause == "signal" else None, detail=cause)


ALIVE = {"chief:0", "worker:0", "ps:0", "evaluator:0"}


def test_ps_worker_is_restarted_alone_in_place():
    d = decide("ps", fault("worker:1"), PS_ROLES, ALIVE, used=0, max_restarts=2)
    assert (d.action, d.tasks, d.scope) == ("restart", ("worker:1",), "task")


def test_ps_worker_without_restarts_leaves_the_job_degraded_while_chief_and_a_worker_live():
    d = decide("ps", fault("worker:1"), PS_ROLES, ALIVE, used=0, max_restarts=0)
    assert d.action == "continue" and d.degraded and "1 worker" in d.message
    d = decide("ps", fault("worker:1"), PS_ROLES, ALIVE - {"worker:0"}, used=0, max_restarts=0)
    assert d.action == "fail" and "no worker is left" in d.message


def test_ps_chief_alone_and_ps_task_everything():
    d = decide("ps", fault("chief:0"), PS_ROLES, ALIVE, used=0, max_restarts=1)
    assert (d.tasks, d.scope) == (("chief:0",), "task")
    d = decide("ps", fault("ps:0"), PS_ROLES, ALIVE, used=0, max_restarts=1)
    assert set(d.tasks) == {"chief:0", "worker:0", "worker:1", "ps:0"} and d.scope == "all"
    assert "evaluator:0" not in d.tasks


def test_mwms_restarts_the_whole_group():
    d = decide("mwms", fault("worker:1", "hang"), MWMS_ROLES, {"worker:0", "worker:1"}, used=0, max_restarts=1)
    assert (set(d.tasks), d.scope) == ({"worker:0", "worker:1"}, "group")


def test_budget_exhausted_fails_with_the_count():
    d = decide("mwms", fault("worker:1"), MWMS_ROLES, {"worker:0"}, used=2, max_restarts=2)
    assert d.action == "fail" and "2 of --max-restarts 2" in d.message


def test_python_exception_is_a_bug_under_fault_and_retried_under_any():
    d = decide("one_device", fault("worker:0", "traceback"), {"worker:0": "worker"}, set(), used=0, max_restarts=3)
    assert d.action == "fail" and "--restart-on any" in d.message and "bug" in d.message
    d = decide("one_device", fault("worker:0", "traceback"), {"worker:0": "worker"}, set(), used=0, max_restarts=3,
               restart_on="any")
    assert d.action == "restart"


def test_evaluator_never_ends_the_job():
    d = decide("ps", fault("evaluator:0", "traceback"), PS_ROLES, ALIVE, used=0, max_restarts=0)
    assert d.action == "continue"
    d = decide("ps", fault("evaluator:0"), PS_ROLES, ALIVE, used=0, max_restarts=1)
    assert (d.action, d.tasks) == ("restart", ("evaluator:0",))


def test_backoff_doubles_and_is_capped():
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff_s(20) == 30


# -- hang watch --------------------------------------------------------------------------------------

def test_a_running_peers_heartbeat_report_names_the_stopped_task_without_a_traceback():
    from ddlctl.diagnose.tfmessages import LiveReports

    reports = LiveReports()
    found = [b for b in map(reports.feed, fixture("mwms_worker1_stopped_peer_steps_on.worker0.log").splitlines())
             if b is not None]
    [blame] = found
    assert (blame.task, blame.kind) == ("worker:1", "heartbeat")
    assert blame.line.startswith("E0000") and "stopped sending heartbeats" in blame.line
    quiet = LiveReports()
    assert all(quiet.feed(line) is None for line in fixture("ps_worker1_killed.chief.log").splitlines()), \
        "a ps chief's recoverable worker losses name nobody"


def test_the_leaders_coordination_service_says_which_tasks_it_still_waits_for():
    from ddlctl.diagnose.tfmessages import LiveReports

    reports = LiveReports()
    seen = []
    for line in fixture("mwms_three_workers_connect.worker0.log").splitlines():
        assert reports.feed(line) is None
        seen.append(reports.stragglers)
    # "Waiting for 2/3 ... Example stragglers:" then a name a line; each connection says it anew
    assert ("worker:1", "worker:2") in seen and ("worker:2",) in seen
    assert reports.stragglers == () and reports.waiting == "Waiting for 0/3 tasks to connect."
    never = LiveReports()
    for line in fixture("mwms_worker1_never_joined.worker0.log").splitlines():
        never.feed(line)
    # the names end with the next log line; the last count stands until another comes
    assert (never.stragglers, never.waiting) == (("worker:1",), "Waiting for 1/2 tasks to connect.")


def test_a_server_that_could_not_bind_its_port_is_recognised():
    from ddlctl.diagnose.tfmessages import port_taken

    assert port_taken(fixture("server_port_taken.log"))
    assert not port_taken(fixture("mwms_worker1_killed.worker0.log"))


def test_a_profiler_port_taken_is_a_taken_port_of_this_attempt_only_and_moves_where_it_is_named(tmp_path):
    import json

    from ddlctl.cluster.model import Host
    from ddlctl.diagnose.tfmessages import port_taken, profiler_port_taken
    from ddlctl.planning.plan import TaskSpec, profiler_ports, reprofile
    from ddlctl.supervise.tasklog import TaskLog

    words = "ddlctl server: ps:0 cannot serve TensorFlow's profiler on port 4242: Address already in use\n"
    assert port_taken(words) and profiler_port_taken(words) == 4242 and profiler_port_taken("port 4242") is None
    log = TaskLog(tmp_path / "output.log")
    log.mark()
    log.write(words.encode())
    assert port_taken(log.attempt())
    log.mark()  # started again (on a new port): killed later, its earlier words are not its end
    log.write(b"ddlctl server: ps:0 serves TensorFlow's profiler on port 5000\n")
    assert not port_taken(log.attempt()) and port_taken(log.tail()) and log.attempt().startswith("ddlctl server")
    def spec(name: str, env: dict) -> TaskSpec:
        return TaskSpec(name, name[:-2], 0, Host("h"), 1, "server", (), env, (), "/", "/t", None, None)

    server = spec("ps:0", {"DDLCTL_PROFILER_SERVE": "4242"})
    assert profiler_ports(server) == {"ps:0@profiler": 4242}
    assert reprofile(server, {"ps:0@profiler": 5000}).env == {"DDLCTL_PROFILER_SERVE": "5000"}
    chief = spec("chief:0", {"DDLCTL_PROFILER_ADDRESSES": json.dumps({"ps:0": "h2:4242", "worker:0": "h1:7"})})
    moved = reprofile(chief, {"ps:0@profiler": 5000, "worker:0": 9})  # (a TF port is not a profiler's)
    assert json.loads(moved.env["DDLCTL_PROFILER_ADDRESSES"]) == {"ps:0": "h2:5000", "worker:0": "h1:7"}
    assert reprofile(chief, {}) is chief and profiler_ports(chief) == {}


def test_a_crash_while_the_profiler_captured_restarts_once_uncounted_and_its_marker_tells_the_agent(tmp_path):
    from ddlctl.contract.wire import GarbledFrame, check_frame
    from ddlctl.host.files import take_profiling
    from ddlctl.supervise.policy import profiler_crash
    from ddlctl.task.trace import Capture

    capture = Capture(3, 4, str(tmp_path / "profile"))
    capture._profiling("steps-3-4")  # (what _start says once TensorFlow's profiler runs)
    assert take_profiling(str(tmp_path)) == "steps-3-4" and take_profiling(str(tmp_path)) is None, "taken once"
    (tmp_path / "profiling.json").write_text("[1]")
    assert take_profiling(str(tmp_path)) is None, "a marker that is not one says nothing"
    assert check_frame({"k": "exit", "task": "worker:1", "signal": 11, "profiling": "auto-1-steps-4-13"})
    with pytest.raises(GarbledFrame):
        check_frame({"k": "exit", "task": "worker:1", "signal": 11, "profiling": ["x"]})
    segv = ExitStatus(signal=11, profiling="auto-1-steps-4-13")
    d = profiler_crash("mwms", "worker:1", "h2", segv, MWMS_ROLES, {"worker:0"}, set())
    assert d is not None and d.action == "restart" and d.scope == "group" and set(d.tasks) == set(MWMS_ROLES)
    assert d.message.startswith("worker:1 on h2 killed by SIGSEGV while TensorFlow's profiler was capturing it "
                                "(auto-1-steps-4-13)") and "once, with tracing off (no restart counted)" in d.message
    abort = ExitStatus(signal=6, profiling="steps-3-4")
    d = profiler_crash("ps", "worker:1", "h2", abort, PS_ROLES, set(PS_ROLES), set())
    assert d is not None and d.tasks == ("worker:1",), "the strategy's own scope: a ps worker alone"
    assert profiler_crash("mwms", "worker:1", "h2", segv, MWMS_ROLES, set(), {"worker:1"}) is None, "once"
    for status in (ExitStatus(signal=9, profiling="x"), ExitStatus(signal=11), ExitStatus(code=1, profiling="x")):
        assert profiler_crash("mwms", "worker:1", "h2", status, MWMS_ROLES, set(), set()) is None, status


def test_data_workers_of_a_host_gone_for_good_leave_while_another_remains_with_or_without_min_workers():
    from ddlctl.supervise.policy import shrink

    roles = {**MWMS_ROLES, "dispatcher:0": "dispatcher", "data:0": "data", "data:1": "data"}
    d = shrink("mwms", ["data:1"], ["data:1"], roles, 0, "host d2 cannot come back")
    assert (d.action, d.tasks, d.scope) == ("shrink", (), "task")
    assert d.message == "data:1 left the job (host d2 cannot come back): training goes on with 1 data worker(s)"
    assert shrink("mwms", ["data:0", "data:1"], [], roles, 0, "gone") is None, "no data worker would be left"
    assert shrink("mwms", ["dispatcher:0", "data:0"], [], roles, 0, "gone") is None, "the dispatcher cannot leave"
    both = shrink("mwms", ["worker:1", "data:1"], ["worker:0", "worker:1", "data:1"], roles, 1, "gone")
    assert (both.tasks, both.scope) == (("worker:0",), "group") and both.message.endswith(
        "with 1 worker(s) (--min-workers 1) and 1 data worker(s)")
    assert shrink("mwms", ["worker:1", "data:1"], [], roles, 0, "gone") is None, "workers still need --min-workers"
    from ddlctl.supervise.policy import grow_back

    back = grow_back("mwms", ["data:1"], "d2", roles)
    assert (back.tasks, back.scope) == (("data:1",), "task"), "no group restart for data workers back"
    assert grow_back("mwms", ["worker:1", "data:1"], "d2", roles).scope == "group"


def test_a_ps_chief_that_died_of_a_lost_worker_is_restarted_with_it():
    fault = Fault(task="worker:0", cause="signal", reporter="chief:0", status=None, detail="gone")
    alive = {"worker:1", "ps:0"}
    d = decide("ps", fault, PS_ROLES, alive, used=0, max_restarts=1)
    assert d.action == "restart" and set(d.tasks) == {"worker:0", "chief:0"}
    d = decide("ps", fault, PS_ROLES, alive, used=0, max_restarts=0)
    assert d.action == "fail" and "the chief is gone too" in d.message


#: A ps chief's end when it was held (stopped) across a worker's replacement, then fetched a result
#: the replaced worker no longer had (TensorFlow 2.21's words, as seen in a merged fault test).
STALE_CHIEF = (
    'Traceback (most recent call last):\n'
    '  File "ddlctl/workloads/train.py", line 300, in train_ps\n'
    '    figures = remote.fetch()\n'
    'tensorflow.python.framework.errors_impl.InvalidArgumentError: Unable to find the relevant tensor '
    'remote_handle: Op ID: 2291, Output num: 0\n'
    'Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling '
    '/tensorflow.eager.EagerService/Enqueue:\n')


#: A restarted ps chief's end when a worker kept across the restart could not hand it a closure's
#: result (TensorFlow 2.21's words, as seen once in a loaded suite; raised by the next ``schedule``).
UNPARSED_CHIEF = (
    'Traceback (most recent call last):\n'
    '  File "ddlctl/workloads/train.py", line 313, in train_ps\n'
    '    pending.append((first, count, schedule(first, count)))\n'
    'tensorflow.python.framework.errors_impl.InternalError: 2 root error(s) found.\n'
    '  (0) INTERNAL: {{function_node __wrapped__Identity_device_/job:chief/replica:0/task:0/device:CPU:0}} '
    'Unable to parse request\n'
    'Additional GRPC error information from remote target /job:worker/replica:0/task:0/device:CPU:0 while '
    'calling /tensorflow.eager.EagerService/RunComponentFunction:\n'
    ':UNKNOWN:Error received from peer  {grpc_message:"Unable to parse request", grpc_status:13}\n'
    '  (1) CANCELLED: {{function_node __wrapped__Identity_device_/job:chief/replica:0/task:0/device:CPU:0}} '
    'RecvFromRemoteAsync is cancelled.\n')


def test_a_restarted_ps_chief_that_a_kept_worker_could_not_answer_is_a_fault_not_a_bug():
    fault_ = classify("chief:0", ExitStatus(code=1), UNPARSED_CHIEF, "ps", alive={"worker:0", "worker:1", "ps:0"},
                      known=set(PS_ROLES))
    assert (fault_.task, fault_.cause) == ("chief:0", "peer-restart"), "not worker:0, named in the message"
    assert "Unable to parse request" in fault_.detail
    assert decide("ps", fault_, PS_ROLES, {"worker:0", "worker:1", "ps:0"}, used=1, max_restarts=3).action == "restart"


def test_a_ps_chief_that_lost_a_restarted_workers_results_is_a_fault_restarted_alone_not_a_bug():
    fault_ = classify("chief:0", ExitStatus(code=1), STALE_CHIEF, "ps", alive={"worker:0", "worker:1", "ps:0"},
                      known=set(PS_ROLES))
    assert (fault_.task, fault_.cause) == ("chief:0", "peer-restart"), "nobody else is blamed, and no bug"
    assert "Unable to find the relevant tensor remote_handle" in fault_.detail
    d = decide("ps", fault_, PS_ROLES, {"worker:0", "worker:1", "ps:0"}, used=0, max_restarts=3)
    assert (d.action, d.tasks) == ("restart", ("chief:0",))
    plain = classify("chief:0", ExitStatus(code=1), STALE_CHIEF.replace("Unable to find the relevant tensor", "bad"),
                     "ps", alive={"worker:0", "worker:1", "ps:0"}, known=set(PS_ROLES))
    assert plain.cause == "traceback"
    assert decide("ps", plain, PS_ROLES, {"worker:0", "worker:1", "ps:0"}, used=0, max_restarts=3).action == "fail"


#: A checkpoint saved into a full disk (TensorFlow 2.21's words, from a run whose --runs-dir was a
#: 400 KiB tmpfs).
FULL_DISK_SAVE = (
    'Traceback (most recent call last):\n'
    '  File "ddlctl/workloads/train.py", line 214, in train_synchronous\n'
    '    manager.save(checkpoint_number=step)\n'
    'tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node '
    '__wrapped__SaveV2_dtypes_23_device_/job:localhost/replica:0/task:0/device:CPU:0}} '
    '/tmp/tiny/20261127-151156-one_device-7c2a31/checkpoints/ckpt-208_temp/part-00000-of-00001.index.'
    'tempstate4886987922491430093; No space left on device [Op:SaveV2]\n')


def test_a_task_that_died_of_a_full_disk_is_blamed_on_the_disk_and_not_retried_as_a_fault():
    ckpt = "/tmp/tiny/20261127-151156-one_device-7c2a31/checkpoints/ckpt-208_temp/part-00000-of-00001.index." \
           "tempstate4886987922491430093"
    fault_ = classify("worker:0", ExitStatus(code=1), FULL_DISK_SAVE, "one_device", alive=set(), known={"worker:0"})
    assert (fault_.task, fault_.cause) == ("worker:0", "disk-full")
    assert fault_.detail == f"exit code 1: its disk is full (No space left on device, writing {ckpt})"
    failed = decide("one_device", fault_, {"worker:0": "worker"}, set(), used=0, max_restarts=3)
    assert failed.action == "fail" and "not retried: a restart would fill the same disk again" in failed.message
    assert "a bug in the program" not in failed.message
    # --restart-on any retries it (space may have been freed), as any other failure
    assert decide("one_device", fault_, {"worker:0": "worker"}, set(), used=0, max_restarts=3,
                  restart_on="any").action == "restart"
    # Python's own words, with a quota instead of a full disk; under MWMS a full disk is the task's
    # own fault even where TensorFlow's words would blame a peer
    quota = ('Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
             "OSError: [Errno 122] Disk quota exceeded: '/home/me/ckpt/weights.h5'\n"
             "Additional GRPC error information from remote target /job:worker/replica:0/task:1\n")
    mwms = classify("worker:0", ExitStatus(code=1), quota, "mwms", alive={"worker:1"}, known={"worker:0", "worker:1"})
    assert (mwms.task, mwms.cause) == ("worker:0", "disk-full")
    assert mwms.detail == "exit code 1: its disk is full (Disk quota exceeded, writing /home/me/ckpt/weights.h5)"
    # a program's own message about a disk is not the kernel's error
    own = 'Traceback (most recent call last):\nRuntimeError: disk full on purpose\n'
    assert classify("worker:0", ExitStatus(code=1), own, "mwms", alive=set(), known={"worker:0"}).cause == "traceback"


def test_an_oom_kill_is_read_from_the_kernel_log_by_pid_and_time_and_is_a_fault_retried(tmp_path):
    from ddlctl.host.oom import killed_in_log

    # the kernel's records (this machine's /dev/kmsg, after a memory group's limit and a host OOM)
    records = ["6,990,55880000000,-;eth0: link up\n",
               "3,1005,55889115784,-;Memory cgroup out of memory: Killed process 23836 (python) total-vm:161764kB, "
               "anon-rss:137600kB, file-rss:6544kB, shmem-rss:0kB, UID:0 pgtables:328kB oom_score_adj:0\n",
               "3,1200,55900000000,-;Out of memory: Killed process 24000 (python) total-vm:24799336kB, "
               "anon-rss:24368156kB, file-rss:180kB, shmem-rss:0kB, UID:0 pgtables:47772kB oom_score_adj:0\n"]
    assert killed_in_log(records, 23836, 55880000000) == \
        "the kernel's OOM killer, for its memory group's limit: it held 134 MiB when killed"
    assert killed_in_log(records, 24000, 55890000000) == \
        "the kernel's OOM killer, for the host's memory: it held 23,797 MiB when killed"
    assert killed_in_log(records, 23836, 55890000000) is None, "an older kill of a pid reused since"
    assert killed_in_log(records, 23837, 0) is None
    # where the kernel log cannot be read: the host's OOM-kill count over the task's life
    from ddlctl.host.oom import oom_evidence

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 100\noom_kill 7\n")
    assert oom_evidence(23836, 0, 5, kmsg=str(tmp_path / "unreadable"), vmstat=str(vmstat)) == (
        "the kernel's OOM killer killed 2 process(es) on this host while it ran (/proc/vmstat; the kernel log, "
        "which would name them, is not readable here)")
    assert oom_evidence(23836, 0, 7, kmsg=str(tmp_path / "unreadable"), vmstat=str(vmstat)) is None
    oom = ExitStatus(signal=9, oom="the kernel's OOM killer, for the host's memory: it held 2 MiB when killed")
    fault_ = classify("worker:1", oom, "", "mwms", alive={"worker:0"}, known={"worker:0", "worker:1"})
    assert (fault_.task, fault_.cause) == ("worker:1", "oom")
    assert fault_.detail == "killed by SIGKILL: out of memory (the kernel's OOM killer, for the host's memory: " \
                            "it held 2 MiB when killed)"
    assert decide("mwms", fault_, {"worker:0": "worker", "worker:1": "worker"}, {"worker:0"}, used=0,
                  max_restarts=1).action == "restart"
    assert classify("worker:1", ExitStatus(signal=9), "", "mwms", alive=set(), known={"worker:1"}).cause == "signal"


def test_a_device_that_ran_out_of_memory_is_said_and_not_retried_as_a_fault():
    # TensorFlow 2.21's words (a tensor too large for this machine's CPU allocator, made for real)
    tf_oom = ('Traceback (most recent call last):\n  File "train.py", line 2, in <module>\n'
              'tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node '
              '__wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}} OOM when allocating tensor with '
              'shape[274877906944,64] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu '
              '[Op:Fill] name: \n')
    fault_ = classify("worker:0", ExitStatus(code=1), tf_oom, "mwms", alive={"worker:1"},
                      known={"worker:0", "worker:1"})
    assert (fault_.task, fault_.cause) == ("worker:0", "device-oom")
    assert fault_.detail == "exit code 1: out of memory on CPU:0 (a float tensor of shape [274877906944,64], " \
                            "allocator cpu)"
    failed = decide("mwms", fault_, {"worker:0": "worker", "worker:1": "worker"}, {"worker:1"}, used=0, max_restarts=3)
    assert failed.action == "fail" and "the same step would run out of memory again; a smaller batch" in failed.message
    # PyTorch 2.11's, verbatim (a program of your own under ddlctl profile taking 8 GiB pieces of an
    # NVIDIA H200 until CUDA refused, made for real on the device machine)
    torch_oom = ("Traceback (most recent call last):\n  File \"/work/main/.devcheck/oom.py\", line 11, in <module>\n"
                 "    held.append(torch.empty(8 * 2**30, dtype=torch.uint8, device=\"cuda\"))\n"
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity "
                 "of 139.80 GiB of which 3.16 GiB is free. Including non-PyTorch memory, this process has 136.63 GiB "
                 "memory in use. Of the allocated memory 136.06 GiB is allocated by PyTorch, and 0 bytes is reserved "
                 "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                 "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-"
                 "with-pytorch-cuda-alloc-conf)\n")
    fault_ = classify("worker:0", ExitStatus(code=1), torch_oom, "one_device", alive=set(), known={"worker:0"})
    assert (fault_.cause, fault_.detail) == ("device-oom", "exit code 1: out of memory on GPU 0 (tried to allocate "
                                                           "8.00 GiB; 139.80 GiB in all, 3.16 GiB free)")
    nothing_free = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 146.00 MiB. GPU 0 has a total "
                    "capacity of 8.00 GiB of which 0 bytes is free.\n")
    assert classify("worker:0", ExitStatus(code=1), nothing_free, "one_device", alive=set(),
                    known={"worker:0"}).detail.endswith("(tried to allocate 146.00 MiB; 8.00 GiB in all, 0 bytes free)")
    older = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify("worker:0", ExitStatus(code=1), older, "one_device", alive=set(), known={"worker:0"}).detail == \
        "exit code 1: out of memory on the GPU (tried to allocate 2.00 GiB)"


def test_a_program_reading_its_missing_standard_input_is_told_how_to_give_it_what_it_asks():
    # input() with a prompt: the traceback's header follows the prompt on its line (a real log)
    log = ('dataset? Traceback (most recent call last):\n  File "/tmp/bad/reads.py", line 1, in <module>\n'
           '    name = input("dataset? ")\n           ^^^^^^^^^^^^^^^^^^\nEOFError: EOF when reading a line\n')
    fault = classify("worker:0", ExitStatus(code=1), log, "one_device", set(), {"worker:0"})
    assert fault.cause == "traceback" and fault.detail == (
        "exit code 1 after a Python exception: it read its standard input, and tasks have none (ddlctl gives them "
        "/dev/null, on every host): give it what it asks as arguments after --, environment variables (--env) or a "
        "file")
    other = classify("worker:0", ExitStatus(code=1), log.replace("EOFError: EOF when reading a line", "ValueError: x"),
                     "one_device", set(), {"worker:0"})
    assert other.detail == "exit code 1 after a Python exception"


def test_a_program_that_could_not_import_a_module_is_told_which_python_ran_it_and_what_to_do():
    from ddlctl.diagnose.imports import import_hint, missing_module, missing_module_hint

    log = ('Traceback (most recent call last):\n  File "/w/train.py", line 2, in <module>\n    import tensorflow.keras'
           '\nModuleNotFoundError: No module named \'tensorflow\'\n')
    fault = classify("worker:0", ExitStatus(code=1), log, "mwms", set(), {"worker:0", "worker:1"})
    assert (fault.cause, fault.detail) == ("no-module", "exit code 1 after a Python exception")
    failed = decide("mwms", fault, MWMS_ROLES, {"worker:1"}, 0, 3, "fault")
    assert failed.action == "fail" and failed.message.endswith(
        "not retried: the same Python would not find it again (--restart-on any retries it)")
    assert decide("mwms", fault, MWMS_ROLES, {"worker:1"}, 0, 3, "any").action == "restart"
    # the module's top package; one caught and followed by another error is not the cause
    assert missing_module(log.replace("'tensorflow'", "'tensorflow.compat.v9'")) == "tensorflow"
    assert missing_module(log + "During handling of the above exception, another exception occurred:\n\n"
                          "Traceback (most recent call last):\nValueError: x\n") is None
    assert missing_module("ModuleNotFoundError: No module named 'x'\n") is None  # (no traceback: a line it printed)
    # on a remote host: which command's Python, and how to find one that has it
    assert missing_module_hint("tensorflow", ["python3", "train.py"], "gpu1") == (
        "it cannot import tensorflow: the Python it ran under, `python3` on gpu1, does not have it: install "
        "tensorflow into it, or give after -- a Python on gpu1 that has it (a bare name is looked up on the host's "
        "PATH, with no virtual environment activated; `ddlctl check` says what each host's Python imports)")
    assert import_hint(log, ["python3", "train.py"], "gpu1", False, "/w", "/usr/bin/python3").startswith(
        "it cannot import tensorflow: the Python it ran under, `python3` (/usr/bin/python3) on gpu1, does not have it: "
        "install tensorflow into it")  # (where its host agent found it)
    assert missing_module_hint("torch", ["bash", "run.sh"], "gpu1").startswith(
        "it cannot import torch: the Python its command (`bash`) started on gpu1 does not have it: install torch")
    # here: where the PATH found it, and ddlctl's own Python when that one has it (this test's: pytest)
    hint = import_hint(log.replace("'tensorflow'", "'pytest'"), ["python", "train.py", "--epochs", "2"],
                       "localhost", local=True)
    assert hint is not None and f"ddlctl's own Python there does ({sys.executable}): give that one after -- " \
        f"(`-- {sys.executable} train.py --epochs 2`)" in hint
    assert "own Python" not in (import_hint(log.replace("'tensorflow'", "'no_such_module_here'"), ["python", "t.py"],
                                            "localhost", local=True) or "own Python")
    assert "own Python" not in (import_hint(log.replace("'tensorflow'", "'pytest'"), [sys.executable, "t.py"],
                                            "localhost", local=True) or "own Python")  # (it is the one that ran)
    # `python -m MODULE` that finds no MODULE: Python's one line, no traceback, exit code 1
    to_run = "/v/bin/python: No module named trainer.main\n"
    fault = classify("worker:0", ExitStatus(code=1), to_run, "mwms", set(), {"worker:0"})
    assert (fault.cause, fault.detail) == ("no-module", "exit code 1: its Python found no module trainer.main to run "
                                                        "(-m)")
    assert import_hint(to_run, ["python", "-m", "trainer.main"], "gpu1", False, "/w") == (
        "tasks run in /w on gpu1, where `python -m` looks for trainer.main first (then PYTHONPATH and its "
        "site-packages): start ddlctl from the folder that holds it, give the host workdir= in the hosts file, or add "
        "its folder with --env PYTHONPATH=FOLDER")
    # a package without __main__
    package = "/v/bin/python: No module named trainer.__main__; 'trainer' is a package and cannot be directly " \
              "executed\n"
    fault = classify("worker:0", ExitStatus(code=1), package, "mwms", set(), {"worker:0"})
    assert (fault.cause, fault.detail) == ("no-module", "exit code 1: its Python found no module trainer.__main__ to "
                                                        "run (-m)")
    assert import_hint(package, ["python", "-m", "trainer"], "gpu1", False, "/w") == (
        "trainer is a package without a __main__ module: give the module in it that runs the training "
        "(`-m trainer.train`, say), or add trainer/__main__.py")
    # a program that printed such a line and went on is not that (its last line is another)
    assert classify("worker:0", ExitStatus(code=1), to_run + "then it failed\n", "mwms", set(),
                    {"worker:0"}).cause == "exit"


@pytest.mark.parametrize("strategy, log", [("mwms", "mwms_keras3_fit.worker1.log"), ("ps", "ps_keras3_fit.chief.log")])
def test_keras3_model_fit_under_ps_or_mwms_is_said_to_be_keras3s_limit_with_what_to_use(strategy, log):
    # real logs (TensorFlow 2.21, Keras 3.x): model.fit of `import keras` under each strategy
    text = fixture(log)
    task = "worker:1" if strategy == "mwms" else "chief:0"
    fault = classify(task, ExitStatus(code=1), text, strategy, {"worker:0"}, {"worker:0", "worker:1", "chief:0"})
    assert (fault.task, fault.cause) == (task, "traceback")
    assert fault.detail == (f"exit code 1 after a Python exception: Keras 3's model.fit does not work under {strategy} "
                            "(TensorFlow 2.21; keras-team/keras#18624, #20585): use tf.keras, which ddlctl makes "
                            "tf-keras (TF_USE_LEGACY_KERAS=1, unless --no-legacy-keras; pip install tf-keras), or "
                            "`import tf_keras as keras`, or a custom training loop")
    # the same failure under a single-host strategy, or through tf-keras's fit, is not Keras 3's limit
    assert classify(task, ExitStatus(code=1), text, "mirrored", set(), {task}).detail == \
        "exit code 1 after a Python exception"
    tf_keras = text.replace("site-packages/keras/src/", "site-packages/tf_keras/src/")
    assert classify(task, ExitStatus(code=1), tf_keras, strategy, set(), {task}).detail == \
        "exit code 1 after a Python exception"
    # nor another error of a program that uses Keras 3 elsewhere than in fit
    other = TRACEBACK.replace('line 3, in <module>\n', 'line 3, in <module>\n    model.compile()\n  File '
                              '"/v/site-packages/keras/src/trainers/trainer.py", line 9, in compile\n')
    assert classify(task, ExitStatus(code=1), other, strategy, set(), {task}).detail == \
        "exit code 1 after a Python exception"


def test_a_task_its_host_agent_could_not_start_is_not_started_whatever_its_code_and_a_program_saying_so_is_not():
    why = "the program /w/train.py is not on h2 (tasks run train.py from /w): put it at the same path"
    said = f"ddlctl: {why}\n"  # (what the task's output shows)
    fault = classify("worker:1", ExitStatus(code=2, not_started=why), said, "mwms", {"worker:0"},
                     {"worker:0", "worker:1"})
    assert (fault.cause, fault.task) == ("not-started", "worker:1")
    assert fault.detail == "not started: the program /w/train.py is not on h2 (tasks run train.py from /w): put it " \
                           "at the same path"
    alive = {"worker:0"}
    assert decide("mwms", fault, MWMS_ROLES, alive, 0, 3, "any").action == "restart", "--restart-on any retries it"
    failed = decide("mwms", fault, MWMS_ROLES, alive, 0, 3, "fault")
    assert failed.action == "fail" and failed.message.endswith("not retried: it would not start again (--restart-on "
                                                                "any retries it)")
    # a program of the user's that printed such a line (it ran): its own exit
    ran = classify("worker:1", ExitStatus(code=2), said + "usage: train.py [-h]\n", "mwms", set(), {"worker:1"})
    assert ran.cause == "exit"
    assert classify("worker:1", ExitStatus(code=2), said, "mwms", set(), {"worker:1"}).cause == "exit"
