"""How a supervised job ended: the failure record (root cause), ``error.json``, and the result.

Pure descriptions of what the supervisor saw: a :class:`Failure` names the task at fault with its
traceback and the last lines of its log; :class:`JobResult` is what ``ddlctl launch`` turns into
``outcome.json``, the report and its exit code.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddlctl.contract.faults import Cause
from ddlctl.contract.rundir import TASK_ERROR
from ddlctl.contract.runfolder import task_dir
from ddlctl.diagnose.rootcause import last_traceback, tail_lines
from ddlctl.supervise.job import Job, SupervisedTask, TaskState
from ddlctl.supervise.policy import Fault
from ddlctl.transport.status import ExitStatus, signal_name


@dataclass(frozen=True)
class Failure:
    """Why the job failed: the task at fault (or the missing ones at startup)."""

    reason: str  # "exited", "startup-timeout", "interrupted", "start-failed", "hang", "host-lost"
    message: str
    task: str | None = None
    host: str | None = None
    status: ExitStatus | None = None
    traceback: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    log: str | None = None
    missing: tuple[str, ...] = ()
    exit_code: int | None = None
    reporter: str | None = None  # the task whose traceback (and log) is shown, when not ``task``'s own
    reporter_log: str | None = None


@dataclass(frozen=True)
class TaskOutcome:
    name: str
    host: str
    state: TaskState
    status: ExitStatus | None
    started_s: float
    ended_s: float | None
    restarts: int = 0


@dataclass(frozen=True)
class JobResult:
    """What the supervisor reports back: success, the exit code for ddlctl, every task's end."""

    ok: bool
    exit_code: int
    wall_time_s: float
    tasks: tuple[TaskOutcome, ...]
    failure: Failure | None = None
    agents: tuple[TaskOutcome, ...] = ()
    telemetry_gaps: tuple[str, ...] = ()
    restarts: tuple[dict, ...] = ()
    degraded: tuple[dict, ...] = ()
    hosts_lost: tuple[dict, ...] = ()
    hangs: tuple[dict, ...] = ()
    started_at: float | None = None  # epoch seconds when the supervisor started the tasks
    membership: tuple[dict, ...] = ()  # each change of the job's workers (--min-workers)
    left_running: tuple[dict, ...] = ()  # tasks SIGKILL could not end (state D): task, host, pid, where
    paused: tuple[dict, ...] = ()  # each time ddlctl itself did not run (stopped, suspended): time, seconds
    clock_offsets: Mapping[str, float] = field(default_factory=dict)  # host -> its clock less this machine's
    unjoined: tuple[str, ...] = ()  # workers that took steps without joining the cluster (trained alone)
    preparing: tuple[dict, ...] = ()  # each time tasks that had not begun were found at work, not hung
    phases: Mapping[str, float] = field(default_factory=dict)  # each JobPhase entered -> seconds after the start
    auto_traces: tuple[dict, ...] = ()  # --trace auto: each capture asked, and why


def fault_event(job: Job, fault: Fault, action: str, scope: str = "", tasks: Sequence[str] = ()) -> dict:
    """The record of a fault and what was done about it (``outcome.json``'s restarts/degraded)."""
    culprit = job.tasks.get(fault.task)
    return {"time": time.time(), "task": fault.task, "host": culprit.host if culprit else None,
            "cause": fault.cause, "reporter": fault.reporter,
            "exit_code": fault.status.code if fault.status else None,
            "signal": signal_name(fault.status.signal) if fault.status and fault.status.signal else None,
            "detail": fault.detail, "action": action, "scope": scope, "tasks": list(tasks)}


def describe_failure(job: Job, fault: Fault, message: str) -> Failure:
    """The failure record of ``fault``: its traceback (or its reporter's) and its log's tail."""
    roles = job.roles
    task = job.tasks.get(fault.task)
    log = job.log_path(fault.task) if fault.task in roles else None
    text = job.log_text(fault.task) if log else ""
    reporter_text = job.log_text(fault.reporter) if fault.reporter != fault.task \
        and fault.reporter in roles else ""
    own = last_traceback(text)
    traceback = own or last_traceback(reporter_text)
    if fault.cause == Cause.HOST_LOST:  # the program did not fail: its output says nothing about why
        text = reporter_text = ""
        traceback = []
    # what is shown is the reporter's when the task at fault said nothing of it (it was killed,
    # hung, or ended early): said so, with the reporter's log
    theirs = bool(reporter_text) and (not own if traceback else not text.strip())
    reason = {Cause.HANG: "hang", Cause.HOST_LOST: "host-lost"}.get(fault.cause, "exited")
    return Failure(reason=reason, message=message, task=fault.task, host=task.host if task else None,
                   status=fault.status, traceback=tuple(traceback),
                   tail=tuple(tail_lines(text or reporter_text)), log=str(log) if log else None,
                   exit_code=fault.exit_code, reporter=fault.reporter if theirs else None,
                   reporter_log=str(job.log_path(fault.reporter)) if theirs else None)


def write_error(job: Job, fault: Fault, failure: Failure) -> None:
    """``tasks/<task>/error.json``: the root cause, in the task's own folder."""
    record = {
        "task": fault.task, "host": failure.host, "cause": fault.cause, "reporter": fault.reporter,
        "exit_code": failure.status.code if failure.status else None,
        "signal": signal_name(failure.status.signal) if failure.status and failure.status.signal else None,
        "time": time.time(), "message": failure.message,
        "traceback": list(failure.traceback), "tail": list(failure.tail),
    }
    with contextlib.suppress(OSError, KeyError):
        path = task_dir(job.run_dir, job.plan.task(fault.task).dir_name) / TASK_ERROR
        path.write_text(json.dumps(record, indent=1) + "\n")


def exit_code(failure: Failure | None, signals: Sequence[int]) -> int:
    """ddlctl's exit code: 0, 128 + the first signal when interrupted, the fault's code, else 1."""
    if failure is None:
        return 0
    if failure.reason == "interrupted" and signals:
        return 128 + signals[0]
    return failure.exit_code if failure.exit_code is not None else 1


def outcome_of(task: SupervisedTask) -> TaskOutcome:
    return TaskOutcome(name=task.name, host=task.host, state=task.state, status=task.status,
                       started_s=task.started, ended_s=task.ended, restarts=task.restarts)


def job_result(job: Job, wall: float, failure: Failure | None, signals: Sequence[int], *,
               telemetry_gaps: Sequence[str], restarts: Sequence[dict], degraded: Sequence[dict],
               hosts_lost: Sequence[dict], hangs: Sequence[dict] = (), started_at: float | None = None,
               membership: Sequence[dict] = (), left_running: Sequence[dict] = (),
               paused: Sequence[dict] = (), clock_offsets: Mapping[str, float] | None = None,
               unjoined: Sequence[str] = (), preparing: Sequence[dict] = (),
               auto_traces: Sequence[dict] = ()) -> JobResult:
    """Every task's end, in plan order (agents apart), with the job's exit code."""
    order = {spec.name: i for i, spec in enumerate((*job.plan.tasks, *job.plan.agents))}
    ordered = sorted(job.tasks.values(), key=lambda t: order[t.name])
    return JobResult(ok=failure is None, exit_code=exit_code(failure, signals), wall_time_s=wall,
                     tasks=tuple(outcome_of(t) for t in ordered if not t.is_agent), failure=failure,
                     agents=tuple(outcome_of(t) for t in ordered if t.is_agent),
                     telemetry_gaps=tuple(telemetry_gaps), restarts=tuple(restarts), degraded=tuple(degraded),
                     hosts_lost=tuple(hosts_lost), hangs=tuple(hangs), started_at=started_at,
                     membership=tuple(membership), left_running=tuple(left_running), paused=tuple(paused),
                     clock_offsets=dict(clock_offsets or {}), unjoined=tuple(unjoined),
                     preparing=tuple(sorted(preparing, key=lambda event: event.get("time") or 0.0)),
                     phases=job.phases(), auto_traces=tuple(auto_traces))


def _task_end(task: TaskOutcome, restarts: bool = True) -> dict:
    status = task.status
    record = {"name": task.name, "host": task.host, "state": task.state.value,
              "exit": status.describe() if status else None,  # for people
              "exit_code": status.code if status else None,
              "signal": signal_name(status.signal) if status and status.signal else None,
              "lost": bool(status and status.lost)}
    if restarts:
        record["restarts"] = task.restarts
    return record


def outcome_record(result: JobResult) -> dict:
    """``outcome.json``: how the job ended. Every figure is a number or a name; ``exit`` and
    ``failure`` are for people, and no reader parses them back (see :func:`task_exit_code`)."""
    failure = result.failure
    return {
        "ok": result.ok, "exit_code": result.exit_code, "wall_time_s": result.wall_time_s,
        "started_at": result.started_at,
        "ended_at": None if result.started_at is None else result.started_at + result.wall_time_s,
        "tasks": [_task_end(t) for t in result.tasks],
        "failure": None if failure is None else failure.message,
        "root_cause": None if failure is None else {
            "task": failure.task, "host": failure.host, "reason": failure.reason, "exit_code": result.exit_code},
        "restarts": list(result.restarts),
        "degraded": list(result.degraded),
        "hosts_lost": list(result.hosts_lost),
        "hangs": list(result.hangs),
        "membership": list(result.membership),
        "left_running": list(result.left_running),
        "paused": list(result.paused),
        "clock_offsets": dict(result.clock_offsets),
        "unjoined": list(result.unjoined),
        "preparing": list(result.preparing),
        "phases": dict(result.phases),
        "auto_traces": list(result.auto_traces),
        "agents": [_task_end(t, restarts=False) for t in result.agents],
        "telemetry_gaps": list(result.telemetry_gaps),
    }


def task_exit_code(entry: dict) -> int | None:
    """A task's exit code from its ``outcome.json`` entry (None: killed by a signal, lost, running)."""
    code = entry.get("exit_code")
    return int(code) if code is not None else None
