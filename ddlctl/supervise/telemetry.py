"""The telemetry agents under supervision (one per host): their lines are samples, given to the
hang watch's activity and to ``on_sample`` (a live view, the metrics); one that ends leaves a gap
in its host's telemetry, said and recorded, and the job goes on. One that ended with its host's
connection starts again once a task of the job runs on that host again (the host reconnected,
rejoined or grew back): the gap is then the time the host was away."""

from __future__ import annotations

import json
from collections.abc import Callable

from ddlctl.supervise.hangs.blame import Hangs
from ddlctl.supervise.job import Job, SupervisedTask, TaskState

#: What a sample of an unknown shape raises when it is read (passed over, said once per host).
BAD_SAMPLE = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError)


class TelemetryAgents:
    """Samples in, gaps said and recorded (``outcome.json``'s ``telemetry_gaps``), agents started
    again with their hosts."""

    def __init__(self, job: Job, hangs: Hangs, on_sample: Callable[[str, dict], None] | None) -> None:
        self.job, self.hangs, self.on_sample = job, hangs, on_sample
        self.gaps: list[str] = []
        self._gap_of: dict[str, int] = {}  # host -> its open gap's entry in gaps
        self.bad_samples: set[str] = set()  # hosts that sent telemetry of a shape nothing expects (said once)

    def lines(self, task: SupervisedTask, lines: list[bytes]) -> list[bytes]:
        """Take an agent's lines as samples; the lines that are not (to show)."""
        others = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                others.append(line)
                continue
            if not isinstance(record, dict):
                continue
            try:  # (a sample is data from a host: one of a shape nothing expects is passed over)
                self.hangs.activity.add(task.host, record, self.job.clock())
                if self.on_sample is not None:
                    self.on_sample(task.host, record)
            except BAD_SAMPLE as exc:
                if task.host not in self.bad_samples:
                    self.bad_samples.add(task.host)
                    self.job.notify(f"telemetry from {task.host}: a sample of a shape ddlctl does not know was "
                                    f"passed over ({type(exc).__name__}); later ones like it are passed over too")
        return others

    def ended(self, agent: SupervisedTask) -> None:
        """An agent ended while the job runs: a gap from here on (until its host is back)."""
        agent.state = TaskState.FAILED
        assert agent.status is not None
        gap = f"telemetry agent on {agent.host} stopped ({agent.status.describe()}): no telemetry from it after this"
        self._gap_of[agent.host] = len(self.gaps)
        self.gaps.append(gap)
        self.job.notify(gap)

    def tick(self, now: float) -> None:
        """Start again each agent whose host's connection ended it, once a task runs there again."""
        for agent in [t for t in self.job.tasks.values() if t.is_agent and t.eof and t.status and t.status.lost]:
            back = [t for t in self.job.tasks.values()
                    if t.host == agent.host and not t.is_agent and t.alive and t.started >= (agent.ended or now)]
            if not back:
                continue
            self.job.tasks[agent.name] = self.job.launch(agent.spec, agent.log, restarts=agent.restarts + 1)
            away = now - (agent.ended or now)
            self.job.notify(f"telemetry agent on {agent.host} started again with its host ({away:.0f}s without it)")
            if agent.host in self._gap_of:
                index = self._gap_of.pop(agent.host)
                self.gaps[index] = (f"telemetry agent on {agent.host} stopped ({agent.status.describe()}) and started "
                                    f"again with its host {away:.0f}s later")
