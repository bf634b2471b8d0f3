"""Hangs: noticing that a task stopped making progress, saving every task's stacks, and naming
the culprit.

The watch (:class:`~.hangwatch.HangWatch`) follows each training task's progress: its step
records, and under ps each worker's share of the chief's (the records say which worker ran each
block). When a task is past its threshold this module asks the host agents for every running
task's processes and Python stacks (saved in ``hang/<n>/<task>.txt``), reads where each one stood
(:mod:`~.stackread`) and blames one (:func:`hang_culprit`). What happens to the culprit is the
policy's decision, as for any fault.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlctl.contract.faults import Cause
from ddlctl.contract.rundir import HANG_DIR
from ddlctl.contract.strategies import strategy as strategy_facts
from ddlctl.diagnose.stack_dumps import Standing, stand
from ddlctl.supervise.hangs.activity import (
    ActivityWatch,
    CpuActivity,
    GpuActivity,
    busy_among_idle,
    idle_among_busy,
)
from ddlctl.supervise.hangs.preparing import PREPARING_MAX_S, Looks, interval_for, preparing_line
from ddlctl.supervise.hangs.watch import OPEN_PHASE_S, HangWatch, Overdue
from ddlctl.supervise.job import Job
from ddlctl.supervise.policy import Fault, ended_early, leader_of

#: How long the supervisor waits for the agents' dumps (an agent waits 1.5 s for the stacks).
DUMP_WAIT_S = 10.0


@dataclass(frozen=True)
class Finding:
    """What a look at the job found: a hung task's ``fault``, or tasks ``ended`` in their exit (task,
    seconds since its last progress): their program has ended, their process has not."""

    fault: Fault | None = None
    ended: tuple[tuple[str, float], ...] = ()


def hang_culprit(standings: Mapping[str, Standing], last_progress: Mapping[str, float],
                 leader: str, gpus: Mapping[str, GpuActivity | None] | None = None,
                 cpus: Mapping[str, CpuActivity | None] | None = None,
                 waited_for: Mapping[str, str] | None = None) -> tuple[str, str, str]:
    """(task to blame, why, why not the others) when the tasks of ``standings`` stopped.

    In order: a stopped process (state T); a process blocked in the kernel (state D: a dead network
    filesystem, a driver, a frozen cgroup); a task whose main thread is in its own code (a busy
    loop, a lock never released, a read nobody answers), or whose program has ended but waits for
    a thread that does not, while the others wait in a library; a task whose GPU sat idle while
    the others' GPUs ran kernels all along (``gpus``: what each task's GPUs did over the stall; the
    others wait for it in a collective, which spins on the GPU); a task whose process kept a CPU
    busy while the others' idled (``cpus``: each task's CPU over the stall; waiting for a peer
    costs no CPU; not where a task has GPU readings); a task the coordination service still waits
    for (``waited_for``: task -> why: it runs but never connected: it cannot reach the leader, or
    uses another TF_CONFIG); the first to stop making progress (``last_progress``); the
    coordination ``leader``. Ties go to the one that stopped first. What the culprit's GPUs did is
    said with the reason."""
    gpus, cpus, waited_for = gpus or {}, cpus or {}, waited_for or {}

    def first(names: list[str]) -> str:
        return sorted(names, key=lambda n: last_progress.get(n, float("-inf")))[0]

    stopped = [n for n, s in standings.items() if s.state == "stopped"]
    blocked = [n for n, s in standings.items() if s.state == "blocked"]
    in_user = [n for n, s in standings.items() if s.state in ("user", "joining")]
    idle = idle_among_busy({n: gpus.get(n) for n in standings})
    # (on GPUs a waiting rank's CPU spins too: NCCL's proxy thread; their GPUs say more)
    busy_cpu = [] if any(gpus.get(n) for n in standings) else busy_among_idle({n: cpus.get(n) for n in standings})
    said_gpu = False
    if stopped:
        culprit, why = first(stopped), "its process is stopped (state T)"
    elif blocked:
        culprit = first(blocked)
        why = standings[culprit].where
    elif in_user:
        culprit = first(in_user)
        why = (f"its main thread is in its own code at {standings[culprit].where}"
               if standings[culprit].state == "user" else standings[culprit].where)
    elif idle:
        culprit = first(idle)
        busy = sorted(n for n in standings if (a := gpus.get(n)) is not None and a.state == "busy")
        why = (f"{gpus[culprit].describe()}, while the GPUs of {', '.join(busy)} ran kernels all along: "  # type: ignore[union-attr]
               f"they wait for it in a collective; its main thread {standings[culprit].where}")
        said_gpu = True
    elif busy_cpu:
        culprit = busy_cpu[0]
        rest = max(a.cpu_mean for n, a in cpus.items() if n != culprit and n in standings and a is not None)
        why = (f"{cpus[culprit].describe()}, the others' at most {rest:.0f}%: it works or "  # type: ignore[union-attr]
               f"spins in native code and they wait for it; its main thread {standings[culprit].where}")
    elif [n for n in waited_for if n in standings]:
        culprit = first([n for n in waited_for if n in standings])
        why = waited_for[culprit]
    elif any(n in last_progress for n in standings):
        culprit = first([n for n in standings if n in last_progress])
        why = "it stopped making progress first" if len(standings) > 1 else "it stopped making progress"
    else:
        culprit = leader if leader in standings else next(iter(standings))
        why = "no task says more: the coordination leader is blamed"
    mine = gpus.get(culprit)
    if mine is not None and not said_gpu:
        why += f"; {mine.describe()}"
    # (a tf.data service task at fault: the trainers waiting in TensorFlow wait for their input)
    fed = culprit.split(":")[0] in ("data", "dispatcher")
    others = [f"{n} " + (f"waiting for input from the tf.data service, in {s.where.removeprefix('waiting in ')}"
                         if fed and n.split(":")[0] not in ("data", "dispatcher")
                         and s.where.startswith("waiting in TensorFlow") else s.where)
              + (f" ({a.where} {a.util_mean:.0f}% busy)" if (a := gpus.get(n)) is not None and a.readings else "")
              for n, s in standings.items() if n != culprit]
    return culprit, why, ("the others: " + "; ".join(others)) if others else ""


class Hangs:
    """The hang watch of one job, the stack dumps it takes and what they showed."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.watch = HangWatch(job.options.hang_timeout_s, job.options.startup_timeout_s)
        self.dumps = 0
        self.reports: list[dict] = []  # one per hang handled (outcome.json "hangs")
        self.said_joining: set[tuple[str, float]] = set()  # finished tasks said to wait for a thread
        self.activity = ActivityWatch()  # the telemetry agents' readings (the supervisor adds them)
        self.looks = Looks(self.dump)  # whether tasks before their first step are at work
        self.phase_looks = Looks(self.dump)  # whether tasks long in a declared phase are stuck there
        self.phase_next: dict[str, float] = {}  # a task found going on in its phase: looked at again then
        self.preparing: list[dict] = []  # one per time tasks were found at work (outcome.json "preparing")

    def feed(self, now: float) -> None:
        """Progress as the host agents last reported it: each task's step records and the lines
        of its phases file (phases, beats), and each ps worker's share of the chief's; the phase
        each task is in. A task past its declared last step is done stepping."""
        for session in self.job.sessions.values():
            counts = session.step_counts()
            progress = session.progress()
            credits = session.credits()
            activity = session.activity()
            for name, (count, _t) in counts.items():
                task = self.job.tasks.get(name)
                if task is None or task.is_agent:
                    continue
                busy, phase = activity.get(name, (0, None))
                self.watch.update(name, count + busy, now)  # (work outside the steps is progress too)
                self.watch.in_phase(name, phase)
                last, total = progress.get(name, (0, None))
                finished = total is not None and last >= total
                if finished:
                    self.watch.finish(name)
                for worker, done in credits.get(name, {}).items():
                    if worker in self.job.tasks and worker != name:
                        self.watch.update(worker, done, now)
                        if finished:
                            self.watch.finish(worker)

    def check(self, now: float) -> Finding | None:
        """The hang fault once a task is past its threshold (stacks saved first), or the overdue
        (or lingering finished) tasks whose program has ended."""
        job = self.job
        names = sorted(n for n in job.alive() if job.tasks[n].exit_as is None)
        overdue = self.watch.overdue(now, names) if names else None
        if overdue is None and names:
            overdue = self._stuck_in_phase(now, names)
        if overdue is None:
            soon = self.watch.overdue(now + self._look_interval(), names) if names else None
            starting = self._all_starting(soon, names) if soon is not None else []
            if starting:  # the first look, ahead of the threshold
                self.looks.look(self._fresh(starting, now), now, self._look_interval())
            else:
                self.looks.reset()
            lingering = self.watch.lingering(now, names) if names else []
            return self._look_at_lingering(now, lingering) if lingering else None
        if self._preparing(now, overdue, names):
            return None
        job.notify(f"hang: {overdue.describe()}; collecting every task's stacks")
        known = dict(self.watch.counts)
        folder, standings = self._stand(names)
        if self._ended_meanwhile(names) or self._progressed_meanwhile(names, known):
            return None
        exiting = [n for n in overdue.tasks or names if standings[n].state == "exiting"]
        if exiting:  # not hung in training: ended (the others still overdue are looked at next)
            for name in exiting:
                self.watch.finish(name)
                self._report(now, overdue, standings, name, standings[name].where, folder, "exit")
            return Finding(ended=tuple((n, now - self.watch.last_progress.get(n, now - overdue.idle_s))
                                       for n in exiting))
        left = self._left_by(standings)
        if left is not None:  # the others wait for a worker that will never come: it is the fault
            self._report(now, overdue, standings, left.task, left.detail, folder)
            self.watch.rearm(job.clock())
            return Finding(fault=dataclasses.replace(left, detail=f"{left.detail}; {overdue.describe()}; "
                                                                  f"stacks in {folder}"))
        gpus, cpus = self.gpu_activity(list(standings), now), self.cpu_activity(list(standings), now)
        culprit, why, others = hang_culprit(standings, self.watch.last_progress, leader_of(job.strategy), gpus, cpus,
                                            self._waited_for())
        self._report(now, overdue, standings, culprit, why, folder, activity=(gpus, cpus))
        self.watch.rearm(job.clock())
        detail = f"hung ({why}; {overdue.describe()}"
        detail += f"; {others}" if others else ""
        return Finding(fault=Fault(task=culprit, cause=Cause.HANG, reporter=culprit, status=None,
                                   detail=f"{detail}; stacks in {folder})"))

    def _preparing(self, now: float, overdue: Overdue, names: list[str]) -> bool:
        """Whether the overdue tasks have all yet to take a first step and one of them is at work
        (:mod:`~.preparing`: two looks a few seconds apart; True meanwhile): a task that prepares
        holds up the others, and nothing is hung yet. Said, and every clock starts again."""
        fresh = self._fresh(self._all_starting(overdue, names), now)
        found = self.looks.look(fresh, now, self._look_interval()) if fresh else {}
        if found is None:
            return True
        if not found:
            return False
        self.job.notify(preparing_line(found, "no first step", overdue.idle_s, overdue.threshold_s))
        self.preparing.append({"time": time.time(), "before": "first step", "waited_s": round(overdue.idle_s, 1),
                               "tasks": [work.record() for _, work in sorted(found.items())]})
        self.watch.rearm(now)
        return True

    def _stuck_in_phase(self, now: float, names: list[str]) -> Overdue | None:
        """Tasks in a declared phase past the threshold they would have outside it whose process is
        stopped, or blocked in the kernel without reading or writing, at two looks
        (:mod:`~.preparing`'s): hung now, not after the phase's half hour. One that goes on is
        looked at again after another such threshold."""
        held = [h for h in self.watch.held_in_phase(now, names) if now >= self.phase_next.get(h[0], 0.0)]
        if not held:
            self.phase_looks.reset()
            return None
        found = self.phase_looks.look([task for task, *_ in held], now)
        if found is None:
            return None
        standings = self.phase_looks.standings
        # (blocked but moving bytes: a large save to a slow disk waits in the kernel between writes)
        stuck = [h for h in held if h[0] not in found and (standings[h[0]].state == "stopped" or (
            standings[h[0]].state == "blocked" and self.phase_looks.idle[h[0]]))]
        for task, _phase, _idle, limit in held:
            self.phase_next[task] = now + limit
        if not stuck:
            return None
        task, phase, idle, limit = max(stuck, key=lambda h: h[2])
        return Overdue(tuple(h[0] for h in stuck), idle, limit,
                       f"in its {phase} phase, but {standings[task].where}: the phase's "
                       f"{OPEN_PHASE_S / 60:g} min are for work")

    def _look_interval(self) -> float:
        """Seconds between the two looks at tasks before their first step (the startup threshold's)."""
        return interval_for(self.watch.threshold(None)[0])

    def _all_starting(self, overdue: Overdue, names: list[str]) -> list[str]:
        """The tasks of ``names`` yet to take a first step, if every ``overdue`` task is one (else none)."""
        starting = [n for n in names if n not in self.watch.stepped]
        return starting if starting and all(n in starting for n in overdue.tasks) else []

    def _fresh(self, names: list[str], now: float) -> list[str]:
        """The tasks of ``names`` that may still be found at work (started under half an hour ago)."""
        return [n for n in names if now - self.job.tasks[n].started < PREPARING_MAX_S]

    def _waited_for(self) -> dict[str, str]:
        """Running tasks that a running task's coordination service still waits for (its last
        "Waiting for k/n tasks to connect" named them) -> why that blames them."""
        found: dict[str, str] = {}
        for task in self.job.tasks.values():
            if not (task.alive and task.reports.stragglers):
                continue
            words = task.reports.waiting_words()
            peers = ((task.spec.tf_config or {}).get("cluster") or {}).get(task.spec.role, [])  # (its own address)
            at = peers[task.spec.index] if task.spec.index < len(peers) else task.spec.host.name
            for tf_name in task.reports.stragglers:
                name = self.job.own_name(tf_name)
                if name in self.job.tasks and self.job.tasks[name].alive:
                    found.setdefault(name, f"{task.name}'s coordination service still waits for it to join the "
                                           f"cluster (\"{words}\"): it runs but never connected: can it reach "
                                           f"{task.name} at {at} (a firewall, a name that does not resolve there), "
                                           "and does it use the TF_CONFIG ddlctl wrote?")
        return found

    def _left_by(self, standings: Mapping[str, Standing]) -> Fault | None:
        """Under a strategy whose workers step together (mwms), the first worker that ended on its own
        (exit code 0) while the others, standing as ``standings`` says, cannot go on without it."""
        finished = self.job.finished() if strategy_facts(self.job.strategy).program_lockstep else {}
        if not finished:
            return None
        name = min(finished, key=lambda n: self.job.tasks[n].ended or 0.0)
        waiting = "; ".join(f"{n} {s.where}" for n, s in standings.items())
        return ended_early(name, next(iter(standings)), finished[name], f"the others wait for it ({waiting})",
                           self.job.strategy, joined=bool(finished[name]))

    def _look_at_lingering(self, now: float, lingering: list[str]) -> Finding | None:
        """Finished tasks that have not exited: ended if their program has; else looked at again later."""
        replies = self.dump(lingering)
        if self._ended_meanwhile(lingering):
            return None
        standings = {n: stand(n, replies.get(n)) for n in lingering}
        exiting = [n for n in lingering if standings[n].state == "exiting"]
        for name in lingering:
            if name not in exiting:
                self.watch.looked(name, now)
            key = (name, self.job.tasks[name].started)
            if standings[name].state == "joining" and key not in self.said_joining:
                self.said_joining.add(key)  # said once: it may be a thread that saves, or one that never ends
                idle = now - self.watch.last_progress[name]
                self.job.notify(f"{name} reached its last step {idle:.0f}s ago but its process has not exited: "
                                f"{standings[name].where}; ddlctl waits for it (Ctrl-C stops the job)")
        if not exiting:
            return None
        folder = self._save(replies)
        return Finding(ended=tuple((n, self._report_exit(now, standings[n], folder)) for n in exiting))

    def past_python(self, name: str, now: float) -> tuple[float, bool]:
        """``name`` died of a stack request's SIGUSR2 (it was past Python's shutdown): (the seconds
        since its last progress, or its start; whether it was stuck there). Stuck - and recorded so -
        only past its threshold: within it, its program had just ended and the request, for a look
        at the others or at the job, came while it exited as usual (a loaded host's step records
        reach ddlctl late: CI saw a worker's last steps arrive with the death)."""
        self.feed(now)  # (what its agent sent before answering the request: its last steps)
        started = self.job.tasks[name].started if name in self.job.tasks else now
        idle = now - self.watch.last_progress.get(name, started)
        if idle <= self.watch.threshold(name)[0]:
            return idle, False
        where = "past Python's shutdown (no handler for the stack request: native teardown)"
        return self._report_exit(now, Standing(name, "exiting", where), None), True

    def _report_exit(self, now: float, standing: Standing, folder: Path | None) -> float:
        """The ``hangs`` record of a finished task stuck in its exit; the seconds since its last step."""
        name = standing.task
        limit, rule = self.watch.threshold(name)
        idle = now - self.watch.last_progress.get(name, now)
        self._report(now, Overdue((name,), idle, limit, f"after its last step: {rule}"), {name: standing}, name,
                     standing.where, folder, "exit")
        return idle

    def where(self, names: list[str]) -> dict[str, Standing]:
        """Where each task of ``names`` stands now (its processes and stacks; nothing saved)."""
        replies = self.dump(names)
        return {n: stand(n, replies.get(n)) for n in names}

    def _progressed_meanwhile(self, names: list[str], known: Mapping[str, int]) -> bool:
        """Whether a task of ``names`` made progress that reached ddlctl while its stacks were taken
        (``known``: the watch's counts before): its step records came late (a host agent reports
        them each second, and before it answers a stack request; a loaded host is late), so the
        watch's view was stale, not the task. Said; the watch looks again as usual."""
        self.feed(self.job.clock())
        moved = [n for n in names if self.watch.counts.get(n, 0) > known.get(n, 0)]
        if moved:
            self.job.notify(f"{', '.join(moved)}: progress recorded before the stacks were taken reached ddlctl "
                            f"meanwhile (a loaded host reports late): not hung")
        return bool(moved)

    def _ended_meanwhile(self, names: list[str]) -> bool:
        """Whether a task of ``names`` ended while its stacks were taken: its exit decides, not
        the dump (a process past Python's shutdown dies of the stack request's SIGUSR2)."""
        return any(self.job.tasks[n].proc.poll() is not None for n in names)

    def named(self, fault: Fault, now: float) -> Fault:
        """A hung task that a peer's TensorFlow named (``fault``): every running task's stacks are
        saved first, as for a hang the watch found, and the hang is recorded."""
        folder, standings = self._stand(sorted(self.job.alive()))
        idle = now - self.watch.last_progress.get(fault.task, now)
        self._report(now, Overdue((fault.task,), idle, 0.0, f"named by {fault.reporter}'s TensorFlow"), standings,
                     fault.task, fault.detail, folder)
        return dataclasses.replace(fault, detail=f"{fault.detail}; stacks in {folder}")

    def _stand(self, names: list[str]) -> tuple[Path, dict[str, Standing]]:
        """Every task's stacks saved, and where each one stood."""
        replies = self.dump(names)
        return self._save(replies), {n: stand(n, replies.get(n)) for n in names}

    def cpu_activity(self, names: list[str], now: float) -> dict[str, CpuActivity | None]:
        """What each task's processes did on the CPU since its last progress (None: no telemetry)."""
        return {n: self.activity.cpu(n, self.watch.last_progress.get(n, now), now) for n in names}

    def gpu_activity(self, names: list[str], now: float) -> dict[str, GpuActivity | None]:
        """What each task's GPUs did since its last progress (None: no GPU, or no GPU telemetry)."""
        found: dict[str, GpuActivity | None] = {}
        for name in names:
            task = self.job.tasks[name]
            since = self.watch.last_progress.get(name, now)
            found[name] = self.activity.gpu(task.host, task.spec.gpus, since, now, name)
        return found

    def _report(self, now: float, overdue: Overdue, standings: Mapping[str, Standing], culprit: str,
                why: str, folder: Path | None, kind: str = "hang",
                activity: tuple[Mapping[str, GpuActivity | None], Mapping[str, CpuActivity | None]] | None = None,
                ) -> None:
        """One ``hangs`` record (``kind``: "hang", or "exit" for a task stuck in its exit;
        ``activity``: what each task's GPUs and CPU did, when the caller already read it)."""
        progress = {n: p for s in self.job.sessions.values() for n, p in s.progress().items()}
        gpus, cpus = activity or (self.gpu_activity(list(standings), now), self.cpu_activity(list(standings), now))
        self.reports.append({
            "time": time.time(), "kind": kind, "culprit": culprit, "why": why,
            "threshold_s": round(overdue.threshold_s, 1),
            "rule": overdue.rule, "idle_s": round(overdue.idle_s, 1), "stacks": folder and str(folder),
            "tasks": [{"task": n, "state": s.state, "where": s.where,
                       "last_step": progress[n][0] if n in progress else None,
                       "idle_s": round(now - self.watch.last_progress[n], 1) if n in self.watch.last_progress
                       else None, "gpu": (a := gpus.get(n)) and a.record(),
                       "cpu": (c := cpus.get(n)) and c.record()} for n, s in standings.items()]})

    def dump(self, names: list[str]) -> dict[str, dict | None]:
        """Ask the host agents for the processes (and Python stacks, CPU and I/O counters; nothing
        saved) of ``names``. Waits
        :data:`DUMP_WAIT_S` at most (the loop pauses meanwhile)."""
        job = self.job
        by_host: dict[str, list[str]] = {}
        for name in names:
            by_host.setdefault(job.tasks[name].host, []).append(name)
            job.tasks[name].dump_asked = True
        for label, mine in by_host.items():
            job.sessions[label].request_dump(mine)
        deadline = time.monotonic() + DUMP_WAIT_S
        for label, mine in by_host.items():
            session = job.sessions[label]
            session.wait_for(lambda s=session, m=mine: all(s.dump_of(n) is not None for n in m),
                             max(0.0, deadline - time.monotonic()))
        return {n: job.sessions[job.tasks[n].host].dump_of(n) for n in names}

    def _save(self, replies: Mapping[str, dict | None]) -> Path:
        """The dumps in ``hang/<n>/<task>.txt`` (n: this job's n-th saved dump)."""
        job = self.job
        self.dumps += 1
        folder = job.run_dir / HANG_DIR / str(self.dumps)
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            for name, reply in replies.items():
                lines = [f"# {name} on {job.tasks[name].host}: processes (pid, state, command)"]
                for pid, state, cmd in (reply or {}).get("procs", []):
                    lines.append(f"{pid} {state} {cmd}")
                lines += ["", (reply or {}).get("stacks") or "(no Python stacks: not a registered Python "
                                                             "process, or it is stopped)"]
                (folder / f"{name.replace(':', '-')}.txt").write_text("\n".join(lines) + "\n")
        return folder
