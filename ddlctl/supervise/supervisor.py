"""The supervisor: one loop owns every process of a job, through one host agent per host.

Each tick it reads what the host agents sent (task output, exits, step counts), writes output as
whole prefixed lines (and raw into ``output.log``), probes the ports of tasks not yet listening,
and decides:

* every program task (except an evaluator) succeeded -> stop the rest (ps servers, evaluator);
* a task ended (or a host's connection was lost, or the job hung) -> a :class:`~.policy.Fault`
  naming the task at fault (``policy.classify``), then ``policy.decide``: restart that task, its
  group or everything (after a backoff, ports re-checked), go on degraded, or fail: stop all;
* the startup timeout passed with tasks not listening -> fail, naming them;
* SIGINT / SIGTERM / SIGHUP to ddlctl -> stop everything and never restart (a second Ctrl-C
  kills at once; a third exits at once, and the host agents still kill every task).

Telemetry agents (one per host) are supervised the same way, but their output goes to
``telemetry/<host>.jsonl`` (each sample also to ``on_sample`` for a live view), and an agent that
dies only leaves a gap in the telemetry: the job goes on.

Stopping is TERM to every task's process group, then KILL after the grace period (MWMS ignores
SIGTERM; a stopped process takes only SIGKILL). The loop returns only when every task has ended.

Task states: ``STARTING`` -> ``RUNNING`` (its port accepts connections, or it has none) ->
``SUCCEEDED`` | ``FAILED`` | ``STOPPED`` (ended because ddlctl stopped it); a restarted task goes
back to ``STARTING``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ddlctl.errors import HostGoneError, LaunchError
from ddlctl.planning.plan import Plan, TaskSpec, retarget
from ddlctl.supervise.checkpoints import sync_folder
from ddlctl.supervise.hangwatch import HangWatch
from ddlctl.supervise.output import LineSplitter, PrefixedWriter
from ddlctl.supervise.policy import Decision, Fault, backoff_s, classify, decide, leader_of
from ddlctl.supervise.rootcause import last_traceback, read_tail, tail_lines
from ddlctl.supervise.tfmessages import port_taken
from ddlctl.transport.base import ExitStatus, TaskProcess, signal_name
from ddlctl.transport.session import HostSession


class TaskState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SupervisorOptions:
    """How to supervise: timeouts in seconds (0 disables the startup timeout and the hang watch)."""

    startup_timeout_s: float = 180.0
    grace_s: float = 5.0
    tick_s: float = 0.1
    probe_interval_s: float = 0.5
    drain_s: float = 2.0
    max_restarts: int = 0
    restart_on: str = "fault"
    hang_timeout_s: float = 600.0
    host_timeout_s: float = 60.0
    restart_grace_s: float = 2.0
    silence_s: float = 15.0  # a host agent beats every 2 s: this long without a word = host lost
    backoff_base_s: float = 0.5  # waits 0.5, 1, 2, 4 ... s before successive restarts


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
    restarts: int = 0
    handled: bool = True  # its end needs no decision (set False while it runs)

    @property
    def alive(self) -> bool:
        return self.status is None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def host(self) -> str:
        return self.spec.host.label

    @property
    def is_agent(self) -> bool:
        return self.spec.kind == "agent"


@dataclass
class _Restart:
    """A restart under way: its tasks are being stopped, then started again after a backoff."""

    tasks: list[str]
    scope: str
    event: dict
    not_before: float
    stop_sent: float
    killed: bool = False


def telemetry_file(run_dir: Path, host_label: str) -> Path:
    """``telemetry/<host>.jsonl`` for a host label (``/`` cannot appear in a file name)."""
    return run_dir / "telemetry" / f"{host_label.replace('/', '_')}.jsonl"


def log_file(run_dir: Path, spec: TaskSpec) -> Path:
    """Where a task's raw output goes: its output.log, or an agent's telemetry file."""
    if spec.kind == "agent":
        return telemetry_file(run_dir, spec.host.label)
    return run_dir / "tasks" / spec.dir_name / "output.log"


Reconnect = Callable[[str], HostSession]
MAX_PORT_RETRIES = 3
SCOPES = ("", "task", "group", "all")  # a merged restart takes the widest


class Supervisor:
    """Starts the plan's tasks through their hosts' agents and supervises them to the end."""

    def __init__(self, plan: Plan, sessions: Mapping[str, HostSession], writer: PrefixedWriter,
                 options: SupervisorOptions, notify: Callable[[str], None] = lambda _msg: None,
                 on_sample: Callable[[str, dict], None] | None = None,
                 reconnect: Reconnect | None = None,
                 on_progress: Callable[[dict[str, tuple[int, int | None]]], None] | None = None) -> None:
        self.plan = plan
        self.on_sample = on_sample
        self.on_progress = on_progress  # (task -> (highest step, declared total)) as the agents report it
        self.telemetry_gaps: list[str] = []
        self.sessions: dict[str, HostSession] = dict(sessions)
        self.writer = writer
        self.options = options
        self.notify = notify
        self.reconnect = reconnect
        self.run_dir = Path(plan.run_dir)
        self.tasks: dict[str, _Task] = {}
        self.failure: Failure | None = None
        self.stopping_since: float | None = None
        self.killed_at: float | None = None
        self.signals: list[int] = []
        self.killed_now = False
        self.all_ready_noted = False
        self.started_noted = False
        self.selector = selectors.DefaultSelector()
        self.roles = {t.name: t.role for t in plan.tasks}
        self.hang = HangWatch(options.hang_timeout_s)
        self.hang_dumps = 0
        self.port_retries = 0
        self.restart: _Restart | None = None
        self.restarts: list[dict] = []
        self.degraded: list[dict] = []
        self.hosts_lost: list[dict] = []
        self.reconnecting: dict[str, tuple[threading.Thread, list]] = {}
        self.lost_since: dict[str, float] = {}  # hosts lost and not back yet
        self.lost_mono: dict[str, float] = {}  # when each host was last lost
        self.pids: dict[str, object] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> JobResult:
        """Start every task, supervise until all have ended, return the result."""
        started = time.monotonic()
        previous = self._install_signal_handlers()
        try:
            for session in self.sessions.values():
                self.selector.register(session.fileno(), selectors.EVENT_READ, session)
            self._start_all()
            while self._active():
                self._tick()
        finally:
            self._restore_signal_handlers(previous)
            for task in self.tasks.values():
                if task.alive:  # only on an exception inside the loop: never leave them running
                    task.proc.force_kill()
                with contextlib.suppress(OSError):
                    task.log.close()
            self.selector.close()
        return self._result(time.monotonic() - started)

    def _active(self) -> bool:
        if any(t.alive or not t.eof for t in self.tasks.values()):
            return True
        return self.restart is not None and self.stopping_since is None

    def _start_all(self) -> None:
        # Agents first (telemetry covers the whole run), then servers so programs find them sooner.
        order = [*self.plan.agents, *sorted(self.plan.tasks, key=lambda t: t.kind != "server")]
        for spec in order:
            log_path = log_file(self.run_dir, spec)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")  # noqa: SIM115 - closed in run()
            self.tasks[spec.name] = self._launch(spec, log)
        self._write_pids()

    def _launch(self, spec: TaskSpec, log: BinaryIO, restarts: int = 0) -> _Task:
        proc = self.sessions[spec.host.label].start(spec, self.options.grace_s)
        task = _Task(spec=spec, proc=proc, log=log, started=time.monotonic(), restarts=restarts,
                     handled=False)
        if spec.port is None:
            task.state = TaskState.RUNNING
        return task

    def _write_pids(self) -> None:
        for task in self.tasks.values():
            pids = task.proc.pids()
            if pids:
                self.pids[task.name] = {"host": task.host, "restarts": task.restarts, **pids}
        with contextlib.suppress(OSError):
            (self.run_dir / "pids.json").write_text(json.dumps(self.pids, indent=1) + "\n")

    # -- one tick ----------------------------------------------------------------------------

    def _tick(self) -> None:
        for key, _ in self.selector.select(self.options.tick_s):
            key.data.pump()
        now = time.monotonic()
        for task in self.tasks.values():
            self._read(task, now)
            if not task.is_agent:
                self.writer.write(task.name, task.host, task.splitter.flush_stale(now))
        self._note_pids()
        self._handle_signals()
        self._watch_sessions(now)
        self._poll_exits(now)
        if self.on_progress is not None:
            self.on_progress({name: figures for session in self.sessions.values()
                              for name, figures in session.progress.items()})
        if self.stopping_since is None:
            self._feed_hang_watch(now)
            self._probe_ports(now)
            self._check_startup_timeout(now)
            self._check_hang(now)
            self._advance_restart(now)
            self._check_job_done()
        else:
            self._escalate(now)

    def _note_pids(self) -> None:
        """``pids.json`` again whenever an agent reported new pids; "started" once all have."""
        changed = [s for s in self.sessions.values() if s.pids_changed]
        if not changed:
            return
        for session in changed:
            session.pids_changed = False
        self._write_pids()
        if not self.started_noted and all(t.proc.pids() or not t.alive for t in self.tasks.values()):
            self.started_noted = True  # every host agent has reported its tasks' pids
            self.notify(f"started {len(self.plan.tasks)} task(s) on {len(self.plan.hosts)} host(s)")

    def _read(self, task: _Task, now: float) -> None:
        while True:
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
            self.writer.write(task.name, task.host, lines)
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
        self.writer.write(task.name, task.host, others)

    def _end_output(self, task: _Task) -> None:
        if task.eof:
            return
        task.eof = True
        self._emit(task, task.splitter.flush())

    def _poll_exits(self, now: float) -> None:
        ended = []
        for task in self.tasks.values():
            if task.alive:
                status = task.proc.poll()
                if status is not None:
                    task.status, task.ended = status, now
                    self._read(task, now)  # the agent sent its last output before the exit
                    ended.append(task)
        # In the order the agents saw them end: the first to go is the likeliest cause.
        for task in sorted(ended, key=lambda t: getattr(t.proc, "ended_t", None) or 0.0):
            self._on_exit(task)

    def _on_exit(self, task: _Task) -> None:
        status = task.status
        assert status is not None
        if self.stopping_since is not None or task.handled:
            task.state = TaskState.SUCCEEDED if status.ok else TaskState.STOPPED
            return
        task.handled = True
        if task.is_agent:  # telemetry has a gap from here on; training goes on
            task.state = TaskState.FAILED
            gap = f"telemetry agent on {task.host} stopped ({status.describe()}): no telemetry from it after this"
            self.telemetry_gaps.append(gap)
            self.notify(gap)
            return
        if status.ok and task.spec.kind == "program":
            task.state = TaskState.SUCCEEDED
            return
        text = read_tail(self._log_path(task.name))
        if task.spec.port and port_taken(text) and self.port_retries < MAX_PORT_RETRIES:
            self._retry_ports(task)
            return
        task.state = TaskState.FAILED
        alive = {t.name for t in self.tasks.values() if t.alive and not t.is_agent}
        fault = classify(task.name, status, text, self.plan.strategy, alive, set(self.roles))
        session = self.sessions.get(task.host)
        if fault.cause == "host-lost" and session is not None and session.lost:  # say why the host went
            fault = dataclasses.replace(fault, detail=f"{fault.detail} ({session.lost})")
        if fault.cause == "hang" and fault.task in alive:  # its peers name it: keep its stacks first
            folder, _ = self._collect_stacks(sorted(alive))
            fault = dataclasses.replace(fault, detail=f"{fault.detail}; stacks in {folder}")
        self._on_fault(fault)

    def _log_path(self, name: str) -> Path:
        return self.run_dir / "tasks" / self.plan.task(name).dir_name / "output.log"

    # -- faults and what follows -------------------------------------------------------------

    def _on_fault(self, fault: Fault) -> None:
        alive = {t.name for t in self.tasks.values() if t.alive and not t.is_agent}
        if self.restart is not None:  # a restart is under way: this fault joins it (no extra budget)
            decision = decide(self.plan.strategy, fault, self.roles, alive, 0, 1, "any")
        else:
            decision = decide(self.plan.strategy, fault, self.roles, alive, self._restarts_used(),
                              self.options.max_restarts, self.options.restart_on)
        culprit = self.tasks.get(fault.task)
        event = {"time": time.time(), "task": fault.task, "host": culprit.host if culprit else None,
                 "cause": fault.cause, "reporter": fault.reporter,
                 "exit_code": fault.status.code if fault.status else None,
                 "signal": signal_name(fault.status.signal) if fault.status and fault.status.signal else None,
                 "detail": fault.detail, "action": decision.action, "scope": decision.scope,
                 "tasks": list(decision.tasks)}
        if decision.action == "fail":
            self.notify(f"{fault.task} on {event['host']} failed: {decision.message}: stopping the other tasks")
            self._fail(fault, decision)
        elif decision.action == "continue":
            self.notify(decision.message)
            if culprit is not None and culprit.alive:  # a hung task: its work moves to the others
                culprit.handled = True
                culprit.proc.send("KILL")
            if decision.degraded:
                self.degraded.append({**event, "since": time.time()})
        else:
            self.notify(decision.message)
            self._begin_restart(decision, event)

    def _retry_ports(self, task: _Task) -> None:
        """A port taken between planning and binding: new ports for the whole cluster spec (every
        task's TF_CONFIG names them), started again. Bounded; not counted as a restart."""
        self.port_retries += 1
        task.state = TaskState.STOPPED
        members = tuple(n for n, t in self.tasks.items() if t.spec.port)
        scope = "group" if self.plan.strategy == "mwms" else "all"
        message = (f"{task.name} on {task.host}: port {task.spec.port} was taken before it could bind: choosing new "
                   f"ports and starting the {scope} again (try {self.port_retries} of {MAX_PORT_RETRIES})")
        event = {"time": time.time(), "task": task.name, "host": task.host, "cause": "port-in-use",
                 "reporter": task.name, "exit_code": task.status.code if task.status else None, "signal": None,
                 "detail": f"port {task.spec.port} taken before it could bind", "action": "restart",
                 "scope": scope, "tasks": list(members)}
        self.notify(message)
        self._begin_restart(Decision("restart", members, scope, message), event)

    def _restarts_used(self) -> int:
        """Restarts counted against --max-restarts (port retries are not)."""
        return sum(1 for e in self.restarts if e.get("cause") != "port-in-use")

    def _fail(self, fault: Fault, decision: Decision) -> None:
        self.failure = self._describe_failure(fault, decision.message)
        with contextlib.suppress(OSError, KeyError):
            self._write_error(fault, self.failure)
        self._begin_stop()

    def _begin_restart(self, decision: Decision, event: dict) -> None:
        now = time.monotonic()
        if self.restart is not None:  # one restart takes in every fault until it is done
            for name in decision.tasks:
                if name not in self.restart.tasks:
                    self.restart.tasks.append(name)
            if SCOPES.index(decision.scope) > SCOPES.index(self.restart.scope):
                self.restart.scope = decision.scope
            self._stop_for_restart(decision.tasks)
            return
        self.restarts.append(event)
        self.restart = _Restart(tasks=list(decision.tasks), scope=decision.scope, event=event,
                                not_before=now + backoff_s(len(self.restarts), self.options.backoff_base_s),
                                stop_sent=now)
        self._stop_for_restart(decision.tasks)

    def _stop_for_restart(self, names: tuple[str, ...] | list[str]) -> None:
        for name in names:
            task = self.tasks[name]
            task.handled = True
            if task.alive:
                task.proc.send("TERM")

    def _advance_restart(self, now: float) -> None:
        restart = self.restart
        if restart is None:
            return
        tasks = [self.tasks[n] for n in restart.tasks]
        waiting = [t for t in tasks if t.alive]
        if waiting:
            if not restart.killed and now - restart.stop_sent > self.options.restart_grace_s:
                restart.killed = True  # MWMS ignores SIGTERM; a stopped task takes only SIGKILL
                for task in waiting:
                    task.proc.send("KILL")
            elif restart.killed and now - restart.stop_sent > self.options.restart_grace_s + 5:
                for task in waiting:
                    task.proc.force_kill()
            return
        if now < restart.not_before:
            return
        hosts = {t.host for t in tasks}
        for label in hosts:
            if not self._session_ready(label, now):
                return
        # A dropped host's old agent kills its tasks within the grace period: let their ports go.
        if any(now < self.lost_mono.get(label, float("-inf")) + self.options.grace_s + 1.0 for label in hosts):
            return
        if self.stopping_since is not None:
            return
        specs = self._restart_specs(restart)
        if restart.scope == "group" and not self._share_checkpoint(specs):
            self.restart = None
            return
        for spec in specs:
            task = self.tasks[spec.name]
            self._end_output(task)
            new = self._launch(spec, task.log, restarts=task.restarts + 1)
            self.tasks[spec.name] = new
        self._write_pids()
        restart.event["restarted_at"] = time.time()
        counted = "" if restart.event.get("cause") == "port-in-use" else \
            f" (restart {self._restarts_used()} of {self.options.max_restarts})"
        self.notify(f"started {', '.join(restart.tasks)} again{counted}")
        self.restart = None
        self.hang.rearm(now)

    def _share_checkpoint(self, specs: list[TaskSpec]) -> bool:
        """Before a group restart: every host of the group must see worker 0's checkpoint folder
        (copied to hosts that do not share it). False (and the job failing) when it cannot be."""
        leader = next((s for s in specs if s.name == "worker:0"), None)
        if leader is None:
            return True
        source_dir = leader.env.get("DDLCTL_CHECKPOINT_DIR", "")
        done: set[tuple[str, str]] = set()
        for spec in specs:
            target_dir = spec.env.get("DDLCTL_CHECKPOINT_DIR", "")
            key = (spec.host.label, target_dir)
            if spec.host.label == leader.host.label and target_dir == source_dir or key in done:
                continue
            done.add(key)
            try:
                files, size = sync_folder(self.sessions[leader.host.label], source_dir,
                                          self.sessions[spec.host.label], target_dir)
            except OSError as exc:
                message = (f"cannot make worker:0's checkpoint ({leader.host.label}:{source_dir}) available on "
                           f"{spec.host.label} for the group restart: {exc}")
                self.notify(message)
                self.failure = Failure(reason="start-failed", message=message, exit_code=1)
                self._begin_stop()
                return False
            if files:
                self.notify(f"copied worker:0's checkpoint to {spec.host.label} ({files} file(s), "
                            f"{size / 2**20:.1f} MiB): it does not share {leader.host.label}'s file system")
        return True

    def _restart_specs(self, restart: _Restart) -> list[TaskSpec]:
        """The restarted tasks' specs: ports re-checked (a port taken meanwhile gets a fresh one and
        TF_CONFIG is rewritten for the whole group), ``DDLCTL_RESTART_COUNT`` counted up."""
        specs = {n: self.tasks[n].spec for n in restart.tasks}
        ports = {n: s.port for n, s in specs.items() if s.port}
        if restart.scope in ("group", "all") and ports:
            by_host: dict[str, dict[str, int]] = {}
            for name, port in ports.items():
                by_host.setdefault(specs[name].host.label, {})[name] = port  # type: ignore[assignment]
            changed: dict[str, int] = {}
            for label, wanted in by_host.items():
                got = self.sessions[label].check_ports(wanted)
                changed.update({n: p for n, p in got.items() if p != wanted.get(n)})
            if changed:
                restart.event["new_ports"] = changed
                self.notify("port(s) taken meanwhile, new ones chosen: "
                            + ", ".join(f"{n} -> {p}" for n, p in changed.items()))
                everyone = {n: (changed.get(n) or s.port) for n, s in specs.items() if s.port}
                specs = {n: retarget(s, everyone) for n, s in specs.items()}
                for name, spec in specs.items():
                    self.tasks[name].spec = spec
        return [dataclasses.replace(s, env={**s.env, "DDLCTL_RESTART_COUNT": str(self.tasks[n].restarts + 1)})
                for n, s in specs.items()]

    # -- hosts -------------------------------------------------------------------------------

    def _watch_sessions(self, now: float) -> None:
        for session in self.sessions.values():
            session.check_silence(self.options.silence_s, now)
        for label, session in self.sessions.items():
            if session.lost and label not in self.lost_since:
                self.lost_since[label] = now
                self.lost_mono[label] = now
                self.hosts_lost.append({"host": label, "time": session.lost_at, "reason": session.lost})
                self.notify(f"connection to {label} lost ({session.lost}): its tasks are gone")
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(session.fileno())

    def _session_ready(self, label: str, now: float) -> bool:
        """Whether the host's agent is there; starts (and waits for) a reconnection if it was lost."""
        session = self.sessions[label]
        if not session.lost:
            return True
        if self.reconnect is None:
            self._host_gone(label, "no way to reconnect")
            return False
        pending = self.reconnecting.get(label)
        if pending is None:
            box: list = []
            thread = threading.Thread(target=self._reconnect_loop, args=(label, box), daemon=True)
            self.reconnecting[label] = (thread, box)
            thread.start()
            self.notify(f"reconnecting to {label} (up to {self.options.host_timeout_s:g}s)")
            return False
        thread, box = pending
        if thread.is_alive():
            return False
        del self.reconnecting[label]
        result = box[0] if box else LaunchError("reconnection gave nothing")
        if isinstance(result, HostSession):
            self.sessions[label] = result
            self.selector.register(result.fileno(), selectors.EVENT_READ, result)
            self.lost_since.pop(label, None)
            self.notify(f"reconnected to {label}")
            return True
        self._host_gone(label, getattr(result, "message", str(result)), isinstance(result, HostGoneError))
        return False

    def _reconnect_loop(self, label: str, box: list) -> None:
        deadline = time.monotonic() + self.options.host_timeout_s
        delay = 0.5
        last: Exception | None = None
        while time.monotonic() < deadline and self.stopping_since is None:
            try:
                box.append(self.reconnect(label))  # type: ignore[misc]
                return
            except HostGoneError as exc:  # it cannot come back (its Slurm job ended): stop now
                box.append(exc)
                return
            except Exception as exc:  # noqa: BLE001 - any failure: try again until the deadline
                last = exc
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)
        box.append(last or LaunchError("gave up"))

    def _host_gone(self, label: str, why: str, gone: bool = False) -> None:
        restart = self.restart
        self.restart = None
        event = restart.event if restart else {}
        name = next((n for n in (restart.tasks if restart else []) if self.tasks[n].host == label), label)
        message = (f"host {label} cannot come back: {why}" if gone else
                   f"host {label} did not come back within --host-timeout {self.options.host_timeout_s:g}s ({why})")
        fault = Fault(task=name, cause="host-lost", reporter=name, status=ExitStatus(lost=True), detail=message)
        event["action"] = "fail"
        self._fail(fault, Decision("fail", message=message))

    # -- hangs -------------------------------------------------------------------------------

    def _feed_hang_watch(self, now: float) -> None:
        for session in self.sessions.values():
            for name, (count, _t) in session.steps.items():
                task = self.tasks.get(name)
                if task is not None and not task.is_agent:
                    self.hang.update(name, count, now)

    def _check_hang(self, now: float) -> None:
        if self.restart is not None or not self.hang.hung(now):
            return
        names = [t.name for t in self.tasks.values() if t.alive and not t.is_agent]
        if not names:
            return
        self.notify(f"no training step for {self.options.hang_timeout_s:g}s: the job is hung; "
                    "collecting every task's stacks")
        folder, replies = self._collect_stacks(names)
        culprit, why = self._hang_culprit(replies)
        self.hang.rearm(time.monotonic())
        self._on_fault(Fault(task=culprit, cause="hang", reporter=culprit, status=None,
                             detail=f"hung ({why}; stacks in {folder})"))

    def _collect_stacks(self, names: list[str]) -> tuple[Path, dict[str, dict | None]]:
        """Ask the host agents for the processes (and Python stacks) of ``names``; save them in
        ``hang/<n>/<task>.txt``. Waits a few seconds at most (the loop pauses meanwhile)."""
        self.hang_dumps += 1
        folder = self.run_dir / "hang" / str(self.hang_dumps)
        by_host: dict[str, list[str]] = {}
        for name in names:
            by_host.setdefault(self.tasks[name].host, []).append(name)
        for label, mine in by_host.items():
            self.sessions[label].request_dump(mine)
        deadline = time.monotonic() + 5.0
        for label, mine in by_host.items():
            session = self.sessions[label]
            session.wait_for(lambda s=session, m=mine: all(n in s.dumps for n in m),
                             max(0.0, deadline - time.monotonic()))
        replies = {n: self.sessions[self.tasks[n].host].dumps.get(n) for n in names}
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            for name, reply in replies.items():
                lines = [f"# {name} on {self.tasks[name].host}: processes (pid, state, command)"]
                for pid, state, cmd in (reply or {}).get("procs", []):
                    lines.append(f"{pid} {state} {cmd}")
                lines += ["", (reply or {}).get("stacks") or "(no Python stacks: not a registered Python "
                                                             "process, or it is stopped)"]
                (folder / f"{name.replace(':', '-')}.txt").write_text("\n".join(lines) + "\n")
        return folder, replies

    def _hang_culprit(self, replies: Mapping[str, dict | None]) -> tuple[str, str]:
        """The task to blame for a hang: a stopped process, else the first to stop stepping,
        else the coordination leader."""
        for name, reply in replies.items():
            states = {state for _pid, state, _cmd in (reply or {}).get("procs", [])}
            if states & {"T", "t"}:
                return name, "its process is stopped (state T)"
        stepping = [n for n in replies if n in self.hang.counts]
        if stepping:
            first = self.hang.stalled_first(stepping)[0]
            return first, "it stopped stepping first"
        servers = [n for n in replies if self.roles.get(n) == "worker"]
        leader = leader_of(self.plan.strategy)
        return (leader if leader in replies else (servers or list(replies))[0]), "no task says more"

    # -- failure records ---------------------------------------------------------------------

    def _describe_failure(self, fault: Fault, message: str) -> Failure:
        task = self.tasks.get(fault.task)
        log = self._log_path(fault.task) if fault.task in self.roles else None
        text = read_tail(log) if log else ""
        reporter_text = read_tail(self._log_path(fault.reporter)) if fault.reporter != fault.task \
            and fault.reporter in self.roles else ""
        traceback = last_traceback(text) or last_traceback(reporter_text)
        if fault.cause == "host-lost":  # the program did not fail: its output says nothing about why
            text = reporter_text = ""
            traceback = []
        reason = {"hang": "hang", "host-lost": "host-lost"}.get(fault.cause, "exited")
        return Failure(reason=reason, message=message, task=fault.task, host=task.host if task else None,
                       status=fault.status, traceback=tuple(traceback),
                       tail=tuple(tail_lines(text or reporter_text)), log=str(log) if log else None,
                       exit_code=fault.exit_code)

    def _write_error(self, fault: Fault, failure: Failure) -> None:
        record = {
            "task": fault.task, "host": failure.host, "cause": fault.cause, "reporter": fault.reporter,
            "exit_code": failure.status.code if failure.status else None,
            "signal": signal_name(failure.status.signal) if failure.status and failure.status.signal
            else None,
            "time": time.time(), "message": failure.message,
            "traceback": list(failure.traceback), "tail": list(failure.tail),
        }
        path = self.run_dir / "tasks" / self.plan.task(fault.task).dir_name / "error.json"
        path.write_text(json.dumps(record, indent=1) + "\n")

    # -- startup -----------------------------------------------------------------------------

    def _probe_ports(self, now: float) -> None:
        for task in self.tasks.values():
            if task.state is TaskState.STARTING and task.alive and now >= task.next_probe:
                task.next_probe = now + self.options.probe_interval_s
                if task.spec.port and getattr(task.proc, "listening", False):
                    task.state = TaskState.RUNNING
                    for event in self.restarts:  # a restarted server counts as back once it listens
                        if task.name in event.get("tasks", ()) and "restarted_at" in event:
                            event.setdefault("listening_at", time.time())
        if not self.all_ready_noted and self.tasks and all(
                t.state is not TaskState.STARTING for t in self.tasks.values()):
            self.all_ready_noted = True
            self.hang.arm(now)  # a job that never steps at all is hung too
            if any(t.spec.port for t in self.tasks.values()):
                waited = now - min(t.started for t in self.tasks.values())
                self.notify(f"cluster up: every task is listening ({waited:.1f}s after start)")

    def _check_startup_timeout(self, now: float) -> None:
        timeout = self.options.startup_timeout_s
        if not timeout or not self.tasks:
            return
        missing = [t for t in self.tasks.values()
                   if t.state is TaskState.STARTING and t.alive and now - t.started >= timeout]
        if not missing:
            return
        names = ", ".join(f"{t.name} on {t.host} (port {t.spec.port})" for t in missing)
        self.failure = Failure(
            reason="startup-timeout",
            message=f"startup timeout: {len(missing)} task(s) never started listening within "
                    f"{timeout:g}s: {names}",
            missing=tuple(t.name for t in missing))
        self.notify(self.failure.message)
        self._begin_stop()

    def _check_job_done(self) -> None:
        programs = [t for t in self.tasks.values() if t.spec.kind == "program" and t.spec.role != "evaluator"]
        if self.restart is None and programs and all(t.state is TaskState.SUCCEEDED for t in programs):
            if any(t.alive for t in self.tasks.values()):
                self.notify("training finished: stopping the remaining tasks")
            self._begin_stop()

    # -- stopping ----------------------------------------------------------------------------

    def _begin_stop(self) -> None:
        if self.stopping_since is not None:
            return
        self.stopping_since = time.monotonic()
        for task in self.tasks.values():
            if task.alive:
                task.proc.send("TERM")

    def _escalate(self, now: float) -> None:
        assert self.stopping_since is not None
        if self.killed_at is None and now - self.stopping_since > self.options.grace_s + 1.0:
            self.killed_at = now
            for task in self.tasks.values():
                if task.alive:
                    task.proc.send("KILL")
        elif self.killed_at is not None and now - self.killed_at > 3.0:
            for task in self.tasks.values():
                if task.alive:
                    task.proc.force_kill()
                    if getattr(task.proc, "session", None) is not None and task.proc.session.lost:  # type: ignore[attr-defined]
                        task.status = task.status or ExitStatus(lost=True)
                        task.eof = True

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        """Only records the request (teardown runs in the loop); the third exits at once."""
        self.signals.append(signum)
        if len(self.signals) >= 3:
            os._exit(128 + self.signals[0])  # the host agents see their input end and kill every task

    def _handle_signals(self) -> None:
        if not self.signals:
            return
        if self.stopping_since is None:  # never a restart after this
            name = signal_name(self.signals[0])
            self.failure = Failure(reason="interrupted", message=f"interrupted by {name}")
            self.notify(f"{name}: stopping all tasks (again to kill them at once)")
            self._begin_stop()
        if len(self.signals) >= 2 and not self.killed_now:
            self.killed_now = True
            self.notify("stopping now: SIGKILL to every task")
            for task in self.tasks.values():
                if task.alive:
                    task.proc.send("KILL")
            self.killed_at = time.monotonic()

    def _install_signal_handlers(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread
                previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, object]) -> None:
        """The previous handlers again; after an interrupted run, one more signal (while files are
        collected and the report written) exits at once, as the third would have."""
        for signum, handler in previous.items():
            if self.signals:
                handler = lambda _signum, _frame: os._exit(128 + self.signals[0])  # noqa: E731
            with contextlib.suppress(ValueError):
                signal.signal(signum, handler)  # type: ignore[arg-type]

    # -- result ------------------------------------------------------------------------------

    def _result(self, wall: float) -> JobResult:
        order = {spec.name: i for i, spec in enumerate((*self.plan.tasks, *self.plan.agents))}

        def outcome(t: _Task) -> TaskOutcome:
            return TaskOutcome(name=t.name, host=t.host, state=t.state, status=t.status,
                               started_s=t.started, ended_s=t.ended, restarts=t.restarts)

        ordered = sorted(self.tasks.values(), key=lambda t: order[t.name])
        outcomes = tuple(outcome(t) for t in ordered if not t.is_agent)
        agents = tuple(outcome(t) for t in ordered if t.is_agent)
        extra = {"telemetry_gaps": tuple(self.telemetry_gaps), "restarts": tuple(self.restarts),
                 "degraded": tuple(self.degraded), "hosts_lost": tuple(self.hosts_lost)}
        failure = self.failure
        if failure is None:
            return JobResult(ok=True, exit_code=0, wall_time_s=wall, tasks=outcomes, agents=agents, **extra)
        if failure.reason == "interrupted" and self.signals:
            code = 128 + self.signals[0]
        elif failure.exit_code is not None:
            code = failure.exit_code
        else:
            code = 1
        return JobResult(ok=False, exit_code=code, wall_time_s=wall, tasks=outcomes,
                         failure=failure, agents=agents, **extra)
