"""The hang watch's thresholds, where a stack says a task stood, and whom a hang blames: pure
functions, milliseconds. The supervisor's use of them is in test_supervisor.py; real hangs of
real TensorFlow tasks in test_faults.py."""

from __future__ import annotations

from ddlctl.diagnose.stack_dumps import Standing, stand, threads
from ddlctl.supervise.hangs.blame import hang_culprit
from ddlctl.supervise.hangs.preparing import at_work
from ddlctl.supervise.hangs.watch import HangWatch, p99

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def dump(*blocks: list[tuple[str, int, str]], current: int = -1) -> str:
    """faulthandler's text for threads given innermost frame first (the last block is the main thread)."""
    out = []
    for index, frames in enumerate(blocks):
        head = "Current thread" if index == (current % len(blocks)) else "Thread"
        out.append(f"{head} 0x{index + 1:012x} (most recent call first):")
        out += [f'  File "{path}", line {line} in {function}' for path, line, function in frames]
        out.append("")
    return "\n".join(out)


BOOTSTRAP = [(f"{STDLIB}/threading.py", 331, "wait"), (f"{STDLIB}/threading.py", 1002, "_bootstrap")]


def running(stacks: str) -> dict:
    return {"procs": [[100, "S", "python train.py"]], "stacks": stacks}


# -- thresholds -------------------------------------------------------------------------------------

def test_a_fixed_timeout_watches_each_task_on_its_own_and_rearms_after_a_restart():
    watch = HangWatch(10)
    assert watch.overdue(1000, ["worker:0"]) is None, "not armed: never hung (the startup timeout covers that)"
    watch.update("worker:0", 5, now=0)
    watch.update("worker:1", 5, now=0)
    watch.update("worker:0", 9, now=4)
    assert watch.overdue(9.5, ["worker:0", "worker:1"]) is None
    late = watch.overdue(10.5, ["worker:0", "worker:1"])
    assert late.tasks == ("worker:1",) and late.threshold_s == 10, "worker:1 alone, though worker:0 stepped"
    assert watch.overdue(15, ["worker:0", "worker:1"]).tasks == ("worker:1", "worker:0"), "longest idle first"
    watch.rearm(20, restarted=["worker:1"])
    assert watch.overdue(29, ["worker:0", "worker:1"]) is None and watch.overdue(31, ["worker:0"]) is not None
    assert HangWatch(0).overdue(10**9, ["worker:0"]) is None, "0 = off"


def test_a_task_in_a_phase_its_program_declared_gets_half_an_hour_and_its_phase_lines_are_progress(tmp_path):
    import json

    from ddlctl.host.stepfollow import PhaseFile
    from ddlctl.supervise.hangs.watch import OPEN_PHASE_S

    # an earlier attempt died inside a checkpoint (begun, never ended): not this attempt's phase
    path = tmp_path / "phases.jsonl"
    path.write_text(json.dumps({"phase": "checkpoint", "start_us": 1, "open": True}) + "\n")
    follow = PhaseFile(str(path))
    assert (follow.poll(), follow.open) == (1, None)
    with path.open("a") as out:  # this attempt: a beat, then a checkpoint begins (half a line so far)
        out.write(json.dumps({"beat": "eval", "t": 5.0}) + "\n" + json.dumps({"phase": "checkpoint", "start_us": 9,
                                                                               "open": True}) + "\n{\"pha")
    assert (follow.poll(), follow.open) == (3, "checkpoint")
    with path.open("a") as out:
        out.write('se": "checkpoint", "start_us": 9, "duration_s": 70.5}\n')
    assert (follow.poll(), follow.open) == (4, None)
    # the watch: a fixed 10 s, but 30 min while the program says it checkpoints
    watch = HangWatch(10)
    watch.update("worker:0", 5, now=0)
    watch.in_phase("worker:0", "checkpoint")
    assert watch.overdue(600, ["worker:0"]) is None
    assert watch.threshold("worker:0") == (OPEN_PHASE_S, "in its checkpoint phase: 30 min allowed")
    assert watch.overdue(OPEN_PHASE_S + 1, ["worker:0"]).tasks == ("worker:0",), "a hang inside it is still found"
    watch.in_phase("worker:0", None)
    assert watch.overdue(11, ["worker:0"]) is not None


def test_the_adaptive_threshold_is_ten_times_the_p99_interval_with_a_sixty_second_floor():
    watch = HangWatch(None, startup_s=180)
    watch.arm(0)
    assert watch.threshold("worker:0") == (180, "before the first step: the startup timeout (--startup-timeout)")
    for step in range(1, 4):
        watch.update("worker:0", step, now=step * 2.0)
    assert watch.threshold("worker:0") == (60, "the 60s floor (not warm yet: 2 of 5 step intervals)"), \
        "the first step is no interval"
    slow = HangWatch(None)
    slow.update("worker:0", 1, now=0)
    slow.update("worker:0", 2, now=8.0)
    assert slow.threshold("worker:0") == (80, "10 x its longest step interval yet, 8.0s (not warm)")
    for step in range(4, 40):
        watch.update("worker:0", step, now=step * 2.0)
    assert watch.threshold("worker:0") == (60, "the 60s floor (10 x its p99 step interval of 2.0s is less)")
    watch.update("worker:0", 40, now=40 * 2.0 + 9.0)  # one slow interval (a checkpoint): 11 s
    assert watch.threshold("worker:0")[0] == 110, "p99 of 38 intervals is the slowest: 10 x 11 s"
    assert watch.overdue(89 + 109, ["worker:0"]) is None and watch.overdue(89 + 111, ["worker:0"]) is not None


def test_a_task_past_its_declared_last_step_is_not_watched():
    watch = HangWatch(5)
    watch.update("chief:0", 100, now=0)
    watch.finish("chief:0")
    assert watch.overdue(100, ["chief:0"]) is None
    watch.rearm(100, restarted=["chief:0"])
    assert watch.overdue(170, ["chief:0"]) is None, "back before its first step: the startup timeout"
    watch.update("chief:0", 101, now=171)
    assert watch.overdue(177, ["chief:0"]) is not None, "a restarted task is watched again"


def test_a_finished_task_that_has_not_exited_lingers_after_each_threshold():
    watch = HangWatch(5)
    watch.update("chief:0", 100, now=0)
    watch.update("worker:0", 100, now=0)
    watch.finish("chief:0")
    assert watch.lingering(4, ["chief:0", "worker:0"]) == []
    assert watch.lingering(6, ["chief:0", "worker:0"]) == ["chief:0"], "a task not finished is the hang watch's"
    watch.looked("chief:0", 6)
    assert watch.lingering(10, ["chief:0"]) == [] and watch.lingering(12, ["chief:0"]) == ["chief:0"]
    assert HangWatch(0).lingering(100, ["chief:0"]) == [], "--hang-timeout 0: nothing is watched"


def test_a_job_that_never_made_progress_is_hung_after_the_startup_threshold():
    watch = HangWatch(None, startup_s=30)
    watch.arm(0)
    assert watch.overdue(29, ["worker:0"]) is None
    late = watch.overdue(31, ["worker:0"])
    assert late.tasks == () and late.rule == "before the first step: the startup timeout (--startup-timeout)"
    assert p99([3.0, 1.0, 2.0]) == 3.0 and p99([1.0] * 99 + [50.0]) == 1.0


# -- where a task stood -----------------------------------------------------------------------------

def test_a_main_thread_blocked_on_a_lock_in_a_keras_callback_is_in_user_code():
    text = dump(BOOTSTRAP, [("/home/me/train.py", 42, "on_train_batch_end"),
                            (f"{SITE}/keras/src/callbacks/callback_list.py", 106, "on_train_batch_end"),
                            ("/home/me/train.py", 77, "<module>")])
    standing = stand("worker:1", running(text))
    assert (standing.state, standing.where) == ("user", "me/train.py:42 in on_train_batch_end")


def test_a_main_thread_in_a_collective_is_waiting_and_says_who_called_it():
    text = dump([(f"{STDLIB}/threading.py", 331, "wait"), (f"{SITE}/tensorflow/python/eager/execute.py", 53,
                                                            "quick_execute"), ("/home/me/train.py", 77, "<module>")],
                BOOTSTRAP, current=1)
    standing = stand("worker:0", running(text))
    assert standing.state == "waiting"
    assert standing.where == ("waiting in TensorFlow (eager/execute.py:53 in quick_execute, "
                              "called from me/train.py:77 in <module>)")


def test_the_last_of_several_appended_dumps_is_read_and_a_stopped_process_comes_first():
    old = dump([("/home/me/train.py", 5, "old_place")])
    new = dump([("/home/me/train.py", 9, "new_place")])
    assert threads(old + new)[0][0].function == "new_place"
    stopped = {"procs": [[100, "T", "python train.py"]], "stacks": ""}
    assert stand("w", stopped).state == "stopped"
    assert stand("w", None).state == "unknown" and stand("w", {"procs": []}).state == "gone"


def test_a_main_thread_with_no_python_frame_is_exiting_whatever_its_other_threads_do():
    ended = "Current thread 0x00007ff0a5e3bb80 (most recent call first):\n  <no Python frame>\n"
    assert stand("w", running(ended)).state == "exiting"
    in_gc = dump(BOOTSTRAP) + ("Current thread 0x2 (most recent call first):\n  Garbage-collecting\n"
                               "  <no Python frame>\n")
    assert stand("w", running(in_gc)).state == "exiting", "a daemon thread still waiting does not matter"
    assert stand("w", running(ended + dump([("/home/me/train.py", 9, "<module>")]))).state == "user", \
        "the last dump counts"
    a_thread_idle = "Thread 0x9 (most recent call first):\n  <no Python frame>\n\n" + dump([("/home/me/train.py", 9,
                                                                                           "<module>")])
    assert stand("w", running(a_thread_idle)).state == "user", "only the main thread (listed last) counts"


def test_a_process_in_uninterruptible_sleep_is_blocked_and_says_its_wait_channel():
    reply = {"procs": [[100, "D", "python train.py"]], "stacks": "", "wchan": {"100": "nfs_wait_on_request"}}
    held = stand("w", reply)
    assert held.state == "blocked" and "state D at nfs_wait_on_request" in held.where
    assert "(state D)" in stand("w", {"procs": [[100, "D", "python"]], "stacks": ""}).where, "no channel known"
    both = {"worker:0": Standing("worker:0", "user", "train.py:3 in spin"), "worker:1": stand("worker:1", reply)}
    assert hang_culprit(both, {"worker:0": 1.0, "worker:1": 2.0}, "worker:0")[0] == "worker:1"


# a real dump (Python 3.11): the program ended, a thread not started as a daemon sleeps on
JOINING = """Thread 0x00007ff171b976c0 (most recent call first):
  File "/tmp/exp/joining.py", line 6 in prefetch
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982 in run
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007ff1729d8b80 (most recent call first):
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1590 in _shutdown
"""


def test_a_program_that_ended_but_waits_for_a_thread_is_joining_and_names_the_thread():
    held = stand("worker:1", running(JOINING))
    assert held.state == "joining" and held.where.endswith("a thread at exp/joining.py:6 in prefetch"), held
    waiting = stand("worker:0", running(dump([(f"{SITE}/tensorflow/python/eager/execute.py", 53, "quick_execute")])))
    culprit, why, _ = hang_culprit({"worker:0": waiting, "worker:1": held}, {"worker:0": 1.0, "worker:1": 2.0},
                                   "worker:0")
    assert culprit == "worker:1" and why.startswith("its program has ended but waits for a thread"), why


def test_ddlctls_builtin_workload_is_user_code_and_its_instrumentation_is_not():
    workload = dump([("/work/main/ddlctl/workloads/train.py", 300, "coordinate")])
    hook = dump([("/work/main/ddlctl/task/instrument/keras_hooks.py", 20, "on_batch_end"),
                 ("/home/me/fit.py", 3, "<module>")])
    assert stand("chief:0", running(workload)).state == "user"
    assert stand("worker:0", running(hook)).where.startswith("waiting in ddlctl's instrumentation")


# -- whom to blame ----------------------------------------------------------------------------------

def standing(task: str, state: str, where: str = "somewhere") -> Standing:
    return Standing(task, state, where)


def test_blame_goes_to_the_stopped_then_to_user_code_then_to_the_first_to_stop():
    progress = {"worker:0": 10.0, "worker:1": 10.0, "worker:2": 5.0}
    both = {"worker:0": standing("worker:0", "waiting", "waiting in TensorFlow"),
            "worker:1": standing("worker:1", "user", "train.py:42 in cb"),
            "worker:2": standing("worker:2", "waiting", "waiting in TensorFlow")}
    culprit, why, others = hang_culprit(both, progress, "worker:0")
    assert (culprit, why) == ("worker:1", "its main thread is in its own code at train.py:42 in cb")
    assert others == "the others: worker:0 waiting in TensorFlow; worker:2 waiting in TensorFlow"
    both["worker:0"] = standing("worker:0", "stopped")
    assert hang_culprit(both, progress, "worker:0")[0] == "worker:0"
    waiting = {n: standing(n, "waiting") for n in both}
    assert hang_culprit(waiting, progress, "worker:0")[:2] == ("worker:2", "it stopped making progress first")
    alone = {"worker:0": waiting["worker:0"]}
    assert hang_culprit(alone, progress, "worker:0")[:2] == ("worker:0", "it stopped making progress")
    assert hang_culprit({"ps:0": standing("ps:0", "waiting"), "chief:0": standing("chief:0", "waiting")},
                        {}, "chief:0")[0] == "chief:0", "nobody says more: the coordination leader"
    # the leader's coordination service says whom it still waits for: that one, not the leader
    told = {"worker:1": "worker:0's coordination service still waits for it to join the cluster"}
    never = {n: standing(n, "waiting") for n in ("worker:0", "worker:1")}
    assert hang_culprit(never, {}, "worker:0", waited_for=told)[:2] == ("worker:1", told["worker:1"])
    never["worker:0"] = standing("worker:0", "stopped")
    assert hang_culprit(never, {}, "worker:0", waited_for=told)[0] == "worker:0", "a stopped process still comes first"
    # a tf.data service task at fault: the trainers waiting in TensorFlow wait for their input
    fed = {"worker:0": standing("worker:0", "waiting", "waiting in TensorFlow (execute.py:53 in quick_execute)"),
           "data:0": standing("data:0", "stopped"), "dispatcher:0": standing("dispatcher:0", "waiting", "waiting in "
                                                                          "TensorFlow (server_lib.py:236 in join)")}
    culprit, why, others = hang_culprit(fed, {"worker:0": 3.0}, "worker:0")
    assert (culprit, why) == ("data:0", "its process is stopped (state T)")
    assert others == ("the others: worker:0 waiting for input from the tf.data service, in TensorFlow (execute.py:53 "
                      "in quick_execute); dispatcher:0 waiting in TensorFlow (server_lib.py:236 in join)")


# -- GPUs over a stall (ddlctl.supervise.hangs.activity) --------------------------------------------------

def _gpu_hello(given: str | None = None) -> dict:
    from ddlctl.contract.telemetry import GPU_FIELDS

    return {"type": "hello", "gpu_fields": list(GPU_FIELDS), "cuda_visible": given,
            "gpus": [{"index": i, "uuid": f"GPU-{i}{i}"} for i in range(4)]}


def _gpu_sample(utils: dict[int, float | None]) -> dict:
    from ddlctl.contract.telemetry import GPU_FIELDS

    return {"type": "sample", "gpus": [[i, u, *[None] * (len(GPU_FIELDS) - 2)] for i, u in utils.items()]}


def test_a_tasks_planned_gpus_are_read_through_the_hosts_own_visible_devices():
    from ddlctl.supervise.hangs.activity import ActivityWatch

    watch = ActivityWatch()
    assert watch.indices("a", (0,)) is None, "no readings from that host yet"
    watch.add("a", _gpu_hello(), 0.0)
    watch.add("a", _gpu_sample({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}), 1.0)
    assert watch.indices("a", (1,)) == (1,) and watch.indices("a", None) == (0, 1, 2, 3)
    # a Slurm step holding GPUs 2 and 3 of its node: plan index i is the i-th of them
    watch.add("a", _gpu_hello("2,3"), 2.0)
    assert watch.indices("a", (1,)) == (3,) and watch.indices("a", (0, 1)) == (2, 3)
    watch.add("a", _gpu_hello("GPU-33,GPU-11"), 3.0)  # given by UUID: NVML's index for it
    assert watch.indices("a", (0,)) == (3,)
    watch.add("a", _gpu_hello("MIG-abc"), 4.0)
    assert watch.indices("a", (0,)) is None, "a MIG instance: not a GPU NVML numbers"
    assert watch.indices("a", ()) == () and watch.gpu("a", (), 0.0, 9.0) is None, "a task with no GPU"


def test_a_stall_reads_busy_idle_mixed_or_unknown_from_the_readings_inside_it():
    from ddlctl.supervise.hangs.activity import ActivityWatch, idle_among_busy

    watch = ActivityWatch(window_s=100.0)
    watch.add("a", _gpu_hello(), 0.0)
    for t in range(1, 21):  # GPU 0 busy from t=10, GPU 1 idle from t=10, GPU 2 alternating, GPU 3 unsupported
        watch.add("a", _gpu_sample({0: 100.0 if t >= 10 else 30.0, 1: 0.0 if t >= 10 else 50.0,
                                    2: 100.0 if t % 2 else 0.0, 3: None}), float(t))
    busy, idle = watch.gpu("a", (0,), 9.5, 20.0), watch.gpu("a", (1,), 9.5, 20.0)
    assert (busy.state, busy.readings, busy.util_mean, busy.seconds) == ("busy", 11, 100.0, 10.5)
    assert idle.state == "idle" and "sat idle (0% busy over the 10s since its last progress)" in idle.describe()
    assert watch.gpu("a", (0,), 4.5, 20.0).state == "mixed", "16 readings, 11 busy: under 80%"
    assert watch.gpu("a", (0,), 0.5, 20.0).state == "mixed", "half of it before the stall began"
    assert watch.gpu("a", (0, 1), 9.5, 20.0).state == "mixed", "busy and idle GPUs of one task"
    assert watch.gpu("a", (2,), 9.5, 20.0).state == "mixed"
    assert watch.gpu("a", (0,), 18.5, 20.0).state == "unknown", "two readings say nothing"
    assert watch.gpu("a", (3,), 9.5, 20.0).readings == 0, "a GPU without utilisation readings"
    assert idle_among_busy({"w0": busy, "w1": idle, "w2": None}) == ["w1"]
    assert idle_among_busy({"w0": idle, "w1": idle}) == [], "idle alike: the GPUs tell nothing"
    watch.add("a", _gpu_sample({0: 1.0}), 200.0)
    assert len(watch.hosts["a"].readings) == 1, "readings older than the window are dropped"


def test_a_busy_process_among_idle_ones_needs_readings_of_every_task_and_a_clear_gap():
    from ddlctl.supervise.hangs.activity import ActivityWatch, CpuActivity, busy_among_idle

    def cpu(mean: float, readings: int = 10) -> CpuActivity:
        return CpuActivity("t", 10.0, readings, mean)

    assert busy_among_idle({"w0": cpu(3.0), "w1": cpu(95.0), "ps": cpu(1.0)}) == ["w1"]
    assert busy_among_idle({"w0": cpu(3.0), "w1": cpu(30.0)}) == ["w1"], "a loaded machine: a share of a core"
    assert busy_among_idle({"w0": cpu(10.0), "w1": cpu(30.0)}) == [], "not 4x the others: both work"
    assert busy_among_idle({"w0": cpu(1.0), "w1": cpu(20.0)}) == [], "under a quarter of a core"
    assert busy_among_idle({"w0": None, "w1": cpu(95.0)}) == [], "a task without readings: unknown"
    assert busy_among_idle({"w0": cpu(1.0, 2), "w1": cpu(95.0)}) == [], "too few readings"
    assert busy_among_idle({"w1": cpu(95.0)}) == [], "alone: nobody waits for it"
    watch = ActivityWatch(window_s=100.0)
    for t in range(1, 11):
        watch.add("a", {"type": "sample", "procs": {"w0": [2.0, 1], "w1": [90.0 if t > 5 else 10.0, 1]}}, float(t))
    assert watch.cpu("w1", 5.5, 10.0).cpu_mean == 90.0 and watch.cpu("w1", 5.5, 10.0).readings == 5
    assert watch.cpu("w9", 0.0, 10.0) is None


def test_the_gpus_nvml_saw_a_tasks_processes_use_come_before_its_plans():
    from ddlctl.host.telemetry import gpu_tasks
    from ddlctl.supervise.hangs.activity import ActivityWatch

    # NVML's compute processes per GPU, the run's processes per task (a task's child process too)
    assert gpu_tasks({0: [11, 99], 1: [12], 2: [13], 3: []}, {11: "worker:0", 12: "worker:1", 13: "worker:1"}) == \
        {"worker:0": [0], "worker:1": [1, 2]}
    assert gpu_tasks({0: [4242]}, {11: "worker:0"}) == {}, "pids NVML reports that are not the run's"
    watch = ActivityWatch()
    watch.add("a", _gpu_hello(), 0.0)
    for t in range(1, 11):
        sample = _gpu_sample({0: 100.0, 1: 0.0, 2: 0.0, 3: 100.0})
        if t == 1:
            sample["gpu_tasks"] = {"worker:1": [3]}  # said once, when it changes
        watch.add("a", sample, float(t))
    # worker:1's plan says GPU 1 (idle), NVML saw it on GPU 3 (busy): NVML's word holds
    assert watch.gpu("a", (1,), 0.5, 10.0, "worker:1").gpus == (3,)
    assert watch.gpu("a", (1,), 0.5, 10.0, "worker:0").gpus == (1,), "not seen by NVML: the plan's"
    assert watch.gpu("a", (1,), 0.5, 10.0).state == "idle"


# -- at work before beginning (ddlctl.supervise.hangs.preparing) -------------------------------------------

def looked(stacks: str, cpu_s: float, io_bytes: int = 0, at: float = 0.0, state: str = "S") -> dict:
    return {"procs": [[100, state, "python train.py"]], "stacks": stacks, "cpu_s": cpu_s, "io_bytes": io_bytes,
            "at": at}


OWN = dump([("/home/me/prepare.py", 12, "tokenize"), ("/home/me/train.py", 30, "<module>")])
IN_PANDAS = dump([(f"{SITE}/pandas/io/parsers/readers.py", 620, "read_csv"), ("/home/me/train.py", 8, "<module>")])
IN_TF = dump([(f"{SITE}/tensorflow/python/eager/execute.py", 53, "quick_execute"), ("/home/me/train.py", 40, "step")])
IN_TF_ELSEWHERE = dump([(f"{SITE}/tensorflow/python/data/ops/iterator_ops.py", 800, "__next__"),
                        ("/home/me/train.py", 22, "<module>")])
IMPORTING = dump([(f"{SITE}/tensorflow/python/ops/array_ops.py", 17, "<module>"),
                  ("<frozen importlib._bootstrap>", 1176, "_find_and_load"), ("/home/me/train.py", 1, "<module>")])


def test_busy_in_its_own_code_or_another_library_or_importing_is_at_work_and_says_where_and_how_busy():
    work = at_work("worker:1", looked(OWN, 10.0), looked(OWN, 14.5, at=5.0))
    assert work is not None and work.describe() == "in its own code at me/prepare.py:12 in tokenize, 90% of a CPU"
    work = at_work("worker:1", looked(IN_PANDAS, 0.0), looked(IN_PANDAS, 2.0, at=4.0))
    assert work is not None and work.where.startswith("in pandas (parsers/readers.py:620 in read_csv, called from "
                                                      "me/train.py")
    work = at_work("worker:1", looked(IMPORTING, 0.0), looked(IMPORTING, 4.0, at=5.0))
    assert work is not None and work.where.startswith("importing, in TensorFlow (ops/array_ops.py:17")


def test_reading_or_writing_without_cpu_is_at_work_too_a_download_say():
    work = at_work("chief:0", looked(OWN, 1.0, io_bytes=0), looked(OWN, 1.2, io_bytes=10 * 2**20, at=5.0))
    assert work is not None and work.describe().endswith("4% of a CPU and 2.0 MiB/s read and written")
    assert at_work("chief:0", looked(OWN, 1.0, io_bytes=0), looked(OWN, 1.2, io_bytes=2**16, at=5.0)) is None


def test_busy_at_one_place_in_tensorflow_waits_rather_than_works_unless_its_stack_moved():
    # a collective spinning (NCCL on a GPU host), an input pipeline spinning in native code
    assert at_work("worker:0", looked(IN_TF, 0.0), looked(IN_TF, 5.0, at=5.0)) is None
    work = at_work("worker:0", looked(IN_TF, 0.0), looked(IN_TF_ELSEWHERE, 5.0, at=5.0))
    assert work is not None and work.where.startswith("in TensorFlow (ops/iterator_ops.py:800 in __next__")


def test_idle_stopped_blocked_or_unreadable_tasks_are_not_at_work():
    assert at_work("w", looked(OWN, 10.0), looked(OWN, 10.5, at=5.0)) is None  # 10% of a CPU: a sleep, a lock
    assert at_work("w", looked(OWN, 0.0), looked(OWN, 5.0, at=5.0, state="T")) is None
    assert at_work("w", looked(OWN, 0.0), looked(OWN, 5.0, at=5.0, state="D")) is None
    assert at_work("w", running(OWN), looked(OWN, 5.0, at=5.0)) is None  # no counters (an older agent)
    assert at_work("w", looked(OWN, 0.0, at=5.0), looked(OWN, 5.0, at=5.0)) is None  # no time between
    assert at_work("w", None, looked(OWN, 5.0, at=5.0)) is None


def test_a_task_its_zygote_has_not_forked_is_at_work_by_the_zygotes_import_and_one_forked_meanwhile_too():
    forking = {"procs": [], "stacks": "", "forking": True}
    busy = at_work("w", {**forking, "cpu_s": 1.0, "io_bytes": 0, "at": 0.0},
                   {**forking, "cpu_s": 4.0, "io_bytes": 0, "at": 5.0})
    assert busy is not None and busy.describe() == "not started yet: its host's zygote imports TensorFlow for it, " \
                                                   "60% of a CPU"
    assert at_work("w", {**forking, "cpu_s": 1.0, "io_bytes": 0, "at": 0.0},
                   {**forking, "cpu_s": 1.1, "io_bytes": 0, "at": 5.0}) is None  # a zygote stuck, idle
    started = at_work("w", {**forking, "cpu_s": 9.0, "io_bytes": 0, "at": 0.0}, looked(OWN, 0.2, at=5.0))
    assert started is not None and started.record() == {
        "task": "w", "where": "started meanwhile (its host's zygote had imported TensorFlow for it)", "cpu": None,
        "io_bytes_s": None}
    assert at_work("w", {**forking, "cpu_s": 9.0, "io_bytes": 0, "at": 0.0},
                   looked(OWN, 0.2, at=5.0, state="T")) is None


def test_a_stacks_file_appears_only_once_its_process_takes_the_stack_request(tmp_path, monkeypatch):
    # the agent sends SIGUSR2 to a process whose stacks-<pid>.txt exists, and the signal's default
    # action ends a process: CI saw a task preempted between creating the file and registering the
    # handler die of the request, then counted as "ended on its own (exit code 0, after 0 steps)"
    import faulthandler
    import os

    from ddlctl.task import stack_dumper

    path = tmp_path / f"stacks-{os.getpid()}.txt"
    seen = []
    monkeypatch.setattr(faulthandler, "register", lambda *a, **k: seen.append(path.exists()))
    monkeypatch.setattr(stack_dumper, "_fd", None)
    monkeypatch.setenv("DDLCTL_TASK_DIR", str(tmp_path))
    try:
        assert stack_dumper.install()
        assert seen == [False] and path.exists() and not list(tmp_path.glob("*.new"))
    finally:
        os.close(stack_dumper._fd)
