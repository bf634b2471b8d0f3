"""The restart policy: what a fault means for each strategy, as pure functions over plain values.

``classify`` turns how a task ended (and what its log says) into a :class:`Fault` that names the
task *at fault* (under MWMS a peer's collective error is a consequence: TensorFlow's words name the
culprit). ``decide`` turns a fault into a :class:`Decision`. The supervisor only applies them.

What happens when a task is lost (``--restart-on fault`` retries signals, preemption exits 42/143,
hangs, lost hosts and a ps chief's error on results a restarted worker lost; ``any`` also Python
exceptions and other non-zero exits):

=============  ==================================  ==========================================
strategy/role  restarts remain                     none remain (or not retried)
=============  ==================================  ==========================================
ps worker      restart that worker in place        go on degraded while the chief and another
               (same TF_CONFIG and port: rejoins)  worker live (its closures move), else fail
ps chief       restart the chief alone (restores   fail
               its checkpoint, reuses ps/workers)
ps ps task     restart every task (variables are   fail
               gone; resume from checkpoint)
mwms worker    restart the whole group (never one  fail
               worker into a running group)
model any      restart every task (each stage      fail
               holds part of the model)
evaluator      restart it alone                    go on without it
single host    restart the task                    fail
=============  ==================================  ==========================================

The decisions around that table are pure functions here too: a fault during a restart joins it
(``decide_during_restart``, scopes merged by ``wider_scope``); a port taken before a server could
bind restarts the cluster spec's tasks with new ports, a few times, uncounted (``port_retry``); a
host that stays away (``host_gone``) and a checkpoint that cannot be shared before a group
restart (``checkpoint_unshared``) fail the job.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from ddlctl.contract.faults import SCOPES, Action, Cause, Scope
from ddlctl.contract.strategies import Recovery
from ddlctl.contract.strategies import strategy as facts
from ddlctl.diagnose.imports import NO_MODULE, module_to_run_missing
from ddlctl.diagnose.rootcause import TRACEBACK_HEAD, device_oom, disk_full, last_traceback, syntax_error
from ddlctl.diagnose.tfmessages import blame_peer, collective_mismatch, final_error, stale_handle
from ddlctl.transport.status import ExitStatus, signal_name

#: Causes retried under ``--restart-on fault``.
FAULT_CAUSES = frozenset({Cause.SIGNAL, Cause.OOM, Cause.PREEMPTED, Cause.HANG, Cause.HOST_LOST, Cause.PEER_RESTART})
#: Why a task that ended so is not retried under ``--restart-on fault`` (the others: "not a fault ...").
NOT_RETRIED = {
    Cause.TRACEBACK: "a bug in the program: not retried under --restart-on fault (--restart-on any retries it)",
    Cause.DISK_FULL: "not retried: a restart would fill the same disk again; free space on it (`df -h` on that host), "
                 "or write elsewhere (a run's task folders and checkpoints: --runs-dir on this machine, ~/.ddlctl on "
                 "SSH and Slurm hosts)",
    Cause.DEVICE_OOM: "not retried: the same step would run out of memory again; a smaller batch per device (the "
                  "built-in workload's --batch-size), fewer tasks per device, or mixed precision",
    Cause.ENDED_EARLY: "not retried: the same program would end early again (--restart-on any retries it)",
    Cause.NOT_STARTED: "not retried: it would not start again (--restart-on any retries it)",
    Cause.NO_MODULE: "not retried: the same Python would not find it again (--restart-on any retries it)",
    Cause.COLLECTIVE_MISMATCH: "a bug in the program: every worker must run the same collective ops in the same order, "
                           "on tensors of the same shapes and types (the same steps, evaluations and model on each); "
                           "not retried under --restart-on fault (--restart-on any retries it)",
}
#: What a worker of a synchronous multi-worker job that ended before joining most likely got wrong.
JOIN_ALL = ("every worker must create the strategy and take every step (each step's all-reduce waits for all of "
            "them): run the same training on every worker, not on the first alone")
#: What workers of a synchronous multi-worker job got wrong when one ended after as many steps as
#: the one it left: more collectives on one (TensorFlow pairs a worker's n-th collective with its
#: peers' n-th of the same shape, whatever op each was).
SAME_COLLECTIVES = ("every worker must run the same collective ops in the same order (an evaluation, a metric or a "
                    "checkpoint run on some workers only pairs with other ops of their peers')")
#: What a worker of a synchronous multi-worker job that ended before its peers most likely got wrong.
SAME_STEPS = ("every worker must take the same number of steps (each step's all-reduce waits for all of them): "
              "give each as many batches (e.g. repeat the dataset and stop after a fixed number of steps)")
#: Times a port taken between planning and binding is retried with new ports (not a restart).
MAX_PORT_RETRIES = 3
#: Exit codes that mean "preempted, restart me" (PreemptionCheckpointHandler: 42; 143 on GCE).
PREEMPTED_CODES = frozenset({42, 143})


@dataclass(frozen=True)
class Fault:
    """A task at fault: ``cause`` is signal, oom, preempted, hang, host-lost, peer-restart,
    disk-full, device-oom, collective-mismatch, traceback, exit or ended-early (it ended on its
    own, exit code 0, while its peers still needed it)."""

    task: str
    cause: Cause
    reporter: str  # the task whose end (or words) revealed it; == task unless blamed by a peer
    status: ExitStatus | None  # how the task at fault ended (None: still running, e.g. hung)
    detail: str  # one line for people

    @property
    def exit_code(self) -> int:
        """The exit code ddlctl reports when this fault ends the job."""
        if self.status is not None:
            return self.status.shell_code
        return 124 if self.cause == Cause.HANG else 1


@dataclass(frozen=True)
class Decision:
    """``restart`` the named tasks (``scope``: task, group or all), ``continue`` or ``fail``.
    A ``fail`` message completes "<task> on <host> failed: "; the others are whole sentences."""

    action: Action
    tasks: tuple[str, ...] = ()
    scope: Scope = Scope.NONE
    message: str = ""
    degraded: bool = False


def leader_of(strategy: str) -> str:
    """The task that leads TensorFlow's coordination service."""
    return facts(strategy).leader


def own_cause(status: ExitStatus, log_text: str) -> tuple[Cause, str]:
    """(cause, detail) from a task's own exit status and log."""
    if status.lost:
        return Cause.HOST_LOST, "was lost with the connection to its host"
    if status.signal is not None:
        return (Cause.OOM if status.oom else Cause.SIGNAL), status.describe()
    code = status.code or 0
    if code in PREEMPTED_CODES:
        return Cause.PREEMPTED, f"exit code {code} (preemption: checkpoint written, restart to resume)"
    if code > 128 and code - 128 in (6, 9, 15):  # a shell's report of a signal death
        return Cause.SIGNAL, f"exit code {code} (killed by {signal_name(code - 128)})"
    if status.not_started:  # its host agent's words
        return Cause.NOT_STARTED, f"not started: {status.not_started}"
    error = final_error(log_text)
    stale = stale_handle(error) if code != 0 else None
    if stale:  # a consequence of a peer's restart, not a bug: retried as a fault
        return Cause.PEER_RESTART, f"exit code {code}: TensorFlow lost results of a restarted peer (\"{stale[:200]}\")"
    full = disk_full(error) if code != 0 else None
    if full is not None:  # not the program's bug, and a restart would fill the same disk again
        words, path = full
        return Cause.DISK_FULL, f"exit code {code}: its disk is full ({words}{f', writing {path}' if path else ''})"
    device = device_oom(error) if code != 0 else None
    if device is not None:  # the same step runs out of memory again: a matter of sizes, not a fault
        return Cause.DEVICE_OOM, f"exit code {code}: {device}"
    mismatch = collective_mismatch(error) if code != 0 else None
    if mismatch is not None:  # whichever peer the error's transport names: the program is at fault
        return Cause.COLLECTIVE_MISMATCH, f"exit code {code}: its collective op did not match its peers' " \
                                      f"(\"{mismatch[:300]}\")"
    if code != 0 and TRACEBACK_HEAD in error:
        if NO_STDIN.fullmatch((last_traceback(error) or [""])[-1].strip()):
            return Cause.TRACEBACK, f"exit code {code} after a Python exception: {NO_STDIN_HINT}"
        if NO_MODULE.fullmatch((last_traceback(error) or [""])[-1].strip()):  # (its Python: said by the supervisor)
            return Cause.NO_MODULE, f"exit code {code} after a Python exception"
        return Cause.TRACEBACK, f"exit code {code} after a Python exception"
    to_run = module_to_run_missing(error) if code == 1 else None
    if to_run is not None:  # (where Python looked: said by the supervisor)
        return Cause.NO_MODULE, f"exit code {code}: its Python found no module {to_run} to run (-m)"
    syntax = syntax_error(error) if code != 0 else None
    if syntax is not None:  # the script itself could not be compiled: a bug in the program too
        return Cause.TRACEBACK, f"exit code {code}: a syntax error in {syntax['file']} at line {syntax['line']}"
    if code == 0:
        return Cause.EXIT, "exited with code 0 although ddlctl did not stop it"
    return Cause.EXIT, f"exit code {code}"


#: ``input()`` (or ``sys.stdin.readline``) at the end of the standard input every task is given.
NO_STDIN = re.compile(r"EOFError: EOF when reading a line")
NO_STDIN_HINT = ("it read its standard input, and tasks have none (ddlctl gives them /dev/null, on every host): "
                 "give it what it asks as arguments after --, environment variables (--env) or a file")


#: A frame of Keras 3's own code (tf-keras's is ``tf_keras/src/``).
KERAS3_FRAME = re.compile(r'File "(?:[^"]*/)?keras/src/')
#: A frame that calls ``fit``: the program's line, or ddlctl's model.fit hook (``--auto-steps``).
FIT_CALL = re.compile(r"\.fit\(|, in fit(?:_with_step_timer)?$")
KERAS3_FIT_HINT = ("Keras 3's model.fit does not work under {strategy} (TensorFlow 2.21; keras-team/keras#18624, "
                   "#20585): use tf.keras, which ddlctl makes tf-keras (TF_USE_LEGACY_KERAS=1, unless "
                   "--no-legacy-keras; pip install tf-keras), or `import tf_keras as keras`, or a custom training loop")


def keras3_fit(log_text: str) -> bool:
    """Whether the task's last traceback runs through Keras 3's ``model.fit`` (not tf-keras's)."""
    lines = [line.strip() for line in last_traceback(final_error(log_text))]
    return any(KERAS3_FRAME.match(line) for line in lines) and \
        any(FIT_CALL.search(line) for line in lines)


#: Signals a process never sends itself because of a peer: a task they killed was killed from
#: outside (a user, the OOM killer, a scheduler), whatever its log says about its peers.
OUTSIDE_SIGNALS = frozenset({1, 2, 9, 15})  # SIGHUP, SIGINT, SIGKILL, SIGTERM


def killed_from_outside(status: ExitStatus) -> bool:
    """Whether ``status`` is a death by a signal from outside (or a shell's report of one)."""
    number = status.signal if status.signal is not None else \
        (status.code - 128 if status.code is not None and status.code > 128 else None)
    return number in OUTSIDE_SIGNALS


def classify(name: str, status: ExitStatus, log_text: str, strategy: str, alive: Set[str],
             known: Set[str], aliases: Mapping[str, str] | None = None,
             finished: Mapping[str, int | None] | None = None, reached: int | None = None) -> Fault:
    """The fault behind ``name`` ending with ``status``. A peer that the log blames and that is a
    task of this job (``known``) is at fault instead: hung if it is still running (``alive``);
    ended early if it had ended on its own with exit code 0 (``finished``: such tasks -> the
    steps they took, None if unknown; ``reached``: the steps ``name`` took); never when ``name``
    was killed from outside (a ps chief killed after it had logged, and recovered from, a lost
    worker is its own fault). ``aliases``: TensorFlow's task names that are not ddlctl's (once
    workers left the job) -> ddlctl's."""
    cause, detail = own_cause(status, log_text)
    if cause == Cause.TRACEBACK and facts(strategy).keras3_fit_fails and keras3_fit(log_text):
        detail = f"{detail}: {KERAS3_FIT_HINT.format(strategy=strategy)}"
    if cause in (Cause.TRACEBACK, Cause.EXIT, Cause.SIGNAL) and not status.lost and not killed_from_outside(status):
        blame = blame_peer(log_text, leader_of(strategy))
        peer = (aliases or {}).get(blame.task, blame.task) if blame is not None else None
        if blame is not None and peer != name and peer in known:
            if peer not in alive and peer in (finished or {}):  # (TensorFlow may say "stopped sending heartbeats")
                at = f", at step {reached}," if reached is not None else ""
                return ended_early(peer, name, (finished or {})[peer],
                                   f"its peers went on ({name}{at} then failed: \"{blame.line[:240]}\")", strategy,
                                   reporter_steps=reached)
            if peer in alive or blame.hung:
                return Fault(task=peer, cause=Cause.HANG, reporter=name, status=None,
                             detail=f"hung ({name} reports \"{blame.line[:240]}\")")
            return Fault(task=peer, cause=Cause.SIGNAL, reporter=name, status=None,
                         detail=f"gone ({name} reports \"{blame.line[:240]}\")")
    return Fault(task=name, cause=cause, reporter=name, status=status, detail=detail)


def ended_early(task: str, reporter: str, steps: int | None, said: str, strategy: str, joined: bool = True,
                reporter_steps: int | None = None) -> Fault:
    """``task`` ended on its own (exit code 0, after ``steps``) while its peers still needed it;
    ``said``: how that shows ("its peers went on (worker:0 then failed: ...)"), ``reporter`` the
    task that showed it (at ``reporter_steps``); ``joined``: whether it had joined the cluster.
    Under MWMS: a worker given fewer batches than the others (uneven shards, a dataset that ends)
    when the reporter got as far; collectives that differ (an evaluation on one worker only) when
    the reporter was left behind in steps; a program that lets one worker alone train when it
    never joined."""
    after = f", after {steps} step{'s' if steps != 1 else ''}" if steps is not None else ""
    # (a peer left behind in steps ran more collectives per step; one as far along failed in the
    # step after, unrecorded: fewer batches)
    behind = steps is not None and reporter_steps is not None and reporter_steps < steps
    hint = JOIN_ALL if not joined else SAME_COLLECTIVES if behind else SAME_STEPS
    why = f": under {strategy} {hint}" if facts(strategy).program_lockstep else ""
    return Fault(task=task, cause=Cause.ENDED_EARLY, reporter=reporter, status=None,
                 detail=f"ended on its own (exit code 0{after}) while {said}{why}")


#: The signal a stack request sends (every Python task ddlctl starts has faulthandler take it).
STACK_SIGNAL = int(signal.SIGUSR2)


def died_of_stack_request(status: ExitStatus) -> bool:
    """Whether ``status`` is a death by a stack request's SIGUSR2 (or a shell's report of one): the
    process no longer had faulthandler's handler, which Python removes only at the very end of its
    shutdown, so it was past Python, in native teardown (C++ destructors, ``atexit`` of C code)."""
    return status.signal == STACK_SIGNAL or status.code == 128 + STACK_SIGNAL


def stuck_in_exit(task: str, log_text: str, idle_s: float, past_python: bool = False,
                  stuck: bool = True) -> tuple[ExitStatus, str]:
    """A task whose program has ended (no Python frame on its main thread; ``past_python``: Python
    had shut down and the stack request's SIGUSR2 ended it) but whose process had not exited
    ``idle_s`` after its last progress (``stuck``: past its hang threshold; else it was exiting as
    usual when a look at the others asked it for its stacks): it counts as the exit its program
    made, read from its log: 1 when the log ends in a Python exception (an uncaught one is the last
    thing a program prints), else 0. (exit status, the sentence that says so)"""
    failed = TRACEBACK_HEAD in final_error(log_text)
    status = ExitStatus(code=1 if failed else 0)
    why = ("its output ends in a Python exception: counted as exit code 1" if failed else
           "no Python exception in its output: counted as exit code 0")
    if past_python and not stuck:
        return status, (f"{task}'s program had ended and its process was exiting ({idle_s:.0f}s after its last "
                        f"progress, within its hang threshold) when ddlctl asked every task for its stacks; the "
                        f"request ended it, past Python's shutdown ({why})")
    if past_python:
        return status, (f"{task}'s program had ended and Python had shut down, but its process had not exited "
                        f"({idle_s:.0f}s after its last progress: stuck in native teardown, e.g. a C++ "
                        f"library's destructors); ddlctl's request for its stacks ended it ({why})")
    return status, (f"{task}'s program has ended but its process has not exited ({idle_s:.0f}s after its last "
                    f"progress; its interpreter is shutting down with no Python code left to run: a library's "
                    f"teardown, e.g. TensorFlow's once the coordination leader is gone): ending it ({why})")


#: Seconds after SIGKILL after which a task that has not ended is left: it is in uninterruptible
#: sleep (state D) and dies only when the kernel lets it go (the signal stays pending).
UNKILLABLE_S = 10.0


def unkillable(task: str, host: str, pid: object, where: str) -> str:
    """What ddlctl says of a task SIGKILL has not ended within :data:`UNKILLABLE_S` (``where``: its
    standing, e.g. "its process is blocked in the kernel (state D at nfs_wait_on_request) ...")."""
    return (f"{task} on {host} (pid {pid}) has not ended {UNKILLABLE_S:g}s after SIGKILL: {where}; ddlctl leaves "
            f"it: it ends once the kernel lets it go (the SIGKILL stays pending; see `ps -o pid,stat,wchan -p {pid}` "
            f"on {host})")


def decide(strategy: str, fault: Fault, roles: Mapping[str, str], alive: Set[str], used: int,
           max_restarts: int, restart_on: str = "fault", min_workers: int = 0) -> Decision:
    """What to do about ``fault``. ``roles``: every task of the job -> role; ``alive``: tasks
    still running; ``used``: restarts spent so far of ``max_restarts``; ``min_workers``: workers a
    ps job needs to go on degraded (0: one). A reporter that died of the fault (a ps chief whose
    worker vanished) is restarted with the task at fault."""
    decision = _decide(strategy, fault, roles, alive, used, max_restarts, restart_on, min_workers)
    reporter = fault.reporter
    if decision.action == Action.RESTART and reporter != fault.task and reporter in roles \
            and reporter not in alive and reporter not in decision.tasks:
        return dataclasses.replace(decision, tasks=(*decision.tasks, reporter),
                                   message=f"{decision.message}; {reporter}, which failed with it, too")
    return decision


def _decide(strategy: str, fault: Fault, roles: Mapping[str, str], alive: Set[str], used: int,
            max_restarts: int, restart_on: str, min_workers: int) -> Decision:
    """The strategy table (see the module docstring)."""
    role = roles.get(fault.task, "worker")
    retryable = restart_on == "any" or fault.cause in FAULT_CAUSES
    allowed = retryable and used < max_restarts
    if not retryable:
        why = NOT_RETRIED.get(fault.cause, "not a fault that --restart-on fault retries (--restart-on any retries it)")
    elif max_restarts == 0:
        why = "not restarted (--max-restarts 0)"
    else:
        why = f"no restarts left ({used} of --max-restarts {max_restarts} used)"
    failed = f"{fault.detail}; {why}"

    def restart(tasks: list[str], scope: str, what: str) -> Decision:
        return Decision(Action.RESTART, tuple(tasks), scope, f"{fault.task} {fault.detail}: {what}")

    if role in ("data", "dispatcher"):  # the tf.data service: restarted in place while training goes on
        if allowed:
            return restart([fault.task], Scope.TASK, "restarting it in place (the trainers' input carries on"
                           + (" from its journal)" if role == "dispatcher" else " from the other data workers)"))
        others = [t for t, r in roles.items() if r == "data" and t != fault.task and t in alive]
        if role == "data" and others:
            return Decision(Action.CONTINUE, message=f"{fault.task} {failed}; training goes on with "
                            f"{len(others)} data worker(s)", degraded=True)
        return Decision(Action.FAIL, message=f"{failed}, and the trainers' input depends on it" if role ==
                        "dispatcher" else f"{failed}, and no data worker is left")
    if role == "evaluator":
        if allowed:
            return restart([fault.task], Scope.TASK, "restarting the evaluator")
        return Decision(Action.CONTINUE, message=f"evaluator {fault.task} {fault.detail}: training goes on without it")
    recovery = facts(strategy).recovery
    if recovery is Recovery.ROLES:
        if role == "worker":
            if allowed:
                return restart([fault.task], Scope.TASK, "restarting it in place (same address: it rejoins)")
            others = [t for t, r in roles.items() if r == "worker" and t != fault.task and t in alive]
            if "chief:0" in alive and len(others) >= max(1, min_workers):
                return Decision(Action.CONTINUE, message=f"{fault.task} {failed}; training goes on "
                                f"degraded with {len(others)} worker(s)", degraded=True)
            gone = ("the chief is gone too" if "chief:0" not in alive else
                    f"only {len(others)} worker(s) left (--min-workers {min_workers})" if others else
                    "no worker is left")
            return Decision(Action.FAIL, message=f"{failed}, and {gone}")
        if role == "chief":
            if allowed:
                return restart([fault.task], Scope.TASK, "restarting the chief alone (it resumes from its "
                               "checkpoint and reuses the running ps and workers)")
            return Decision(Action.FAIL, message=failed)
        everyone = [t for t, r in roles.items() if r in ("chief", "worker", "ps")]
        if allowed:
            return restart(everyone, Scope.ALL,
                           "its variables are gone: restarting every task (resume from checkpoint)")
        return Decision(Action.FAIL, message=failed)
    if recovery is Recovery.EVERYONE:  # every stage holds part of the model: all restart from the checkpoint
        everyone = [t for t, r in roles.items() if r in ("chief", "worker")]
        if allowed:
            return restart(everyone, Scope.ALL, "a stage of the model is gone: restarting every task "
                                            "(resume from checkpoint)")
        return Decision(Action.FAIL, message=failed)
    if recovery is Recovery.GROUP:
        group = [t for t, r in roles.items() if r == "worker"]
        if allowed:
            return restart(group, Scope.GROUP, "restarting the whole worker group (resume from checkpoint)")
        return Decision(Action.FAIL, message=failed)
    if allowed:
        return restart([fault.task], Scope.TASK, "restarting it")
    return Decision(Action.FAIL, message=failed)


#: Signals a process dies of when it crashes in native code (TensorFlow's profiler has: SIGSEGV, and
#: SIGABRT from glibc's "munmap_chunk(): invalid pointer").
CRASH_SIGNALS = frozenset({4, 6, 7, 8, 11})  # SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV


def profiler_crash(strategy: str, task: str, host: str, status: ExitStatus, roles: Mapping[str, str],
                   alive: Set[str], crashed: Set[str]) -> Decision | None:
    """``task`` crashed (a native crash's signal) while TensorFlow's profiler captured it
    (``status.profiling``): TensorFlow's fault, not the program's, and ddlctl's diagnostics must not
    cost the job: the tasks the strategy restarts for such a loss start again once, tracing off, no
    restart counted. None when it is not such a crash, or ``task`` crashed so before (``crashed``):
    then it is an ordinary fault."""
    if not status.profiling or status.signal not in CRASH_SIGNALS or task in crashed:
        return None
    fault = Fault(task=task, cause=Cause.SIGNAL, reporter=task, status=status, detail=status.describe())
    decision = decide_during_restart(strategy, fault, roles, alive)  # (the strategy's scope, whatever the budget)
    if decision.action != Action.RESTART:
        return None
    return dataclasses.replace(decision, message=(
        f"{task} on {host} {status.describe()} while TensorFlow's profiler was capturing it ({status.profiling}): "
        f"a crash of TensorFlow's profiler, not of the program: starting {', '.join(decision.tasks)} again, once, "
        "with tracing off (no restart counted)"))


def backoff_s(restart_number: int, base: float = 1.0, cap: float = 30.0) -> float:
    """Seconds to wait before the ``restart_number``-th restart (1, 2, 4, ... capped)."""
    return min(cap, base * 2 ** max(0, restart_number - 1))


def decide_during_restart(strategy: str, fault: Fault, roles: Mapping[str, str], alive: Set[str]) -> Decision:
    """A fault while a restart is under way joins it, whatever the budget and ``--restart-on``
    (one restart takes in every fault until its tasks are started again)."""
    return decide(strategy, fault, roles, alive, 0, 1, "any")


def wider_scope(current: Scope, new: Scope) -> Scope:
    """The scope of a restart that took in another fault's: the wider of the two."""
    return new if SCOPES.index(new) > SCOPES.index(current) else current


def port_retry(strategy: str, task: str, host: str, port: int, members: tuple[str, ...],
               retries_used: int, kind: str = "port") -> Decision | None:
    """A server's port was taken between planning and binding: new ports for every member of the
    cluster spec (each task's TF_CONFIG names them) and the group (mwms) or everyone started again.
    None once the retries are spent: then it is an ordinary fault."""
    if retries_used >= MAX_PORT_RETRIES:
        return None
    scope = Scope.GROUP if facts(strategy).group_restart else Scope.ALL
    return Decision(Action.RESTART, members, scope,
                    f"{task} on {host}: {kind} {port} was taken before it could bind: choosing new ports and "
                    f"starting the {scope} again (try {retries_used + 1} of {MAX_PORT_RETRIES})")


def host_gone(task: str, host: str, why: str, gone: bool, host_timeout_s: float) -> tuple[Fault, Decision]:
    """A lost host that did not come back (``gone``: it cannot, e.g. its Slurm job ended) before a
    restart on it: the job fails, blaming ``task`` (the restarted task on that host, else the host)."""
    message = (f"host {host} cannot come back: {why}" if gone else
               f"host {host} did not come back within --host-timeout {host_timeout_s:g}s ({why})")
    fault = Fault(task=task, cause=Cause.HOST_LOST, reporter=task, status=ExitStatus(lost=True), detail=message)
    return fault, Decision(Action.FAIL, message=message)


def shrink(strategy: str, gone: Sequence[str], restarting: Sequence[str], roles: Mapping[str, str],
           min_workers: int, why: str) -> Decision | None:
    """The tasks ``gone`` (a host that will not be back) leave the job, which goes on without them:
    workers under ``--min-workers`` if at least ``min_workers`` remain (a group restart of the
    others of ``restarting`` with a cluster spec of the survivors under mwms, the ps job on without
    them), the tf.data service's data workers while another remains (with or without the option).
    None (fail, as without the option) when another role is gone, or too few would remain."""
    lost_workers = [t for t in gone if roles.get(t) == "worker"]
    lost_data = [t for t in gone if roles.get(t) == "data"]
    data_left = [t for t, r in roles.items() if r == "data" and t not in gone]
    workers = [t for t, r in roles.items() if r == "worker" and t not in gone]
    if len(lost_workers) + len(lost_data) < len(gone) or (lost_data and not data_left):
        return None
    if lost_workers and (not min_workers or not facts(strategy).elastic or len(workers) < min_workers):
        return None
    tasks = tuple(t for t in restarting if t not in gone)
    names = ", ".join(gone)
    on = [*([f"{len(workers)} worker(s) (--min-workers {min_workers})"] if lost_workers else []),
          *([f"{len(data_left)} data worker(s)"] if lost_data else [])]
    scope = Scope.GROUP if lost_workers and facts(strategy).group_restart else Scope.TASK
    return Decision(Action.SHRINK, tasks, scope, f"{names} left the job ({why}): training goes on with "
                    + " and ".join(on))


def grow_back(strategy: str, returning: Sequence[str], host: str, roles: Mapping[str, str]) -> Decision:
    """A host whose workers left the job answers again (and stayed up, and the job checkpointed
    since): a planned restart that takes them back. mwms: the whole group again with a cluster spec
    of every worker (``roles``: the job's tasks once they are back); ps: those workers start again
    and rejoin the coordinator. Not a fault: no restart of ``--max-restarts`` is used."""
    workers = [t for t, r in roles.items() if r == "worker"]
    names = ", ".join(returning)
    if not any(roles.get(t) == "worker" for t in returning):  # (the tf.data service's: they register again)
        return Decision(Action.RESTART, tuple(returning), Scope.TASK,
                        f"host {host} is back: starting {names} again (the tf.data service's data workers)")
    if facts(strategy).group_restart:
        return Decision(Action.RESTART, tuple(workers), Scope.GROUP,
                        f"host {host} is back: taking {names} back, the group restarts with {len(workers)} "
                        f"worker(s) from the checkpoint just written")
    return Decision(Action.RESTART, tuple(returning), Scope.TASK,
                    f"host {host} is back: starting {names} again ({len(workers)} worker(s)); it rejoins the chief")


def checkpoint_unshared(leader_host: str, source_dir: str, target_host: str, error: str) -> Decision:
    """Worker 0's checkpoint cannot be made available on a host of a group restart: fail (the
    group would restart from different states)."""
    return Decision(Action.FAIL, message=f"cannot make worker:0's checkpoint ({leader_host}:{source_dir}) available on "
                                    f"{target_host} for the group restart: {error}")
