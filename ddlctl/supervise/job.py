"""What the supervisor knows of a running job: its options, its tasks and their hosts' sessions.

One :class:`Job` is shared by the supervision loop and its concerns (restarts, hosts, hangs,
results); each concern keeps its own state and reads or starts tasks through the job.

Task states: ``STARTING`` -> ``RUNNING`` (its port accepts connections, or it has none) ->
``SUCCEEDED`` | ``FAILED`` | ``STOPPED`` (ended because ddlctl stopped it); a restarted task goes
back to ``STARTING``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddlctl.console.output import LineSplitter
from ddlctl.contract.rundir import PIDS_FILE
from ddlctl.contract.runfolder import task_log, telemetry_file, write_whole
from ddlctl.diagnose.rootcause import read_tail
from ddlctl.diagnose.tfmessages import LiveReports
from ddlctl.planning.plan import Plan, TaskSpec
from ddlctl.supervise.tasklog import TaskLog
from ddlctl.transport.base import AgentSession, TaskProcess
from ddlctl.transport.status import ExitStatus


class TaskState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class JobPhase(enum.Enum):
    """Where the job is, one phase at a time; it only moves forward, as :data:`PHASE_MOVES` allows:

    * STARTING -> RUNNING: every task listens on its port (or has none): the hang watch is armed.
      Restarts happen within STARTING or RUNNING (``Restarts.under_way``); the phase stays.
    * STARTING or RUNNING -> STOPPING: training finished, a failure the policy does not restart,
      the startup timeout or ddlctl's first signal: TERM to every task. Never a restart after this.
    * STOPPING -> KILLING: the grace period passed, or ddlctl's second signal: KILL to every task
      (a task even that does not end is left, said, after ``UNKILLABLE_S``).
    * any -> ENDED: every task has ended and its output was read (the loop's last step).
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    KILLING = "killing"
    ENDED = "ended"


#: Each phase -> the phases it may move to.
PHASE_MOVES: dict[JobPhase, frozenset[JobPhase]] = {
    JobPhase.STARTING: frozenset({JobPhase.RUNNING, JobPhase.STOPPING, JobPhase.ENDED}),
    JobPhase.RUNNING: frozenset({JobPhase.STOPPING, JobPhase.ENDED}),
    JobPhase.STOPPING: frozenset({JobPhase.KILLING, JobPhase.ENDED}),
    JobPhase.KILLING: frozenset({JobPhase.ENDED}),
    JobPhase.ENDED: frozenset(),
}


@dataclass(frozen=True)
class SupervisorOptions:
    """How to supervise: timeouts in seconds (0 disables the startup timeout and the hang watch;
    ``hang_timeout_s`` None: each task's threshold adapts to its step intervals, see
    :mod:`~ddlctl.supervise.hangs.watch`)."""

    startup_timeout_s: float = 180.0
    grace_s: float = 5.0
    tick_s: float = 0.1
    probe_interval_s: float = 0.5
    drain_s: float = 2.0
    max_restarts: int = 0
    restart_on: str = "fault"
    hang_timeout_s: float | None = None
    host_timeout_s: float = 60.0
    restart_grace_s: float = 2.0
    silence_s: float = 15.0  # a host agent beats every 2 s: this long without a word = host lost
    backoff_base_s: float = 0.5  # waits 0.5, 1, 2, 4 ... s before successive restarts
    min_workers: int = 0  # --min-workers: go on without workers whose host is gone while this many remain
    rejoin_after_s: float = 10.0  # a host whose workers left is taken back after this long up (x2 per loss)


@dataclass
class SupervisedTask:
    """One task (or telemetry agent) as the supervisor tracks it."""

    spec: TaskSpec
    proc: TaskProcess
    log: TaskLog
    started: float
    splitter: LineSplitter = field(default_factory=LineSplitter)
    reports: LiveReports = field(default_factory=LiveReports)  # TensorFlow naming a hung peer in its output
    state: TaskState = TaskState.STARTING
    status: ExitStatus | None = None
    ended: float | None = None
    eof: bool = False
    next_probe: float = 0.0
    restarts: int = 0
    handled: bool = True  # its end needs no decision (set False while it runs)
    exit_as: ExitStatus | None = None  # ended by ddlctl, stuck in its exit: the exit its program made
    dump_asked: bool = False  # ddlctl asked for its stacks (a SIGUSR2 to its Python processes)
    startup_from: float | None = None  # the startup timeout counts from here (found at work before listening)

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


def log_file(run_dir: Path, spec: TaskSpec) -> Path:
    """Where a task's raw output goes: its output.log, or an agent's telemetry file."""
    if spec.kind == "agent":
        return telemetry_file(run_dir, spec.host.label)
    return task_log(run_dir, spec.dir_name)


@dataclass
class Job:
    """The job under supervision: shared by the loop and its concerns."""

    plan: Plan
    options: SupervisorOptions
    sessions: dict[str, AgentSession]
    notify: Callable[[str], None] = lambda _msg: None
    clock: Callable[[], float] = time.monotonic
    tasks: dict[str, SupervisedTask] = field(default_factory=dict)
    phase: JobPhase = JobPhase.STARTING
    entered: dict[JobPhase, float] = field(default_factory=dict)  # when (the clock's) each phase began
    pids: dict[str, object] = field(default_factory=dict)
    left: set[str] = field(default_factory=set)  # tasks that left the job (--min-workers)
    aliases: dict[str, str] = field(default_factory=dict)  # TensorFlow's task name -> ddlctl's, where they differ
    membership: list[dict] = field(default_factory=list)  # every change of the job's workers
    untraced: set[str] = field(default_factory=set)  # tasks started again with tracing off (a profiler crash)

    @property
    def run_dir(self) -> Path:
        return Path(self.plan.run_dir)

    @property
    def strategy(self) -> str:
        return self.plan.strategy

    @property
    def roles(self) -> dict[str, str]:
        """Every program and server task of the job -> its role (those that left it aside)."""
        return {t.name: t.role for t in self.plan.tasks if t.name not in self.left}

    def __post_init__(self) -> None:
        self.entered.setdefault(self.phase, self.clock())

    def phases(self) -> dict[str, float]:
        """Each phase entered -> seconds after the job began (``outcome.json``'s ``phases``)."""
        began = self.entered[JobPhase.STARTING]
        return {phase.value: round(at - began, 3) for phase, at in self.entered.items()}

    def enter(self, phase: JobPhase) -> bool:
        """Move to ``phase`` if :data:`PHASE_MOVES` allows it from the current one; whether it moved."""
        if phase not in PHASE_MOVES[self.phase]:
            return False
        self.phase = phase
        self.entered[phase] = self.clock()
        return True

    @property
    def stopping(self) -> bool:
        """Stopping began (TERM sent): never a restart after that."""
        return JobPhase.STOPPING in self.entered

    @property
    def stopping_since(self) -> float | None:
        return self.entered.get(JobPhase.STOPPING)

    def alive(self) -> set[str]:
        """Names of the training tasks still running (telemetry agents left out)."""
        return {t.name for t in self.tasks.values() if t.alive and not t.is_agent}

    def reached(self) -> dict[str, int]:
        """Task -> the highest step it reported so far."""
        return {name: figures[0] for session in self.sessions.values() for name, figures in session.progress().items()}

    def finished(self) -> dict[str, int | None]:
        """Tasks that ended on their own with exit code 0 -> the highest step each reported (None:
        none). A peer that waits for one of them, or fails naming it, was left by a task that
        ended early."""
        steps = self.reached()
        return {t.name: steps.get(t.name) for t in self.tasks.values()
                if not t.is_agent and not t.alive and t.state is TaskState.SUCCEEDED}

    def programs_succeeded(self) -> bool:
        """Every training program of the job (evaluators and workers that left aside) ended with
        exit code 0."""
        programs = [t for t in self.tasks.values() if t.spec.kind == "program" and t.spec.role != "evaluator"
                    and t.name not in self.left]
        return bool(programs) and all(t.state is TaskState.SUCCEEDED for t in programs)

    def own_name(self, tf_name: str) -> str:
        """ddlctl's name of the task TensorFlow calls ``tf_name`` (they differ once workers left)."""
        return self.aliases.get(tf_name, tf_name)

    def log_path(self, name: str) -> Path:
        return task_log(self.run_dir, self.plan.task(name).dir_name)

    def log_text(self, name: str) -> str:
        """The tail of task ``name``'s output: its log file's, and what a full disk kept from it
        (:class:`~ddlctl.supervise.tasklog.TaskLog`)."""
        task = self.tasks.get(name)
        return task.log.tail() if task is not None else read_tail(self.log_path(name))

    def launch(self, spec: TaskSpec, log: TaskLog, restarts: int = 0) -> SupervisedTask:
        """Start ``spec`` through its host's agent."""
        log.mark()
        proc = self.sessions[spec.host.label].start(spec, self.options.grace_s)
        task = SupervisedTask(spec=spec, proc=proc, log=log, started=self.clock(), restarts=restarts,
                              handled=False)
        if spec.port is None:
            task.state = TaskState.RUNNING
        return task

    def write_pids(self) -> None:
        """``pids.json``: where every task runs (``ddlctl stop`` reads it)."""
        for task in self.tasks.values():
            pids = task.proc.pids()
            if pids:
                self.pids[task.name] = {"host": task.host, "restarts": task.restarts, **pids}
        with contextlib.suppress(OSError):
            write_whole(self.run_dir / PIDS_FILE, json.dumps(self.pids, indent=1) + "\n")
