"""The supervisor: one loop owns every process of a job.

Each tick it multiplexes output (whole lines, prefixed, and raw into ``output.log``), probes the
ports of tasks not yet connected, watches exits and decides:

* every program task (except an evaluator) succeeded -> stop the rest (ps servers, evaluator);
* a task failed (or a server exited on its own) -> that is the root cause, stop everything;
* the startup timeout passed with tasks not listening -> fail, naming them;
* SIGINT / SIGTERM / SIGHUP to ddlctl -> stop everything (a second Ctrl-C kills at once).

Telemetry agents (one per host) are supervised the same way, but their output goes to
``telemetry/<host>.jsonl`` (each sample also to ``on_sample`` for a live view), and an agent that
dies only leaves a gap in the telemetry: the job goes on.

Stopping is TERM to every task's process group, then KILL after the grace period (MWMS ignores
SIGTERM). The loop returns only when every task has exited.

Task states: ``STARTING`` -> ``RUNNING`` (its port accepts connections, or it has none) ->
``SUCCEEDED`` | ``FAILED`` | ``STOPPED`` (ended because ddlctl stopped it).
"""

from __future__ import annotations

import contextlib
import enum
import json
import selectors
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ddlctl.errors import LaunchError
from ddlctl.planning.plan import Plan, TaskSpec
from ddlctl.supervise.output import LineSplitter, PrefixedWriter
from ddlctl.supervise.rootcause import last_traceback, read_tail, tail_lines
from ddlctl.transport.base import ExitStatus, TaskProcess, Transport, signal_name


class TaskState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SupervisorOptions:
    """How to supervise: timeouts in seconds (0 disables the startup timeout)."""

    startup_timeout_s: float = 180.0
    grace_s: float = 5.0
    tick_s: float = 0.1
    probe_interval_s: float = 0.5
    drain_s: float = 2.0


@dataclass(frozen=True)
class Failure:
    """Why the job failed: the first failing task (or the missing ones at startup)."""

    reason: str  # "exited", "startup-timeout", "interrupted", "start-failed"
    message: str
    task: str | None = None
    host: str | None = None
    status: ExitStatus | None = None
    traceback: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    log: str | None = None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskOutcome:
    name: str
    host: str
    state: TaskState
    status: ExitStatus | None
    started_s: float
    ended_s: float | None


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


@dataclass
class _Task:
    spec: TaskSpec
    proc: TaskProcess
    log: BinaryIO
    started: float
    splitter: LineSplitter = field(default_factory=LineSplitter)
    state: TaskState = TaskState.STARTING
    status: ExitStatus | None = None
    ended: float | None = None
    eof: bool = False
    next_probe: float = 0.0

    @property
    def alive(self) -> bool:
        return self.status is None

    @property
    def host(self) -> str:
        return self.spec.host.label

    @property
    def is_agent(self) -> bool:
        return self.spec.kind == "agent"


def telemetry_file(run_dir: Path, host_label: str) -> Path:
    """``telemetry/<host>.jsonl`` for a host label (``/`` cannot appear in a file name)."""
    return run_dir / "telemetry" / f"{host_label.replace('/', '_')}.jsonl"


def log_file(run_dir: Path, spec: TaskSpec) -> Path:
    """Where a task's raw output goes: its output.log, or an agent's telemetry file."""
    if spec.kind == "agent":
        return telemetry_file(run_dir, spec.host.label)
    return run_dir / "tasks" / spec.dir_name / "output.log"


class Supervisor:
    """Starts the plan's tasks through their host's transport and supervises them to the end."""

    def __init__(self, plan: Plan, transports: Mapping[str, Transport], writer: PrefixedWriter,
                 options: SupervisorOptions, notify: Callable[[str], None] = lambda _msg: None,
                 on_sample: Callable[[str, dict], None] | None = None) -> None:
        self.plan = plan
        self.on_sample = on_sample
        self.telemetry_gaps: list[str] = []
        self.transports = transports
        self.writer = writer
        self.options = options
        self.notify = notify
        self.run_dir = Path(plan.run_dir)
        self.tasks: list[_Task] = []
        self.failure: Failure | None = None
        self.stopping_since: float | None = None
        self.killed_at: float | None = None
        self.signal_received: int | None = None
        self.all_ready_noted = False
        self.selector = selectors.DefaultSelector()

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> JobResult:
        """Start every task, supervise until all have ended, return the result."""
        started = time.monotonic()
        previous = self._install_signal_handlers()
        try:
            try:
                self._start_all()
            except LaunchError as exc:
                self.failure = Failure(reason="start-failed", message=exc.message)
                self._begin_stop()
            while any(t.alive or not t.eof for t in self.tasks):
                self._tick()
        finally:
            self._restore_signal_handlers(previous)
            for task in self.tasks:
                if task.alive:  # only on an exception inside the loop: never leave them running
                    task.proc.force_kill()
                with contextlib.suppress(OSError):
                    task.log.close()
                getattr(task.proc, "close", lambda: None)()
            self.selector.close()
        return self._result(time.monotonic() - started)

    def _start_all(self) -> None:
        pids: dict[str, object] = {}
        # Agents first (telemetry covers the whole run), then servers so programs find them sooner.
        order = [*self.plan.agents, *sorted(self.plan.tasks, key=lambda t: t.kind != "server")]
        for spec in order:
            transport = self.transports[spec.host.label]
            log_path = log_file(self.run_dir, spec)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")  # noqa: SIM115 - closed in run()
            try:
                proc = transport.start(spec, self.options.grace_s)
            except BaseException:
                log.close()
                raise
            task = _Task(spec=spec, proc=proc, log=log, started=time.monotonic())
            if spec.port is None:
                task.state = TaskState.RUNNING
            self.tasks.append(task)
            self.selector.register(proc.fileno(), selectors.EVENT_READ, task)
            pids[spec.name] = {"host": spec.host.label, **proc.pids()}
            (self.run_dir / "pids.json").write_text(json.dumps(pids, indent=1) + "\n")
        self.notify(f"started {len(self.plan.tasks)} task(s) on {len(self.plan.hosts)} host(s)")

    # -- one tick ----------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for key, _ in self.selector.select(self.options.tick_s):
            self._read(key.data, time.monotonic())
        now = time.monotonic()
        for task in self.tasks:
            if not task.is_agent:
                self.writer.write(task.spec.name, task.host, task.splitter.flush_stale(now))
        self._poll_exits(now)
        if self.signal_received is not None and self.stopping_since is None:
            name = signal_name(self.signal_received)
            self.failure = self.failure or Failure(reason="interrupted",
                                                   message=f"interrupted by {name}")
            self.notify(f"{name}: stopping all tasks")
            self._begin_stop()
        if self.stopping_since is None:
            self._probe_ports(now)
            self._check_startup_timeout(now)
            self._check_job_done()
        else:
            self._escalate(now)

    def _read(self, task: _Task, now: float) -> None:
        chunk = task.proc.read()
        if chunk is None:
            return
        if chunk == b"":
            self._end_output(task)
            return
        task.log.write(chunk)
        task.log.flush()
        self._emit(task, task.splitter.feed(chunk, now))

    def _emit(self, task: _Task, lines: list[bytes]) -> None:
        """Task lines go to the terminal; agent lines are samples (anything else is shown)."""
        if not task.is_agent:
            self.writer.write(task.spec.name, task.host, lines)
            return
        others = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                others.append(line)
                continue
            if self.on_sample is not None and isinstance(record, dict):
                self.on_sample(task.host, record)
        self.writer.write(task.spec.name, task.host, others)

    def _end_output(self, task: _Task) -> None:
        if task.eof:
            return
        task.eof = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(task.proc.fileno())
        self._emit(task, task.splitter.flush())

    def _poll_exits(self, now: float) -> None:
        for task in self.tasks:
            if task.alive:
                status = task.proc.poll()
                if status is not None:
                    task.status, task.ended = status, now
                    self._on_exit(task)
            elif not task.eof and task.ended is not None and now - task.ended > self.options.drain_s:
                # Exited, but something it left behind still holds the pipe: stop waiting.
                self._end_output(task)

    def _on_exit(self, task: _Task) -> None:
        status = task.status
        assert status is not None
        if self.stopping_since is not None:  # ended because ddlctl is stopping the job
            task.state = TaskState.SUCCEEDED if status.ok else TaskState.STOPPED
            return
        if task.is_agent:  # telemetry has a gap from here on; training goes on
            task.state = TaskState.FAILED
            gap = f"telemetry agent on {task.host} stopped ({status.describe()}): no telemetry from it after this"
            self.telemetry_gaps.append(gap)
            self.notify(gap)
            return
        if status.ok and task.spec.kind == "program":
            task.state = TaskState.SUCCEEDED
            return
        task.state = TaskState.FAILED
        self._drain(task)
        self.failure = self._describe_failure(task)
        self._write_error(task, self.failure)
        self.notify(f"{task.spec.name} on {task.host} failed ({self.failure.message}): stopping "
                    "the other tasks")
        self._begin_stop()

    def _drain(self, task: _Task) -> None:
        """Read what the dead task still had in the pipe, so its traceback is in the log."""
        deadline = time.monotonic() + self.options.drain_s
        while not task.eof and time.monotonic() < deadline:
            chunk = task.proc.read()
            if chunk is None:
                time.sleep(0.02)
                continue
            if chunk == b"":
                self._end_output(task)
                break
            task.log.write(chunk)
            self._emit(task, task.splitter.feed(chunk, time.monotonic()))
        task.log.flush()

    def _describe_failure(self, task: _Task) -> Failure:
        status = task.status
        assert status is not None
        log = self.run_dir / "tasks" / task.spec.dir_name / "output.log"
        text = read_tail(log)
        message = status.describe()
        if status.ok:
            message = "exited with code 0 although ddlctl did not stop it"
        elif status.code == 42:
            message += " (preemption checkpoint written: restart the job to resume)"
        return Failure(reason="exited", message=message, task=task.spec.name, host=task.host,
                       status=status, traceback=tuple(last_traceback(text)),
                       tail=tuple(tail_lines(text)), log=str(log))

    def _write_error(self, task: _Task, failure: Failure) -> None:
        record = {
            "task": task.spec.name, "host": task.host,
            "exit_code": failure.status.code if failure.status else None,
            "signal": signal_name(failure.status.signal) if failure.status and failure.status.signal
            else None,
            "time": time.time(), "message": failure.message,
            "traceback": list(failure.traceback), "tail": list(failure.tail),
        }
        path = self.run_dir / "tasks" / task.spec.dir_name / "error.json"
        path.write_text(json.dumps(record, indent=1) + "\n")

    def _probe_ports(self, now: float) -> None:
        for task in self.tasks:
            if task.state is TaskState.STARTING and task.alive and now >= task.next_probe:
                task.next_probe = now + self.options.probe_interval_s
                transport = self.transports[task.spec.host.label]
                if task.spec.port and transport.port_open(task.spec.port):
                    task.state = TaskState.RUNNING
        if not self.all_ready_noted and self.tasks and all(
                t.state is not TaskState.STARTING for t in self.tasks):
            self.all_ready_noted = True
            if any(t.spec.port for t in self.tasks):
                waited = now - min(t.started for t in self.tasks)
                self.notify(f"cluster up: every task is listening ({waited:.1f}s after start)")

    def _check_startup_timeout(self, now: float) -> None:
        timeout = self.options.startup_timeout_s
        if not timeout or not self.tasks or now - min(t.started for t in self.tasks) < timeout:
            return
        missing = [t for t in self.tasks if t.state is TaskState.STARTING and t.alive]
        if not missing:
            return
        names = ", ".join(f"{t.spec.name} on {t.host} (port {t.spec.port})" for t in missing)
        self.failure = Failure(
            reason="startup-timeout",
            message=f"startup timeout: {len(missing)} task(s) never started listening within "
                    f"{timeout:g}s: {names}",
            missing=tuple(t.spec.name for t in missing))
        self.notify(self.failure.message)
        self._begin_stop()

    def _check_job_done(self) -> None:
        programs = [t for t in self.tasks if t.spec.kind == "program" and t.spec.role != "evaluator"]
        if programs and all(t.state is TaskState.SUCCEEDED for t in programs):
            if any(t.alive for t in self.tasks):
                self.notify("training finished: stopping the remaining tasks")
            self._begin_stop()

    # -- stopping ----------------------------------------------------------------------------

    def _begin_stop(self) -> None:
        if self.stopping_since is not None:
            return
        self.stopping_since = time.monotonic()
        for task in self.tasks:
            if task.alive:
                task.proc.send("TERM")

    def _escalate(self, now: float) -> None:
        assert self.stopping_since is not None
        if self.killed_at is None and now - self.stopping_since > self.options.grace_s + 1.0:
            self.killed_at = now
            for task in self.tasks:
                if task.alive:
                    task.proc.send("KILL")
        elif self.killed_at is not None and now - self.killed_at > 3.0:
            for task in self.tasks:
                if task.alive:
                    task.proc.force_kill()

    def _kill_now(self) -> None:
        for task in self.tasks:
            if task.alive:
                task.proc.send("KILL")
                task.proc.force_kill()

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signal_received is not None and signum == signal.SIGINT:
            self._kill_now()  # second Ctrl-C: no more grace
        self.signal_received = self.signal_received or signum

    def _install_signal_handlers(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread
                previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    # -- result ------------------------------------------------------------------------------

    def _result(self, wall: float) -> JobResult:
        order = {spec.name: i for i, spec in enumerate((*self.plan.tasks, *self.plan.agents))}

        def outcome(t: _Task) -> TaskOutcome:
            return TaskOutcome(name=t.spec.name, host=t.host, state=t.state, status=t.status,
                               started_s=t.started, ended_s=t.ended)

        ordered = sorted(self.tasks, key=lambda t: order[t.spec.name])
        outcomes = tuple(outcome(t) for t in ordered if not t.is_agent)
        agents = tuple(outcome(t) for t in ordered if t.is_agent)
        gaps = tuple(self.telemetry_gaps)
        failure = self.failure
        if failure is None:
            return JobResult(ok=True, exit_code=0, wall_time_s=wall, tasks=outcomes, agents=agents,
                             telemetry_gaps=gaps)
        if failure.reason == "interrupted" and self.signal_received is not None:
            code = 128 + self.signal_received
        elif failure.status is not None and not failure.status.ok:
            code = failure.status.shell_code
        else:
            code = 1
        return JobResult(ok=False, exit_code=code, wall_time_s=wall, tasks=outcomes,
                         failure=failure, agents=agents, telemetry_gaps=gaps)
