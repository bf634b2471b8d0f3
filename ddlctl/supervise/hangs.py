"""Hangs: noticing that training stopped, saving every task's stacks, and naming the culprit.

The watch itself (:class:`~.hangwatch.HangWatch`) counts step records; this module feeds it from
the host agents' reports, asks the agents for their tasks' processes and Python stacks when it
fires (saved in ``hang/<n>/<task>.txt``), and blames one task (:func:`hang_culprit`). What
happens to the culprit is the policy's decision, as for any fault.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path

from ddlctl.runfiles import HANG_DIR
from ddlctl.supervise.hangwatch import HangWatch
from ddlctl.supervise.job import Job
from ddlctl.supervise.policy import Fault, leader_of


def hang_culprit(replies: Mapping[str, dict | None], watch: HangWatch, roles: Mapping[str, str],
                 strategy: str) -> tuple[str, str]:
    """The task to blame for a hang, and why: a stopped process, else the first to stop stepping,
    else the coordination leader."""
    for name, reply in replies.items():
        states = {state for _pid, state, _cmd in (reply or {}).get("procs", [])}
        if states & {"T", "t"}:
            return name, "its process is stopped (state T)"
    stepping = [n for n in replies if n in watch.counts]
    if stepping:
        return watch.stalled_first(stepping)[0], "it stopped stepping first"
    servers = [n for n in replies if roles.get(n) == "worker"]
    leader = leader_of(strategy)
    return (leader if leader in replies else (servers or list(replies))[0]), "no task says more"


class Hangs:
    """The hang watch of one job and the stack dumps it takes."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.watch = HangWatch(job.options.hang_timeout_s)
        self.dumps = 0

    def feed(self, now: float) -> None:
        """Step counts as the host agents last reported them."""
        for session in self.job.sessions.values():
            for name, (count, _t) in session.step_counts().items():
                task = self.job.tasks.get(name)
                if task is not None and not task.is_agent:
                    self.watch.update(name, count, now)

    def check(self, now: float) -> Fault | None:
        """The hang fault once no task has stepped for the timeout (stacks saved first)."""
        if not self.watch.hung(now):
            return None
        names = [t.name for t in self.job.tasks.values() if t.alive and not t.is_agent]
        if not names:
            return None
        self.job.notify(f"no training step for {self.job.options.hang_timeout_s:g}s: the job is hung; "
                        "collecting every task's stacks")
        folder, replies = self.collect_stacks(names)
        culprit, why = hang_culprit(replies, self.watch, self.job.roles, self.job.strategy)
        self.watch.rearm(self.job.clock())
        return Fault(task=culprit, cause="hang", reporter=culprit, status=None,
                     detail=f"hung ({why}; stacks in {folder})")

    def collect_stacks(self, names: list[str]) -> tuple[Path, dict[str, dict | None]]:
        """Ask the host agents for the processes (and Python stacks) of ``names``; save them in
        ``hang/<n>/<task>.txt``. Waits a few seconds at most (the loop pauses meanwhile)."""
        job = self.job
        self.dumps += 1
        folder = job.run_dir / HANG_DIR / str(self.dumps)
        by_host: dict[str, list[str]] = {}
        for name in names:
            by_host.setdefault(job.tasks[name].host, []).append(name)
        for label, mine in by_host.items():
            job.sessions[label].request_dump(mine)
        deadline = time.monotonic() + 5.0
        for label, mine in by_host.items():
            session = job.sessions[label]
            session.wait_for(lambda s=session, m=mine: all(s.dump_of(n) is not None for n in m),
                             max(0.0, deadline - time.monotonic()))
        replies = {n: job.sessions[job.tasks[n].host].dump_of(n) for n in names}
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            for name, reply in replies.items():
                lines = [f"# {name} on {job.tasks[name].host}: processes (pid, state, command)"]
                for pid, state, cmd in (reply or {}).get("procs", []):
                    lines.append(f"{pid} {state} {cmd}")
                lines += ["", (reply or {}).get("stacks") or "(no Python stacks: not a registered Python "
                                                             "process, or it is stopped)"]
                (folder / f"{name.replace(':', '-')}.txt").write_text("\n".join(lines) + "\n")
        return folder, replies
