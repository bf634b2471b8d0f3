"""Ending a job: TERM to every task (the job's phase goes STOPPING), KILL once the grace period has
passed (KILLING: MWMS ignores SIGTERM; a stopped process takes only SIGKILL), and tasks even SIGKILL
cannot end (state D: the kernel holds them) left, said and recorded, so that ddlctl ends. And
ddlctl's own signals (SIGINT, SIGTERM, SIGHUP): the first stops the job (never a restart after it),
the second kills every task at once, the third exits at once (the host agents still kill every
task). SIGUSR1 is Slurm's word that the time limit is near (``submit --requeue``): the job stops
the same way, with ``$DDLCTL_SIGNAL_BEFORE`` less 30 s for its tasks to checkpoint on their
SIGTERM before the KILL (the built-in workload, PreemptionCheckpointHandler and BackupAndRestore
do; under ps the chief first, the servers once it has ended), and launch then requeues it
(:mod:`ddlctl.commands.attempts`)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

from ddlctl.contract import envvars
from ddlctl.contract.strategies import facts_of
from ddlctl.supervise.hangs.blame import Hangs
from ddlctl.supervise.job import Job, JobPhase, SupervisedTask
from ddlctl.supervise.policy import UNKILLABLE_S, unkillable
from ddlctl.supervise.results import Failure
from ddlctl.transport.status import ExitStatus, signal_name

#: After KILL, how long before a task still there is killed again, directly where its agent is gone.
KILL_AGAIN_S = 3.0


class Stopping:
    """The job's end, and ddlctl's signals (recorded by the handler, acted on in the loop)."""

    def __init__(self, job: Job, hangs: Hangs, hard_exit: Callable[[int], None]) -> None:
        self.job, self.hangs, self.hard_exit = job, hangs, hard_exit
        self.signals: list[int] = []
        self.killed_at: float | None = None  # when KILL went to every task (the second signal: again)
        self.killed_now = False
        self.left_running: list[dict] = []  # tasks SIGKILL could not end
        self.time_limit = False  # SIGUSR1: Slurm's time limit is near
        self.grace_s = job.options.grace_s
        self.later: list[SupervisedTask] = []  # tasks TERM goes to once the others have ended

    def begin(self, first: tuple[str, ...] = ()) -> None:
        """TERM to every task still running (once); with ``first``, to those tasks alone, and to
        the others once they have ended (a ps chief checkpoints through its servers)."""
        if not self.job.enter(JobPhase.STOPPING):
            return
        self.later = [t for t in self.job.tasks.values() if t.alive and first and t.name not in first]
        for task in self.job.tasks.values():
            if task.alive and task not in self.later:
                task.proc.send("TERM")

    def _term_later(self) -> None:
        """TERM to the tasks kept for later, once the first have ended."""
        if self.later and not any(t.alive for t in self.job.tasks.values() if t not in self.later):
            for task in self.later:
                if task.alive:
                    task.proc.send("TERM")
            self.later = []

    def escalate(self, now: float) -> None:
        """Past the grace period, KILL; later again, directly where a host agent is gone; past
        ``UNKILLABLE_S``, what is left is left."""
        assert self.job.stopping_since is not None
        self._term_later()
        alive = [t for t in self.job.tasks.values() if t.alive]
        if self.killed_at is None and now - self.job.stopping_since > self.grace_s + 1.0:
            self._kill_all(now)
        elif self.killed_at is not None and now - self.killed_at > UNKILLABLE_S:
            self._leave_unkillable(alive)
        elif self.killed_at is not None and now - self.killed_at > KILL_AGAIN_S:
            for task in alive:
                task.proc.force_kill()
                status = task.proc.poll()
                if status is not None and status.lost:  # its host is gone: nothing more will come
                    task.status = task.status or status
                    task.eof = True

    def _kill_all(self, now: float) -> None:
        self.job.enter(JobPhase.KILLING)
        self.killed_at = now
        for task in self.job.tasks.values():
            if task.alive:
                task.proc.send("KILL")

    def _leave_unkillable(self, tasks: list[SupervisedTask]) -> None:
        """Tasks SIGKILL has not ended: said, recorded and left (their host agents leave them too
        once ddlctl is gone)."""
        standings = self.hangs.where([t.name for t in tasks if not t.is_agent])
        for task in tasks:
            pid = task.proc.pids().get("task_pid", "?")
            where = standings[task.name].where if task.name in standings else "it did not die"
            self.job.notify(unkillable(task.name, task.host, pid, where))
            self.left_running.append({"task": task.name, "host": task.host, "pid": pid, "where": where})
            task.status, task.eof = task.status or ExitStatus(signal=signal.SIGKILL), True

    # -- ddlctl's signals --------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: object) -> None:
        """Only records the request (teardown runs in the loop); the third exits at once."""
        self.signals.append(signum)
        if len(self.signals) >= 3:
            self.hard_exit(128 + self.signals[0])

    def on_time_limit(self, _signum: int, _frame: object) -> None:
        """SIGUSR1: only recorded (acted on in the loop)."""
        self.time_limit = True

    def handle_signals(self) -> Failure | None:
        """Act on the signals received: the job's failure when the first one stopped it."""
        failure = None
        if self.time_limit and not self.job.stopping:
            before = os.environ.get(envvars.SIGNAL_BEFORE, "")
            self.grace_s = max(self.grace_s, float(before) - 30.0) if before.isdigit() else self.grace_s
            failure = Failure(reason="time-limit", exit_code=143, message="the time limit is near (Slurm's SIGUSR1): "
                              f"every task checkpoints and stops (SIGTERM; SIGKILL {self.grace_s:g}s later)")
            self.job.notify(failure.message)
            # (ps: the chief first, which checkpoints through the servers; then they stop)
            self.begin(("chief:0",) if facts_of(self.job.strategy).asynchronous else ())
        if not self.signals:
            return failure
        if not self.job.stopping:  # never a restart after this
            name = signal_name(self.signals[0])
            failure = Failure(reason="interrupted", message=f"interrupted by {name}")
            self.job.notify(f"{name}: stopping all tasks (again to kill them at once)")
            self.begin()
        if len(self.signals) >= 2 and not self.killed_now:
            self.killed_now = True
            self.job.notify("stopping now: SIGKILL to every task")
            self._kill_all(self.job.clock())
        return failure

    def install_handlers(self) -> dict[int, object]:
        """Handlers of SIGINT, SIGTERM and SIGHUP that record them; the previous ones."""
        previous: dict[int, object] = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            with contextlib.suppress(ValueError):  # not the main thread
                previous[signum] = signal.signal(signum, self.on_time_limit if signum == signal.SIGUSR1
                                                 else self.on_signal)
        return previous

    def restore_handlers(self, previous: dict[int, object]) -> None:
        """The previous handlers again; after an interrupted run, one more signal (while files are
        collected and the report written) exits at once, as the third would have."""
        for signum, handler in previous.items():
            if signum == signal.SIGUSR1:  # (kept: a late time-limit signal must not end the report)
                continue
            if self.signals:
                handler = lambda _signum, _frame: self.hard_exit(128 + self.signals[0])  # noqa: E731
            with contextlib.suppress(ValueError):
                signal.signal(signum, handler)  # type: ignore[arg-type]
