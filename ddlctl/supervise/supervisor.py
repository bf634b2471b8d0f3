"""The supervisor: one loop owns every process of a job, through one host agent per host.

Each tick it reads what the host agents sent (task output, exits, step counts), writes output as
whole prefixed lines (and raw into ``output.log``), probes the ports of tasks not yet listening,
and decides:

* every program task (except an evaluator) succeeded -> stop the rest (ps servers, evaluator);
* a task ended (or a host's connection was lost, or the job hung) -> a :class:`~.policy.Fault`
  naming the task at fault (``policy.classify``), then ``policy.decide``: restart that task, its
  group or everything (:mod:`~.restarts`), go on degraded, or fail: stop all;
* the startup timeout passed with tasks not listening -> fail, naming them;
* SIGINT / SIGTERM / SIGHUP to ddlctl -> stop everything and never restart (a second Ctrl-C
  kills at once; a third exits at once, and the host agents still kill every task);
* ddlctl itself did not run for a while (Ctrl-Z, SIGSTOP, a debugger, a suspended machine) -> read
  what the hosts sent meanwhile and start every silence and hang clock again: that silence was
  ddlctl's own, not a host's or a task's.

The loop's concerns live beside it: :mod:`~.restarts` (backoff, ports, checkpoints),
:mod:`~.hosts` (lost connections, reconnecting), :mod:`~.hangs` (the watch, stacks, culprit),
:mod:`~.elastic` (winning back hosts whose workers left the job) and :mod:`~.results` (failure
records, the result); every decision is a pure function of :mod:`~.policy`.

Telemetry agents (one per host) are supervised the same way, but their output goes to
``telemetry/<host>.jsonl`` (each sample also to ``on_sample`` for a live view), and an agent that
dies only leaves a gap in the telemetry: the job goes on (:mod:`~.telemetry`; one lost with its
host starts again with it).

The job's phase is one :class:`~.job.JobPhase` (its moves: ``PHASE_MOVES``). Stopping (:mod:`~.stopping`)
is TERM to every task's group, then KILL after the grace period (MWMS ignores SIGTERM; a stopped
process takes only SIGKILL). The loop returns only when every task has ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import time
from collections.abc import Callable, Mapping

from ddlctl.console.collapse import LineWriter
from ddlctl.contract.causes import TimeByCause
from ddlctl.contract.faults import Action, Cause
from ddlctl.diagnose.imports import import_hint
from ddlctl.diagnose.tfmessages import Blame, port_taken, profiler_port_taken
from ddlctl.planning.plan import Plan
from ddlctl.supervise.accounting import LiveCauses
from ddlctl.supervise.autotrace import AutoTrace
from ddlctl.supervise.hangs.blame import Hangs
from ddlctl.supervise.hangs.preparing import PREPARING_MAX_S, Looks, interval_for, preparing_line
from ddlctl.supervise.hosts import HostWatch, Reconnect
from ddlctl.supervise.job import Job, JobPhase, SupervisedTask, SupervisorOptions, TaskState, log_file
from ddlctl.supervise.join_watch import JoinWatch
from ddlctl.supervise.policy import (
    Decision,
    Fault,
    classify,
    decide,
    decide_during_restart,
    died_of_stack_request,
    ended_early,
    stuck_in_exit,
)
from ddlctl.supervise.recovery.elastic import Elastic
from ddlctl.supervise.recovery.restarts import RestartFailed, Restarts
from ddlctl.supervise.results import Failure, JobResult, describe_failure, fault_event, job_result, write_error
from ddlctl.supervise.stopping import Stopping
from ddlctl.supervise.tasklog import TaskLog
from ddlctl.supervise.telemetry import TelemetryAgents
from ddlctl.transport.base import AgentSession

__all__ = ["Failure", "JobResult", "Supervisor", "SupervisorOptions", "TaskState"]

#: A wait for the hosts that came back this much later than its timeout: ddlctl itself did not run
#: meanwhile (see :meth:`Supervisor._resumed`). A loaded machine delays a tick by far less.
PAUSED_S = 5.0


class Supervisor:
    """Starts the plan's tasks through their hosts' agents and supervises them to the end."""

    def __init__(self, plan: Plan, sessions: Mapping[str, AgentSession], writer: LineWriter,
                 options: SupervisorOptions, notify: Callable[[str], None] = lambda _msg: None,
                 on_sample: Callable[[str, dict], None] | None = None,
                 reconnect: Reconnect | None = None,
                 on_progress: Callable[[dict[str, tuple[int, int | None]], dict[str, tuple[int, str | None]]], None]
                 | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 hard_exit: Callable[[int], None] = os._exit) -> None:
        def say(message: str) -> None:  # task lines held for merging come out before ddlctl's words
            writer.flush()
            notify(message)

        self.job = Job(plan, options, dict(sessions), say, clock)
        self.writer = writer
        self.on_progress = on_progress  # (task -> (highest step, declared total), task -> (work lines, phase))
        self.selector = selectors.DefaultSelector()
        self.hosts = HostWatch(self.job, reconnect, self._attach, self._detach)
        self.restarts = Restarts(self.job, self.hosts)
        self.hangs = Hangs(self.job)
        self.telemetry = TelemetryAgents(self.job, self.hangs, on_sample)
        self.elastic = Elastic(self.job, self.hosts, self.restarts)
        self.joined = JoinWatch(self.job, self.job.notify)
        self.stopping = Stopping(self.job, self.hangs, hard_exit)
        self.failure: Failure | None = None
        self.degraded: list[dict] = []
        self.paused: list[dict] = []  # each time ddlctl itself did not run (Ctrl-Z, SIGSTOP, suspended)
        self.starting = Looks(self.hangs.dump)  # whether tasks not listening yet are at work
        self.preparing: list[dict] = []  # tasks not listening yet found at work (the hang watch keeps its own)
        self.started_noted = False
        self.causes = LiveCauses(time.time())  # the time so far by cause (live view, metrics)
        self.autotrace = AutoTrace.for_job(self.job, self.hangs.watch)  # --trace auto (None: not asked)

    @property
    def sessions(self) -> dict[str, AgentSession]:
        """Every host's session (a reconnected host's new one)."""
        return self.job.sessions

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> JobResult:
        """Start every task, supervise until all have ended, return the result."""
        started, started_at = self.job.clock(), time.time()
        self.causes.started = started_at
        previous = self.stopping.install_handlers()
        try:
            for session in self.job.sessions.values():
                self._attach(session)
            self._start_all()
            while self._active():
                self._tick()
            self.job.enter(JobPhase.ENDED)
            self.joined.at_end()
            if self.failure is not None and self.failure.reason == "time-limit" and self.job.programs_succeeded():
                self.failure = None  # (training ended inside the time limit's stop: the run is complete)
        finally:
            self.stopping.restore_handlers(previous)
            self.elastic.close()
            self.writer.flush()
            for task in self.job.tasks.values():
                if task.alive:  # only on an exception inside the loop: never leave them running
                    task.proc.force_kill()
                with contextlib.suppress(OSError):
                    task.log.close()
            self.selector.close()
        return job_result(self.job, self.job.clock() - started, self.failure, self.stopping.signals,
                          telemetry_gaps=self.telemetry.gaps, restarts=self.restarts.events,
                          degraded=self.degraded, hosts_lost=self.hosts.lost, hangs=self.hangs.reports,
                          started_at=started_at, membership=self.job.membership,
                          left_running=self.stopping.left_running,
                          paused=self.paused, clock_offsets=self.hosts.clock_offsets, unjoined=self.joined.unjoined,
                          preparing=[*self.preparing, *self.hangs.preparing],
                          auto_traces=self.autotrace.events if self.autotrace is not None else ())

    def status(self) -> tuple[list[tuple[str, str, str, bool]], int]:
        """(task, host, role, running) for every task, and the restarts so far (metrics)."""
        return ([(t.name, t.host, t.spec.role, t.alive) for t in self.job.tasks.values()
                 if not t.is_agent], len(self.restarts.events))

    def time_by_cause(self) -> TimeByCause:
        """The job's time so far by cause (counted again at most once a second)."""
        return self.causes.now(time.time(), self.degraded, self.hangs.reports)

    def _attach(self, session: AgentSession) -> None:
        self.selector.register(session.fileno(), selectors.EVENT_READ, session)

    def _detach(self, session: AgentSession) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(session.fileno())

    def _active(self) -> bool:
        if any(t.alive or not t.eof for t in self.job.tasks.values()):
            return True
        return self.restarts.under_way and not self.job.stopping

    def _start_all(self) -> None:
        # Agents first (telemetry covers the whole run), then servers so programs find them sooner.
        plan = self.job.plan
        for spec in [*plan.agents, *sorted(plan.tasks, key=lambda t: t.kind != "server")]:
            after = ("its samples are not kept there (the report will lack them)" if spec.kind == "agent" else
                     f"{spec.name}'s output is still shown here, not kept there")
            log = TaskLog(log_file(self.job.run_dir, spec), self.job.notify, after)  # closed in run()
            self.job.tasks[spec.name] = self.job.launch(spec, log)
        self.job.write_pids()

    # -- one tick ----------------------------------------------------------------------------

    def _tick(self) -> None:
        waited_from = self.job.clock()
        for key, _ in self.selector.select(self.job.options.tick_s):
            key.data.pump()
        now = self.job.clock()
        if now - waited_from > self.job.options.tick_s + PAUSED_S:
            self._resumed(now - waited_from, now)
        for task in self.job.tasks.values():
            self._read(task, now)
            if not task.is_agent:
                self.writer.write(task.name, task.host, task.splitter.flush_stale(now))
        self.writer.tick(now)
        self._note_pids()
        failure = self.stopping.handle_signals()
        if failure is not None:
            self.failure = failure
        self.hosts.watch(now)
        self._poll_exits(now)
        sessions = self.job.sessions.values()
        progress = {name: figures for session in sessions for name, figures in session.progress().items()}
        activity = {name: busy for session in sessions for name, busy in session.activity().items()}
        beats = {name: kind for session in sessions for name, kind in session.beats().items()}
        self.causes.tick(time.time(), progress, activity, [float(e["time"]) for e in self.restarts.events],
                         self.restarts.under_way, beats)
        if self.on_progress is not None:
            self.on_progress(progress, activity)
        if self.job.stopping:
            self.stopping.escalate(now)
            return
        if self.autotrace is not None and not self.restarts.under_way:
            self.autotrace.look(now, self.job)
        self.hangs.feed(now)
        self.elastic.tick(now)
        self.telemetry.tick(now)
        self.joined.tick(now)
        self._probe_ports(now)
        self._check_startup_timeout(now)
        # while a replacement server starts, its peers may wait for it (a ps chief with no other
        # worker): no hang is judged until it listens (the startup timeout covers one that never does)
        replacing = any(t.restarts and t.state is TaskState.STARTING and t.alive for t in self.job.tasks.values())
        if not self.restarts.under_way and not replacing:
            finding = self.hangs.check(now)
            if finding is not None:
                for name, idle in finding.ended:
                    self._end_stuck_in_exit(self.job.tasks[name], idle)
                if finding.fault is not None:
                    self._on_fault(finding.fault)
        restarting = list(self.restarts.current.tasks) if self.restarts.current is not None else None
        failed = self.restarts.advance(now)
        if failed is not None:
            self._restart_failed(failed)
        elif restarting is not None and not self.restarts.under_way:  # its tasks started again
            self.hangs.watch.rearm(now, restarting)
        self._check_job_done()

    def _note_pids(self) -> None:
        """``pids.json`` again whenever an agent reported new pids; "started" once all have."""
        changed = [s.take_pids_changed() for s in self.job.sessions.values()]
        if not any(changed):
            return
        self.job.write_pids()
        if not self.started_noted and all(t.proc.pids() or not t.alive for t in self.job.tasks.values()):
            self.started_noted = True  # every host agent has reported its tasks' pids
            plan = self.job.plan
            self.job.notify(f"started {len(plan.tasks)} task(s) on {len(plan.hosts)} host(s)")

    def _read(self, task: SupervisedTask, now: float) -> None:
        while True:
            chunk = task.proc.read()
            if chunk is None:
                return
            if chunk == b"":
                self._end_output(task)
                return
            task.log.write(chunk)
            self._emit(task, task.splitter.feed(chunk, now))

    def _emit(self, task: SupervisedTask, lines: list[bytes]) -> None:
        """Task lines go to the terminal; agent lines are samples (anything else is shown)."""
        if not task.is_agent:
            self.writer.write(task.name, task.host, lines)
            for blame in task.reports.feed_lines(lines):
                self._peer_report(task, blame)
            if task.reports.stragglers:
                self._left_waiting(task)
            return
        self.writer.write(task.name, task.host, self.telemetry.lines(task, lines))

    def _end_output(self, task: SupervisedTask) -> None:
        if task.eof:
            return
        task.eof = True
        self._emit(task, task.splitter.flush())

    # -- exits and faults --------------------------------------------------------------------

    def _poll_exits(self, now: float) -> None:
        ended = []
        for task in self.job.tasks.values():
            if task.alive:
                status = task.proc.poll()
                if status is not None:
                    task.status, task.ended = task.exit_as or status, now
                    self._read(task, now)  # the agent sent its last output before the exit
                    ended.append(task)
        # In the order the agents saw them end: the first to go is the likeliest cause.
        for task in sorted(ended, key=lambda t: t.proc.ended_t or 0.0):
            self._on_exit(task)

    def _on_exit(self, task: SupervisedTask) -> None:
        status = task.status
        assert status is not None
        if self.job.stopping or task.handled:
            if task.state is not TaskState.FAILED:  # a hung task killed by its fault's decision stays failed
                task.state = TaskState.SUCCEEDED if status.ok else TaskState.STOPPED
            return
        task.handled = True
        if task.is_agent:  # telemetry has a gap from here on; training goes on
            self.telemetry.ended(task)
            return
        output = task.log.attempt()  # (this attempt's: an earlier one's error or taken port is not this exit's)
        text = output if not status.ok else ""
        if task.dump_asked and died_of_stack_request(status):  # it was past Python's shutdown
            idle, stuck = self.hangs.past_python(task.name, self.job.clock())
            status, message = stuck_in_exit(task.name, text, idle, past_python=True, stuck=stuck)
            task.status = status
            self.job.notify(message)
        if status.ok and task.spec.kind == "program":
            task.state = TaskState.SUCCEEDED
            for other in [t for t in self.job.tasks.values() if t.alive and t.reports.stragglers]:
                if self._left_waiting(other):
                    break
            return
        if task.spec.port and port_taken(output) and self.restarts.retry_ports(task.name,
                                                                               profiler_port_taken(output)):
            return
        if status.profiling and self.restarts.retry_untraced(task.name):  # TensorFlow's profiler crashed it
            return
        task.state = TaskState.FAILED
        alive = self.job.alive()
        fault = classify(task.name, status, text, self.job.strategy, alive, set(self.job.roles), self.job.aliases,
                         self.job.finished(), self.job.reached().get(task.name))
        session = self.job.sessions.get(task.host)
        if fault.cause == Cause.HOST_LOST and session is not None and session.lost:  # say why the host went
            fault = dataclasses.replace(fault, detail=f"{fault.detail} ({session.lost})")
        if fault.cause == Cause.HANG and fault.task in alive:  # its peers name it: keep its stacks first
            fault = self.hangs.named(fault, self.job.clock())
        if fault.cause == Cause.NO_MODULE and fault.task == task.name:  # which Python it was, and what to do
            hint = import_hint(text, task.spec.argv, task.host, task.spec.host.is_local, task.spec.workdir,
                               task.proc.pids().get("executable"))
            fault = dataclasses.replace(fault, detail=f"{fault.detail}: {hint}") if hint else fault
        self._on_fault(fault)

    def _left_waiting(self, task: SupervisedTask) -> bool:
        """Whether ``task``'s coordination service waits for a task that has ended on its own (exit
        code 0): it never connects, and that is its fault now (else the job waits out the startup
        timeout and blames the leader)."""
        if self.job.stopping or not task.alive:
            return False
        finished = self.job.finished()
        for tf_name in task.reports.stragglers:
            name = self.job.own_name(tf_name)
            if name in finished:
                self._on_fault(ended_early(name, task.name, finished[name], f"{task.name} waits for it to join the "
                                           f"cluster (\"{task.reports.waiting_words()}\")", self.job.strategy,
                                           joined=False))
                return True
        return False

    def _end_stuck_in_exit(self, task: SupervisedTask, idle_s: float) -> None:
        """``task``'s program has ended, its process has not: end it as the exit its program made."""
        task.exit_as, message = stuck_in_exit(task.name, self.job.log_text(task.name), idle_s)
        self.job.notify(message)
        task.proc.send("KILL")

    def _peer_report(self, reporter: SupervisedTask, blame: Blame) -> None:
        """A running task's TensorFlow named a hung peer (and may go on): that peer is at fault."""
        name = self.job.own_name(blame.task)
        culprit = self.job.tasks.get(name)
        current = self.restarts.current
        if culprit is None or culprit.is_agent or culprit is reporter or not culprit.alive or self.job.stopping \
                or (current is not None and name in current.tasks):
            return
        fault = Fault(task=name, cause=Cause.HANG, reporter=reporter.name, status=None,
                      detail=f"hung ({reporter.name} reports \"{blame.line[:240]}\")")
        self._on_fault(self.hangs.named(fault, self.job.clock()))

    def _on_fault(self, fault: Fault) -> None:
        job = self.job
        alive = job.alive()
        if self.restarts.under_way:  # a restart is under way: this fault joins it (no extra budget)
            decision = decide_during_restart(job.strategy, fault, job.roles, alive)
        else:
            decision = decide(job.strategy, fault, job.roles, alive, self.restarts.used(),
                              job.options.max_restarts, job.options.restart_on, job.options.min_workers)
        event = fault_event(job, fault, decision.action, decision.scope, decision.tasks)
        if decision.action == Action.FAIL:
            job.notify(f"{fault.task} on {event['host']} failed: {decision.message}: stopping the other tasks")
            self._fail(fault, decision)
        elif decision.action == Action.CONTINUE:
            job.notify(decision.message)
            culprit = job.tasks.get(fault.task)
            if culprit is not None and culprit.alive:  # a hung task: its work moves to the others
                culprit.handled, culprit.state = True, TaskState.FAILED
                culprit.proc.send("KILL")
            if decision.degraded:
                self.degraded.append({**event, "since": time.time()})
        else:
            job.notify(decision.message)
            self.restarts.begin(decision, event)

    def _restart_failed(self, failed: RestartFailed) -> None:
        if failed.fault is not None:
            self._fail(failed.fault, failed.decision)
            return
        self.job.notify(failed.decision.message)
        self.failure = Failure(reason="start-failed", message=failed.decision.message, exit_code=1)
        self.stopping.begin()

    def _fail(self, fault: Fault, decision: Decision) -> None:
        self.failure = describe_failure(self.job, fault, decision.message)
        write_error(self.job, fault, self.failure)
        self.stopping.begin()

    # -- startup -----------------------------------------------------------------------------

    def _probe_ports(self, now: float) -> None:
        tasks = self.job.tasks.values()
        for task in tasks:
            if task.state is TaskState.STARTING and task.alive and now >= task.next_probe:
                task.next_probe = now + self.job.options.probe_interval_s
                if task.spec.port and task.proc.listening:
                    task.state = TaskState.RUNNING
                    self.restarts.listening(task.name)
                    if task.restarts:  # its peers may have waited for it: their clocks start now
                        self.hangs.watch.rearm(now)
        if self.job.phase is JobPhase.STARTING and tasks and all(t.state is not TaskState.STARTING for t in tasks):
            self.job.enter(JobPhase.RUNNING)
            self.hangs.watch.arm(now)  # a job that never steps at all is hung too
            ports = [t for t in tasks if t.spec.port]
            if ports and all(t.proc.listening for t in ports):  # (not when some ended without listening)
                waited = now - min(t.started for t in tasks)
                self.job.notify(f"cluster up: every task is listening ({waited:.1f}s after start)")

    def _resumed(self, gap: float, now: float) -> None:
        """ddlctl itself did not run for ``gap`` seconds while it waited for (or read) its hosts:
        stopped (Ctrl-Z, SIGSTOP, a debugger), its machine suspended or starved. Python gives back
        such a wait empty (its timeout is over) though the hosts went on sending: read what they
        sent, and let no host or task be blamed for a silence that was ddlctl's (their agents beat
        on, and tasks wait once their output fills the pipe to ddlctl); every clock starts again."""
        self.job.notify(f"this process did not run for {gap:.0f}s (stopped: Ctrl-Z, SIGSTOP or a debugger; or its "
                        "machine was suspended): no host or task is blamed for that silence")
        self.paused.append({"time": time.time() - gap, "seconds": round(gap, 1)})
        for session in self.job.sessions.values():
            session.pump()
            session.heard()
        self.hangs.watch.rearm(now)
        for task in self.job.tasks.values():
            if task.state is TaskState.STARTING:  # (the startup timeout leaves the pause out)
                task.started += gap

    def _check_startup_timeout(self, now: float) -> None:
        """Tasks that have not listened on their port within the startup timeout fail the job,
        unless they are at work (:mod:`~.preparing`): then their timeout starts again."""
        timeout = self.job.options.startup_timeout_s
        if not timeout:
            return
        def missing_at(when: float) -> list[SupervisedTask]:
            return [t for t in self.job.tasks.values()
                    if t.state is TaskState.STARTING and t.alive and when - (t.startup_from or t.started) >= timeout]

        missing, interval = missing_at(now), interval_for(timeout)
        fresh = [t.name for t in missing or missing_at(now + interval) if now - t.started < PREPARING_MAX_S]
        if not missing:
            if fresh:  # the first look, ahead of the timeout
                self.starting.look(fresh, now, interval)
            else:
                self.starting.reset()
            return
        found = self.starting.look(fresh, now, interval) if fresh else {}
        if found is None:
            return
        if found:
            waited = max(now - (self.job.tasks[n].startup_from or self.job.tasks[n].started) for n in found)
            self.job.notify(preparing_line(found, "not listening on its port", waited, timeout))
            self.preparing.append({"time": time.time(), "before": "listening", "waited_s": round(waited, 1),
                                   "tasks": [work.record() for _, work in sorted(found.items())]})
            for name in found:
                self.job.tasks[name].startup_from = now
            missing = [t for t in missing if t.name not in found]
            if not missing:
                return
        standings = self.starting.standings
        names = ", ".join(f"{t.name} on {t.host} (port {t.spec.port}" +
                          (f"; {standings[t.name].where}" if t.name in standings and standings[t.name].frames else "")
                          + ")" for t in missing)
        self.failure = Failure(
            reason="startup-timeout",
            message=f"startup timeout: {len(missing)} task(s) never started listening within "
                    f"{timeout:g}s: {names}",
            missing=tuple(t.name for t in missing))
        self.job.notify(self.failure.message)
        self.stopping.begin()

    def _check_job_done(self) -> None:
        if not self.restarts.under_way and self.job.programs_succeeded():
            if any(t.alive for t in self.job.tasks.values()):
                self.job.notify("training finished: stopping the remaining tasks")
            self.stopping.begin()
