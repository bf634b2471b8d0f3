"""Hosts during a job: a lost connection noticed, a host reconnected before a restart on it, or
given up (``--host-timeout``; at once when it cannot come back, e.g. its Slurm job ended).

A host agent beats every 2 s; ``silence_s`` without a word (network down without a reset, agent
stopped) loses the session as surely as a closed connection. A lost host's tasks are gone (its
agent kills them when its input ends); whether that stops the job is the policy's decision on
those tasks' faults. Its frames say its time too: a host whose clock is off is said once, and its
offset kept for the report (``clock_offsets``). Reconnecting runs in a thread (it may take
seconds per try) while the loop goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddlctl.contract.errors import HostGoneError, LaunchError
from ddlctl.contract.hostclock import CLOCK_CORRECTED_S, CLOCK_SAID_S, SYNCHRONISE, how_far
from ddlctl.supervise.job import Job
from ddlctl.transport.base import AgentSession

#: A host's clock is said only once this many of its frames told it (a bound from one or two is loose).
CLOCK_SAID_AFTER = 3

Reconnect = Callable[[str], AgentSession]


@dataclass(frozen=True)
class HostGone:
    """A host that will not be back: ``gone`` when it cannot come back at all."""

    label: str
    why: str
    gone: bool = False


class HostWatch:
    """Watches every host's session; reconnects a lost one on demand."""

    def __init__(self, job: Job, reconnect: Reconnect | None,
                 attach: Callable[[AgentSession], None], detach: Callable[[AgentSession], None]) -> None:
        self.job = job
        self.reconnect = reconnect
        self.attach, self.detach = attach, detach  # the loop's selector
        self.reconnecting: dict[str, tuple[threading.Thread, list]] = {}
        self.away: set[str] = set()  # hosts lost and not back yet
        self.lost_mono: dict[str, float] = {}  # when each host was last lost
        self.lost: list[dict] = []  # every loss, for outcome.json
        self.clock_offsets: dict[str, float] = {}  # host -> its clock less this machine's (seconds)
        self.clock_said: set[str] = set()

    def watch(self, now: float) -> None:
        """Notice hosts that went silent or whose connection ended."""
        sessions = self.job.sessions
        for session in sessions.values():
            session.check_silence(self.job.options.silence_s, now)
        for label, session in sessions.items():
            self._clock(label, session)
        for label, session in sessions.items():
            if session.lost and label not in self.away:
                self.away.add(label)
                self.lost_mono[label] = now
                self.lost.append({"host": label, "time": session.lost_at, "reason": session.lost})
                self.job.notify(f"connection to {label} lost ({session.lost}): its tasks are gone")
                self.detach(session)

    def _clock(self, label: str, session: AgentSession) -> None:
        """Keep a host's clock offset when it matters (and say it once when it is large)."""
        offset = session.clock_offset
        if offset is None or abs(offset) < CLOCK_CORRECTED_S:
            return
        self.clock_offsets[label] = round(offset, 3)
        if abs(offset) >= CLOCK_SAID_S and session.clock_frames >= CLOCK_SAID_AFTER and label not in self.clock_said:
            self.clock_said.add(label)
            self.job.notify(f"the clock of {label} is {how_far(offset)}: its task exits, step times and samples are "
                            "put on this machine's clock (outcome.json clock_offsets), its own logs keep its time; "
                            + SYNCHRONISE)

    def settling(self, labels: Iterable[str], now: float) -> bool:
        """Whether a dropped host's old agent may still be killing its tasks (their ports not free yet)."""
        grace = self.job.options.grace_s + 1.0
        return any(now < self.lost_mono.get(label, float("-inf")) + grace for label in labels)

    def ready(self, label: str, now: float) -> bool | HostGone:
        """Whether the host's agent is there; starts (and waits for) a reconnection if it was lost."""
        session = self.job.sessions[label]
        if not session.lost:
            return True
        if self.reconnect is None:
            return HostGone(label, "no way to reconnect")
        pending = self.reconnecting.get(label)
        if pending is None:
            box: list = []
            thread = threading.Thread(target=self._reconnect_loop, args=(label, box), daemon=True)
            self.reconnecting[label] = (thread, box)
            thread.start()
            self.job.notify(f"reconnecting to {label} (up to {self.job.options.host_timeout_s:g}s)")
            return False
        thread, box = pending
        if thread.is_alive():
            return False
        del self.reconnecting[label]
        result = box[0] if box else LaunchError("reconnection gave nothing")
        if isinstance(result, Exception):
            return HostGone(label, getattr(result, "message", str(result)), isinstance(result, HostGoneError))
        self.rejoined(label, result)
        self.job.notify(f"reconnected to {label}")
        return True

    def rejoined(self, label: str, session: AgentSession) -> None:
        """``label`` answers again through ``session`` (a reconnection, or a probe of a host whose
        workers left the job): the job's session for it from now on."""
        self.job.sessions[label] = session
        self.attach(session)
        self.away.discard(label)

    def _reconnect_loop(self, label: str, box: list) -> None:
        deadline = time.monotonic() + self.job.options.host_timeout_s
        delay = 0.5
        last: Exception | None = None
        while time.monotonic() < deadline and not self.job.stopping:
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
