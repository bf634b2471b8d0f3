"""The job's membership over time (``--min-workers``): one phase per set of workers, with what it did.

Each change in ``outcome.json``'s ``membership`` (workers that left with a host gone for good, or
rejoined when it came back) begins a phase that lasts until the next change or the run's end. A
phase's figures come from every task's step records that began inside it: the steps it made, its
throughput while training (samples over the time from its first step's start to its last step's
end: the restart that began it is not counted against it), and its goodput (the time the busiest
task spent in steps over the phase's whole time: here the restart that began it counts, as the
job's own goodput counts its start-up).
"""

from __future__ import annotations

from collections.abc import Sequence

from ddlctl.report.stepfile import TaskSteps


def membership_phases(changes: Sequence[dict], initial: Sequence[str], all_steps: Sequence[TaskSteps],
                      run_start: float | None, run_end: float | None) -> tuple[dict, ...]:
    """Phases of the job's membership (none when it never changed); ``initial``: the workers it
    began with, ``run_start``/``run_end``: its first step's start and last step's end (epoch s)."""
    if not changes or run_start is None or run_end is None:
        return ()
    begins = [run_start, *(float(c["time"]) for c in changes)]
    ends = [*begins[1:], run_end]
    phases = []
    for number, (begin, end) in enumerate(zip(begins, ends, strict=True)):
        change = changes[number - 1] if number else None
        workers = list(change["workers"]) if change else list(initial)
        first, last, samples, steps, busy = None, None, 0, 0, 0.0
        for series in all_steps:
            made, stepping = 0, 0.0
            for i, start_us in enumerate(series.start_us):
                start = start_us / 1e6
                if begin <= start < end:
                    first = start if first is None else min(first, start)
                    last = max(last or start, start + series.duration[i])
                    samples += max(0, series.samples[i])
                    made += series.block
                    stepping += series.duration[i]
            steps = max(steps, made)
            busy = max(busy, stepping)
        training = (last - first) if first is not None and last is not None else 0.0
        phases.append({
            "start": begin, "end": end, "workers": workers,
            "why": "start" if change is None else change.get("why"),
            "cause": "start" if change is None else change.get("cause"),
            "steps": steps, "training_s": training,
            "samples_per_s": samples / training if training > 0 else None,
            "goodput": min(1.0, busy / (end - begin)) if end > begin else None,
        })
    return tuple(phases)
