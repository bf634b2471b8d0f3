"""Restarting tasks: stop them, wait out the backoff, re-check ports, share the checkpoint, start.

One restart is under way at a time; a fault that comes meanwhile joins it (its tasks added, the
wider scope kept: ``policy.wider_scope``). Its tasks get TERM, then KILL after the restart grace
(MWMS ignores SIGTERM; a stopped task takes only SIGKILL). Once they have all ended and the
backoff has passed, their hosts must be there (a lost host is reconnected first, see
:mod:`~.hosts`), their ports are re-checked (a port taken meanwhile gets a fresh one and
TF_CONFIG is rewritten for the whole group), worker 0's checkpoint is made available on every host
of a group restart, and the tasks start again with ``DDLCTL_RESTART_COUNT`` counted up.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ddlctl.contract.envvars import CHECKPOINT_DIR, RESTART_COUNT, TRACE_STEPS
from ddlctl.contract.faults import Action, Cause, Scope
from ddlctl.contract.rundir import TASK_CHECKPOINT_COPY
from ddlctl.contract.strategies import facts_of
from ddlctl.planning.plan import TaskSpec, profiler_ports, regroup, reprofile, retarget
from ddlctl.supervise.hosts import HostGone, HostWatch
from ddlctl.supervise.job import Job, TaskState
from ddlctl.supervise.policy import (
    UNKILLABLE_S,
    Decision,
    Fault,
    backoff_s,
    checkpoint_unshared,
    grow_back,
    host_gone,
    port_retry,
    profiler_crash,
    shrink,
    unkillable,
    wider_scope,
)
from ddlctl.supervise.recovery.checkpoints import promote_copy, sync_folder

#: Restart causes not counted against --max-restarts: a port taken before binding, a planned grow,
#: a crash of TensorFlow's profiler in a task it captured.
UNCOUNTED = frozenset({Cause.PORT_IN_USE, Cause.GROW, Cause.PROFILER_CRASH})


@dataclass
class Restart:
    """A restart under way: its tasks are being stopped, then started again after a backoff."""

    tasks: list[str]
    scope: str
    event: dict
    not_before: float
    stop_sent: float
    killed: bool = False


@dataclass(frozen=True)
class RestartFailed:
    """A restart that cannot happen: the job fails (``fault``: the task to blame, if any)."""

    decision: Decision
    fault: Fault | None = None


class Restarts:
    """The restarts of one job: the one under way, and the record of all (``outcome.json``)."""

    def __init__(self, job: Job, hosts: HostWatch) -> None:
        self.job = job
        self.hosts = hosts
        self.current: Restart | None = None
        self.events: list[dict] = []
        self.port_retries = 0

    @property
    def under_way(self) -> bool:
        return self.current is not None

    def used(self) -> int:
        """Restarts counted against --max-restarts (port retries and planned grows are not)."""
        return sum(1 for e in self.events if e.get("cause") not in UNCOUNTED)

    def begin(self, decision: Decision, event: dict) -> None:
        """Stop ``decision.tasks`` to start them again (or add them to the restart under way)."""
        now = self.job.clock()
        current = self.current
        if current is not None:  # one restart takes in every fault until it is done
            current.tasks.extend(n for n in decision.tasks if n not in current.tasks)
            current.scope = wider_scope(current.scope, decision.scope)
        else:
            self.events.append(event)
            wait = 0.0 if event.get("cause") == "grow" else backoff_s(len(self.events), self.job.options.backoff_base_s)
            self.current = Restart(tasks=list(decision.tasks), scope=decision.scope, event=event,
                                   not_before=now + wait, stop_sent=now)
        for name in decision.tasks:
            task = self.job.tasks[name]
            task.handled = True
            if task.alive:
                task.proc.send("TERM")

    def retry_ports(self, name: str, profiler: int | None = None) -> bool:
        """``name`` could not bind its port (``profiler``: its profiler's, that one): new ports for the
        cluster spec, started again (bounded; not counted as a restart). False once the retries are spent."""
        task = self.job.tasks[name]
        members = tuple(n for n, t in self.job.tasks.items() if t.spec.port)
        decision = port_retry(self.job.strategy, name, task.host, profiler or task.spec.port or 0, members,
                              self.port_retries, "its profiler's port" if profiler else "port")
        if decision is None:
            return False
        self.port_retries += 1
        task.state = TaskState.STOPPED
        event = {"time": time.time(), "task": name, "host": task.host, "cause": Cause.PORT_IN_USE,
                 "reporter": name, "exit_code": task.status.code if task.status else None, "signal": None,
                 "detail": f"{'profiler port' if profiler else 'port'} {profiler or task.spec.port} taken before "
                           "it could bind", "action": Action.RESTART,
                 "scope": decision.scope, "tasks": list(members)}
        self.job.notify(decision.message)
        self.begin(decision, event)
        return True

    def retry_untraced(self, name: str) -> bool:
        """``name`` crashed while TensorFlow's profiler captured it: the tasks its loss restarts start
        again once with tracing off (not counted: :func:`~.policy.profiler_crash`); False when that
        is not what happened (an ordinary fault then)."""
        job, task = self.job, self.job.tasks[name]
        assert task.status is not None
        decision = profiler_crash(job.strategy, name, task.host, task.status, job.roles, job.alive(), job.untraced)
        if decision is None:
            return False
        job.untraced.update(decision.tasks)
        task.state = TaskState.FAILED
        event = {"time": time.time(), "task": name, "host": task.host, "cause": Cause.PROFILER_CRASH,
                 "reporter": name, "exit_code": None, "signal": task.status.signal,
                 "detail": f"{task.status.describe()} while its profiler captured {task.status.profiling}",
                 "action": Action.RESTART, "scope": decision.scope, "tasks": list(decision.tasks)}
        job.notify(decision.message)
        self.begin(decision, event)
        return True

    def advance(self, now: float) -> RestartFailed | None:
        """Move the restart under way on: escalate its stop, then start its tasks when all is ready."""
        restart = self.current
        if restart is None:
            return None
        job = self.job
        tasks = [job.tasks[n] for n in restart.tasks]
        waiting = [t for t in tasks if t.alive]
        grace = job.options.restart_grace_s
        if waiting:
            if not restart.killed and now - restart.stop_sent > grace:
                restart.killed = True  # MWMS ignores SIGTERM; a stopped task takes only SIGKILL
                for task in waiting:
                    task.proc.send("KILL")
            elif restart.killed and now - restart.stop_sent > grace + UNKILLABLE_S:
                stuck = waiting[0]
                message = unkillable(stuck.name, stuck.host, stuck.proc.pids().get("task_pid", "?"),
                                     "it cannot be restarted while it lives")
                return RestartFailed(Decision(Action.FAIL, message=message))
            elif restart.killed and now - restart.stop_sent > grace + 5:
                for task in waiting:
                    task.proc.force_kill()
            return None
        if now < restart.not_before:
            return None
        for label in sorted({t.host for t in tasks}):
            ready = self.hosts.ready(label, now)
            if isinstance(ready, HostGone):
                if not self._leave(restart, ready):
                    return self._host_gone(restart, ready)
            elif not ready:
                return None
        hosts = {job.tasks[n].host for n in restart.tasks}
        if self.hosts.settling(hosts, now) or job.stopping:
            return None
        if not restart.tasks:  # (ps) the only task to restart left the job with its host
            self.current = None
            return None
        specs = self._specs(restart)
        if restart.scope == Scope.GROUP:
            unshared = self._share_checkpoint(specs)
            if unshared is not None:
                self.current = None
                return unshared
        for spec in specs:
            task = job.tasks[spec.name]
            job.tasks[spec.name] = job.launch(spec, task.log, restarts=task.restarts + 1)
        job.write_pids()
        restart.event["restarted_at"] = time.time()
        counted = {Cause.PORT_IN_USE: "", Cause.GROW: " (planned: no restart counted)",
                   Cause.PROFILER_CRASH: " (tracing off; no restart counted)"}.get(
            restart.event.get("cause", ""), f" (restart {self.used()} of {job.options.max_restarts})")
        job.notify(f"started {', '.join(restart.tasks)} again{counted}")
        self.current = None
        return None

    def listening(self, name: str) -> None:
        """A restarted server counts as back once it listens (the recovery time in the report)."""
        for event in self.events:
            if name in event.get("tasks", ()) and "restarted_at" in event:
                event.setdefault("listening_at", time.time())

    def grow(self, returning: list[str], label: str) -> None:
        """Take back the workers of a host that left the job and answers again (a planned restart:
        :func:`~.policy.grow_back`)."""
        job = self.job
        job.left.difference_update(returning)
        decision = grow_back(job.strategy, returning, label, job.roles)
        self._regroup()
        job.membership.append({"time": time.time(), "workers": self._workers(), "joined": list(returning),
                               "host": label, "why": f"host {label} is back", "cause": Cause.GROW})
        event = {"time": time.time(), "task": returning[0], "host": label, "cause": Cause.GROW,
                 "reporter": returning[0], "exit_code": None, "signal": None, "detail": f"host {label} answers again",
                 "action": Action.RESTART,
                 "scope": decision.scope, "tasks": list(decision.tasks), "joined": list(returning)}
        job.notify(decision.message)
        self.begin(decision, event)

    def _workers(self) -> list[str]:
        return [n for n, role in self.job.roles.items() if role == "worker"]

    def _regroup(self) -> None:
        """mwms: every worker of the job gets a cluster spec of the job's workers as they are now."""
        job = self.job
        if not facts_of(job.strategy).group_restart:
            return
        workers = self._workers()
        for spec in regroup([job.tasks[n].spec for n in workers], workers):
            job.tasks[spec.name].spec = spec
        job.aliases = {f"worker:{i}": n for i, n in enumerate(workers) if f"worker:{i}" != n}

    def _leave(self, restart: Restart, gone: HostGone) -> bool:
        """``--min-workers``: the restart's tasks on a host that will not be back leave the job if
        the policy lets it go on without them (False: it does not). Under mwms the workers that
        remain are regrouped into a cluster spec of just them."""
        job = self.job
        leaving = [n for n in restart.tasks if job.tasks[n].host == gone.label]
        why = (f"host {gone.label} cannot come back: {gone.why}" if gone.gone else
               f"host {gone.label} did not come back within --host-timeout {job.options.host_timeout_s:g}s")
        decision = shrink(job.strategy, leaving, restart.tasks, job.roles, job.options.min_workers, why)
        if decision is None:
            return False
        job.notify(decision.message)
        job.left.update(leaving)
        restart.tasks = list(decision.tasks)
        self._regroup()
        change = {"time": time.time(), "workers": self._workers(), "left": leaving, "host": gone.label, "why": why,
                  "cause": Cause.HOST_LOST}
        job.membership.append(change)
        restart.event.setdefault("left", []).extend(leaving)
        return True

    def _host_gone(self, restart: Restart, gone: HostGone) -> RestartFailed:
        self.current = None
        name = next((n for n in restart.tasks if self.job.tasks[n].host == gone.label), gone.label)
        fault, decision = host_gone(name, gone.label, gone.why, gone.gone, self.job.options.host_timeout_s)
        restart.event["action"] = Action.FAIL
        return RestartFailed(decision, fault)

    def _share_checkpoint(self, specs: list[TaskSpec]) -> RestartFailed | None:
        """Before a group restart: every host of the group must see worker 0's checkpoint folder
        (copied to hosts that do not share it)."""
        leader = next((s for s in specs if s.role == "worker" and s.index == 0), None)
        if leader is None:
            return None
        sessions = self.job.sessions
        source_dir = leader.env.get(CHECKPOINT_DIR, "")
        if leader.name != "worker:0":  # worker:0 left the job: the new leader's own copy may be newer
            try:
                promote_copy(sessions[leader.host.label], f"{leader.task_dir}/{TASK_CHECKPOINT_COPY}", source_dir)
            except OSError as exc:
                return RestartFailed(checkpoint_unshared(leader.host.label, source_dir, leader.host.label, str(exc)))
        done: set[tuple[str, str]] = set()
        for spec in specs:
            target_dir = spec.env.get(CHECKPOINT_DIR, "")
            key = (spec.host.label, target_dir)
            if spec.host.label == leader.host.label and target_dir == source_dir or key in done:
                continue
            done.add(key)
            try:
                files, size = sync_folder(sessions[leader.host.label], source_dir, sessions[spec.host.label],
                                          target_dir)
            except OSError as exc:
                decision = checkpoint_unshared(leader.host.label, source_dir, spec.host.label, str(exc))
                return RestartFailed(decision)
            if files:
                self.job.notify(f"copied worker:0's checkpoint to {spec.host.label} ({files} file(s), "
                                f"{size / 2**20:.1f} MiB): it does not share {leader.host.label}'s file system")
        return None

    def _specs(self, restart: Restart) -> list[TaskSpec]:
        """The restarted tasks' specs: ports re-checked (a port taken meanwhile gets a fresh one and
        TF_CONFIG is rewritten for the whole group), the restart count counted up."""
        job = self.job
        specs = {n: job.tasks[n].spec for n in restart.tasks}
        ports = {n: s.port for n, s in specs.items() if s.port}
        if restart.scope in (Scope.GROUP, Scope.ALL) and ports:
            by_host: dict[str, dict[str, int]] = {}
            for name, port in ports.items():
                by_host.setdefault(specs[name].host.label, {})[name] = port  # type: ignore[assignment]
                by_host[specs[name].host.label].update(profiler_ports(specs[name]))  # (--trace: ps servers)
            changed: dict[str, int] = {}
            for label, wanted in by_host.items():
                got = job.sessions[label].check_ports(wanted)
                changed.update({n: p for n, p in got.items() if p != wanted.get(n)})
            if changed:
                restart.event["new_ports"] = changed
                job.notify("port(s) taken meanwhile, new ones chosen: "
                           + ", ".join(f"{n} -> {p}" for n, p in changed.items()))
                everyone = {f"{s.role}:{s.index}": (changed.get(n) or s.port) for n, s in specs.items() if s.port}
                specs = {n: reprofile(retarget(s, everyone), changed) for n, s in specs.items()}
                for name, spec in specs.items():
                    job.tasks[name].spec = spec
        def env(name: str, spec: TaskSpec) -> dict[str, str]:  # (tracing off after a profiler crash)
            kept = {k: v for k, v in spec.env.items() if k != TRACE_STEPS or name not in job.untraced}
            return {**kept, RESTART_COUNT: str(job.tasks[name].restarts + 1)}

        return [dataclasses.replace(s, env=env(n, s)) for n, s in specs.items()]
