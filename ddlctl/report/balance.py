"""The report's "balance" section for synchronous multi-worker runs (pure).

In a synchronous step every worker computes its gradients on its part of the global batch, then
waits at the all-reduce for the slowest one. Per worker, from its own step records: the step period
(start to start, the same for all in lockstep), its compute (step start to gradients ready,
``sync_s``, input included), the rest of the period spent waiting and in the all-reduce, and its
speed = its examples per step / its compute. From those measured speeds: what the equal split and
the split proportional to speed would give (the slowest worker's compute plus the communication
that even the slowest worker waits for), and the ideal, the sum of the speeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ddlctl.task.balance import equal_shares, shares

#: Below this predicted gain the report does not suggest --balance speed.
SUGGEST_GAIN = 1.15
#: The split of a run that asked for --balance speed but whose program split equally.
NOT_BALANCED = "equal (--balance speed was asked for, the program did not use ddlctl.task.balance)"


@dataclass(frozen=True)
class WorkerSteps:
    """One worker's kept step records (what :func:`balance_section` needs)."""

    task: str
    host: str | None
    starts_us: Sequence[int]
    sync_s: Sequence[float]
    samples: Sequence[int]


def _period_s(starts_us: Sequence[int]) -> float | None:
    gaps = np.diff(np.asarray(starts_us, dtype=np.int64))
    gaps = gaps[gaps > 0] / 1e6
    return float(np.median(gaps)) if gaps.size else None


#: Steps at the final split (after a re-split) that the section needs to describe that split alone.
FINAL_SPLIT_MIN_STEPS = 4


def final_split_steps(samples: Sequence[int]) -> int:
    """How many of the last records the section describes: those at the final split (the trailing
    run of the last batch size) when there are at least :data:`FINAL_SPLIT_MIN_STEPS`, else all
    (medians over two splits would pair one split's batch with another's compute time). Pure."""
    counts = np.asarray(samples)
    if not counts.size:
        return 0
    other = np.nonzero(counts[::-1] != counts[-1])[0]
    run = int(other[0]) if other.size else len(counts)
    return run if run >= FINAL_SPLIT_MIN_STEPS else len(counts)


def balance_section(workers: Sequence[WorkerSteps], split: str = "equal",
                    calibrated: Sequence[float] = ()) -> dict | None:
    """Per-worker figures and predictions; None unless there are two or more workers with
    synchronisation times and example counts. After a re-split, the figures are those of the
    final split's steps (the same steps on every worker: they re-split together)."""
    rows = []
    last = min((final_split_steps(w.samples) for w in workers if len(w.samples)), default=0)

    def final(values: Sequence) -> Sequence:  # the final split's records (all of them: last == 0)
        return values[-last:] if last else values

    for w in workers:
        period = _period_s(final(w.starts_us))
        syncs = np.asarray(final(w.sync_s), dtype=float)
        syncs = syncs[syncs >= 0]
        counts = np.asarray(final(w.samples))
        counts = counts[counts > 0]
        if period is None or not syncs.size or not counts.size:
            return None
        compute = float(np.median(syncs))
        batch = int(np.median(counts))
        rows.append({"task": w.task, "host": w.host, "batch": batch, "period_s": period, "compute_s": compute,
                     "speed": batch / compute if compute > 0 else None})
    if len(rows) < 2 or any(r["speed"] is None for r in rows):
        return None
    step = statistics.median(r["period_s"] for r in rows)
    total = sum(r["batch"] for r in rows)
    for r in rows:
        r["share"] = r["batch"] / total
        r["wait_s"] = max(0.0, step - r["compute_s"])
    comm = min(r["wait_s"] for r in rows)  # even the slowest worker waits this long: the all-reduce itself
    speeds = [r["speed"] for r in rows]

    def predicted(batches: Sequence[int]) -> float:
        return total / (max(b / s for b, s in zip(batches, speeds, strict=True)) + comm)

    equal = predicted(equal_shares(total, len(rows)))
    balanced = predicted(shares(speeds, total))
    return {"split": split, "global_batch": total, "step_s": step, "comm_s": comm,
            "measured_samples_per_s": total / step, "predicted_equal_samples_per_s": equal,
            "predicted_balanced_samples_per_s": balanced, "ideal_samples_per_s": sum(speeds),
            "calibrated_speeds": list(calibrated), "workers": rows,
            # after a re-split: the figures describe its last this many steps
            "final_split_steps": last if last < min(len(w.samples) for w in workers) else None}


def balance_note(section: Mapping | None) -> str | None:
    """A diagnosis line when an equal split leaves a clear gain on the table."""
    if section and section.get("split") == NOT_BALANCED:
        return ("--balance speed had no effect: the program split every batch equally (model.fit cannot be "
                "balanced; a custom training loop can, with ddlctl.task.balance)")
    if not section or section.get("split") != "equal":
        return None
    gain = section["predicted_balanced_samples_per_s"] / section["predicted_equal_samples_per_s"]
    if gain < SUGGEST_GAIN:
        return None
    slow = min(section["workers"], key=lambda r: r["speed"])
    fast = max(section["workers"], key=lambda r: r["speed"])
    return (f"unequal workers: {slow['task']} on {slow['host']} computes {fast['speed'] / slow['speed']:.1f}x slower "
            f"than {fast['task']}; --balance speed would give about {gain:.2f}x the throughput "
            f"(predicted from the measured speeds)")
