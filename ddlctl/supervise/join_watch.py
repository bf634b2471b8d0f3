"""Programs that train without joining the cluster ddlctl started for them.

Under MWMS every worker is the user's program, and it joins the cluster when it creates
``tf.distribute.MultiWorkerMirroredStrategy`` from ``TF_CONFIG``: its TensorFlow server then listens
on the worker's port from that moment to its end, well before its first step; under ps the chief
does so when it creates ``ParameterServerStrategy``. A program that creates another strategy
(``MirroredStrategy``, none at all) trains all the same, alone: every mwms worker "succeeds" with
a model of its own, a ps chief while its workers and ps tasks wait idle, and nothing failed to say so.
Its host agent sees that the task never listens on its port (it looks every 0.2 s); a worker that
takes steps and has not listened ``UNJOINED_S`` after its first one, or has ended without ever
listening (and without TensorFlow's "Started server" line, should the look have missed a short
life), has not joined: said once, kept in ``outcome.json`` (``unjoined``) and the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ddlctl.contract.strategies import facts_of
from ddlctl.contract.strategies import strategy as facts

if TYPE_CHECKING:  # (the report imports this module's words: nothing of the supervisor's at run time)
    from ddlctl.supervise.job import Job, SupervisedTask

#: Seconds after a worker's first step was seen without its port listening (the agent reports its
#: steps and its listening in separate frames, 0.2 s apart at most).
UNJOINED_S = 2.0
#: TensorFlow's line when a task's server starts (shown unless TF_CPP_MIN_LOG_LEVEL hides it).
SERVER_STARTED = "Started server with target:"


def alone(strategy: str, names: list[str]) -> str:
    """What ddlctl says of tasks ``names`` (mwms workers, a ps chief) that trained without joining
    the cluster."""
    which, one = ", ".join(sorted(names)), len(names) == 1
    own = facts(strategy).tf_class or "strategy"
    after = ("the workers and ps tasks waited idle" if facts(strategy).has_ps else
             "each worker trains alone, on its own copy of the model")
    return (f"{which} took steps without listening on {'its port' if one else 'their ports'} (TF_CONFIG): "
            f"{'its' if one else 'their'} program did not join the {strategy} cluster (it creates no "
            f"tf.distribute.{own}, or not from TF_CONFIG): {after}")


class JoinWatch:
    """Finds the workers of a job that train without joining its cluster (see the module)."""

    def __init__(self, job: Job, notify: Callable[[str], None]) -> None:
        self.job = job
        self.notify = notify
        self.role = facts_of(job.strategy).joining_role
        self.enabled = self.role is not None and sum(1 for t in job.plan.tasks if t.port) >= 2  # (a cluster)
        self.first_step: dict[str, float] = {}  # task -> when a step of it was first seen
        self.first_started: dict[str, float] = {}  # task -> the start of its first attempt
        self.unjoined: list[str] = []

    def _stepped(self) -> dict[str, int]:
        return {name: count for name, count in self.job.reached().items() if count >= 1}

    def _candidates(self) -> list[SupervisedTask]:
        """Joining tasks in their first attempt that have not listened (a later attempt reads the
        steps of earlier ones before it listens; a program that trains alone is found in its first)."""
        return [t for t in self.job.tasks.values() if t.spec.kind == "program" and t.spec.role == self.role
                and t.spec.port and not t.proc.listening and t.name not in self.unjoined
                and self.first_started.setdefault(t.name, t.started) == t.started]

    def tick(self, now: float) -> None:
        """Workers stepping for :data:`UNJOINED_S` without listening: said now."""
        if not self.enabled:
            return
        stepped = self._stepped()
        found = []
        for task in self._candidates():
            if task.name in stepped and task.alive:
                since = self.first_step.setdefault(task.name, now)
                if now - since >= UNJOINED_S:
                    found.append(task.name)
        self._say(found)

    def at_end(self) -> None:
        """Workers that stepped and ended without ever listening (nor TensorFlow saying its server
        started): said as the job ends."""
        if not self.enabled:
            return
        stepped = self._stepped()
        self._say([t.name for t in self._candidates() if t.name in stepped and not t.alive
                   and SERVER_STARTED not in self.job.log_text(t.name)])

    def _say(self, names: list[str]) -> None:
        if names:
            self.unjoined = sorted([*self.unjoined, *names])  # (found apart under load: kept in order)
            self.notify(alone(self.job.strategy, names))
