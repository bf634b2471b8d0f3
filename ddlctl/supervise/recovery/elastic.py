"""Growing back (``--min-workers``): a host whose workers left the job is probed until it answers,
then its workers are taken back at the job's next checkpoint.

After workers left the job with their host (a shrink: ``Restarts._leave``), one reconnection to
that host is tried now and then (every 2 s for its first 30 s away: a host that comes back soon
is taken back soon; then 4, 8 ... at most 60 s apart), in a thread. A host
that answers must stay up for a quiet period (``--rejoin-after``, doubled for every loss of that
host before: one that flaps is not taken back at every beat); then, under mwms, the job must write
a checkpoint (the ``checkpoint`` state file in the leader's ``DDLCTL_CHECKPOINT_DIR`` changes, or
the one a level down where Keras's ``BackupAndRestore`` keeps it) so the group restarts from where
it is, losing no steps; under ps the workers start again at once and rejoin the chief. Either
way it is a planned restart: no restart of ``--max-restarts`` is used.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ddlctl.contract.envvars import CHECKPOINT_DIR
from ddlctl.contract.strategies import facts_of
from ddlctl.supervise.hosts import HostWatch
from ddlctl.supervise.job import Job
from ddlctl.supervise.recovery.checkpoints import newest_state
from ddlctl.supervise.recovery.restarts import Restarts

#: Seconds between tries to reach a host whose workers left: the first (and every one while the
#: host has been away under ``PROBE_STEADY_S``), and the most.
PROBE_FIRST_S, PROBE_STEADY_S, PROBE_MAX_S = 2.0, 30.0, 60.0
#: Seconds between looks at the leader's checkpoint state while a returned host waits for one.
CHECKPOINT_POLL_S = 1.0


@dataclass
class Returning:
    """What is known of one host whose workers left the job."""

    label: str
    away_since: float = 0.0  # when it was lost (the last time)
    losses: int = 1  # times this host was lost
    next_try: float = 0.0
    delay: float = PROBE_FIRST_S
    probe: tuple[threading.Thread, list] | None = None
    back_since: float | None = None  # when it answered (None: away)
    checkpoint: tuple[int, int] | None = None  # the leader's state file when the quiet period ended
    waiting: bool = False  # quiet period over: waiting for the next checkpoint
    next_look: float = 0.0


class Elastic:
    """Wins back hosts whose workers left the job."""

    def __init__(self, job: Job, hosts: HostWatch, restarts: Restarts) -> None:
        self.job = job
        self.hosts = hosts
        self.restarts = restarts
        self.returning: dict[str, Returning] = {}

    def tick(self, now: float) -> None:
        """Probe, watch the quiet period, look for the checkpoint, and take a host back."""
        job = self.job
        if not job.left or job.stopping or self.hosts.reconnect is None:
            return
        for label in sorted({job.tasks[n].host for n in job.left}):
            host = self.returning.get(label)
            if host is None:
                host = self.returning[label] = Returning(label, away_since=now, next_try=now + PROBE_FIRST_S)
            self._follow(host, now)

    def _follow(self, host: Returning, now: float) -> None:
        job = self.job
        session = job.sessions[host.label]
        if host.back_since is not None and session.lost:  # lost again while it waited: it flaps
            host.back_since, host.waiting, host.checkpoint = None, False, None
            host.losses += 1
            host.away_since = now
            host.delay, host.next_try = PROBE_FIRST_S, now + PROBE_FIRST_S
        if host.back_since is None:
            self._probe(host, now)
            return
        quiet = job.options.rejoin_after_s * 2 ** (host.losses - 1)
        if now < host.back_since + quiet or self.restarts.under_way:
            return
        returning = sorted(n for n in job.left if job.tasks[n].host == host.label)
        if facts_of(job.strategy).group_restart and any(job.tasks[n].spec.role == "worker" for n in returning):
            state = self._leader_checkpoint()
            if not host.waiting:
                host.waiting, host.checkpoint, host.next_look = True, state, now + CHECKPOINT_POLL_S
                job.notify(f"{host.label} stayed up {quiet:g}s: taking {', '.join(returning)} back at the job's "
                           f"next checkpoint")
                return
            if now < host.next_look:
                return
            host.next_look = now + CHECKPOINT_POLL_S
            if state is None or state == host.checkpoint:
                return
        del self.returning[host.label]
        self.restarts.grow(returning, host.label)

    def _probe(self, host: Returning, now: float) -> None:
        if host.probe is None:
            if now < host.next_try:
                return
            box: list = []
            thread = threading.Thread(target=self._try, args=(host.label, box), daemon=True)
            host.probe = (thread, box)
            thread.start()
            return
        thread, box = host.probe
        if thread.is_alive():
            return
        host.probe = None
        result = box[0] if box else None
        if result is None or isinstance(result, Exception):
            host.next_try = now + host.delay
            if now - host.away_since >= PROBE_STEADY_S:
                host.delay = min(host.delay * 2, PROBE_MAX_S)
            return
        self.hosts.rejoined(host.label, result)
        host.back_since = now
        quiet = self.job.options.rejoin_after_s * 2 ** (host.losses - 1)
        flaps = f" (lost {host.losses} times: a longer quiet period)" if host.losses > 1 else ""
        self.job.notify(f"{host.label} answers again: its workers rejoin after {quiet:g}s without a loss{flaps}")

    def close(self) -> None:
        """At the end of the job: a probe that reached its host after all gives its session back."""
        for host in self.returning.values():
            if host.probe is not None:
                thread, box = host.probe
                thread.join(timeout=5.0)
                for result in box:
                    if not isinstance(result, Exception):
                        result.close()

    def _try(self, label: str, box: list) -> None:
        try:
            box.append(self.hosts.reconnect(label))  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - any failure: try again later
            box.append(exc)

    def _leader_checkpoint(self) -> tuple[int, int] | None:
        """(size, mtime) of the checkpoint state file in the leader's checkpoint folder (None: none
        yet, or its host did not answer)."""
        job = self.job
        leader = next((t.spec for t in job.tasks.values()
                       if t.spec.role == "worker" and t.spec.index == 0 and t.name not in job.left), None)
        if leader is None:
            return None
        try:
            files = job.sessions[leader.host.label].list_files(leader.env.get(CHECKPOINT_DIR, ""), timeout=10.0)
        except OSError:
            return None
        return newest_state(files)
