"""A running job's time by cause (the live view's line, the Prometheus metrics): the report's
accounting (:func:`ddlctl.contract.causes.time_by_cause`) over what the controller knows so far.

The lead task's (the ps chief's, else mwms worker 0's) progress reports stand for its steps: the
time between two reports that moved it is *productive* (*redone* while it climbs back to a step it
had reached before a restart), and consecutive ones merge, so a day's run keeps a handful of
intervals. The phase its host agent says it is in gives *checkpoint* / *eval* (so do the beats of
an evaluation, whose phase record comes only at its end); a restart is
*restart* from its fault until the lead moves again after it; a hang the supervisor found is
*stalled* from the hung task's last progress; losses left unreplaced make the productive time after
them *degraded*. Before the first report is *start-up*. The report, from the step records, is
finer (compilation, the loop's pauses between steps); the live figures are its running estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlctl.contract.causes import Interval, TimeByCause, hang_records, loss_times, stall_of, time_by_cause

#: A longer time between two reports of the lead's progress is not all steps: only this much of it is.
PROGRESS_GAP_S = 5.0
#: Seconds a count of the time by cause is kept before it is made again (the live view and a scrape
#: may ask at every tick).
RECOUNT_S = 1.0
#: A task beats at most once a second while at work between steps (:func:`ddlctl.task.steps.beat`);
#: an evaluation it beats through is held open this long after its last beat.
BEAT_S, BEAT_HOLD_S = 1.0, 3.0
#: The tasks whose progress stands for the job's, in order of preference.
LEADS = ("chief:0", "worker:0")


class LiveCauses:
    """Intervals by cause, from one tick of the supervisor to the next (pure bookkeeping)."""

    def __init__(self, started: float) -> None:
        self.started = started  # epoch seconds
        self.lead: str | None = None
        self.kept: list[Interval] = []
        self.redone: list[Interval] = []
        self.phases: dict[str, list[Interval]] = {}
        self.restarts: list[tuple[float, float | None]] = []  # (fault, back; None while under way)
        self._last: tuple[int, float] | None = None  # the lead's step and when it was reported
        self._high = 0  # the highest step the lead reached (below it after a restart: redone)
        self._phase: tuple[str, float, bool] | None = None  # (name, since, from beats)
        self._busy: tuple[int, float] = (0, started)  # the lead's phase lines and beats, when that last grew
        self._counted: tuple[float, TimeByCause] | None = None

    def tick(self, now: float, progress: Mapping[str, tuple[int, int | None]],
             activity: Mapping[str, tuple[int, str | None]], restart_times: Sequence[float],
             restarting: bool, beats: Mapping[str, str] | None = None) -> None:
        """Take one tick's reports: each task's (highest step, total), (phase lines, open phase) and
        last beat's kind, the times of the restarts so far and whether one is under way."""
        while len(self.restarts) < len(restart_times):
            self.restarts.append((float(restart_times[len(self.restarts)]), None))
        lead = self.lead or next((n for n in LEADS if n in progress), None)
        if lead is None or lead not in progress:
            return
        self.lead = lead
        step = int(progress[lead][0])
        busy, phase = activity.get(lead, (0, None))
        if busy != self._busy[0]:
            self._busy = (busy, now)
        beating = phase is None and (beats or {}).get(lead) == "eval" and now - self._busy[1] <= BEAT_HOLD_S \
            and (self._last is None or step == self._last[0])
        if beating:  # an evaluation (model.fit's validation) beats each second; its phase record comes at its end
            phase = "eval"
        if self._phase is not None and (phase != self._phase[0] or self._phase[2] != beating):
            ends = min(now, self._busy[1] + BEAT_S) if self._phase[2] else now  # (with its last beat)
            self.phases.setdefault(self._phase[0], []).append((self._phase[1], ends))
            self._phase = None
            if self._last is not None:  # (the steps after it start after it)
                self._last = (self._last[0], ends)
        moved = self._move(step, now)
        if moved and not restarting:  # (a restart is over once the lead moves after it)
            self.restarts = [(fault, now if back is None and fault < now else back) for fault, back in self.restarts]
        if phase and self._phase is None:
            self._phase = (phase if phase in ("checkpoint", "eval") else "other", now, beating)

    def _move(self, step: int, now: float) -> bool:
        last = self._last
        if last is None or step < last[0]:  # the first report, or started again from a checkpoint
            self._last = (step, now) if step > 0 else None
            return False
        if step == last[0]:
            return False
        start = max(last[1], now - PROGRESS_GAP_S)
        again = max(0, min(step, self._high) - last[0])  # of the steps since, those done before
        cut = start + (now - start) * again / (step - last[0])
        if again:
            _extend(self.redone, (start, cut))
        if cut < now:
            _extend(self.kept, (cut, now))
        self._high = max(self._high, step)
        self._last = (step, now)
        return True

    def breakdown(self, now: float, degraded_since: Sequence[float] = (),
                  hangs: Sequence[tuple[float, float]] = ()) -> TimeByCause:
        """The time from the start to ``now`` by cause; ``hangs``: (found, idle seconds) each."""
        phases = {name: list(spans) for name, spans in self.phases.items()}
        if self._phase is not None:
            phases.setdefault(self._phase[0], []).append((self._phase[1], now))  # (still under way)
        restarts = [(fault, now if back is None else back) for fault, back in self.restarts]
        stalls = [stall_of(found, idle, self.kept) for found, idle in hangs]
        return time_by_cause((self.started, max(now, self.started)), self.kept, self.redone, phases, restarts,
                             list(degraded_since), None, stalls, steps=False, ended=False)

    def now(self, now: float, degraded: Sequence[Mapping], hangs: Sequence[Mapping]) -> TimeByCause:
        """:meth:`breakdown` from the supervisor's records (``outcome.json``'s ``degraded`` and
        ``hangs`` entries so far), made again only :data:`RECOUNT_S` after the last."""
        if self._counted is not None and now - self._counted[0] < RECOUNT_S:
            return self._counted[1]
        counted = self.breakdown(now, loss_times(degraded), hang_records(hangs))
        self._counted = (now, counted)
        return counted


def _extend(intervals: list[Interval], span: Interval) -> None:
    """Add ``span``, merged into the last interval when it starts where that one ends."""
    if intervals and abs(intervals[-1][1] - span[0]) < 1e-9:
        intervals[-1] = (intervals[-1][0], span[1])
    elif span[1] > span[0]:
        intervals.append(span)
