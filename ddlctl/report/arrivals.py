"""Arrivals at the synchronisation point of synchronous training (pure, over step columns): how
late each task arrives behind the earliest, and how long the lead waited for the last. In
columns (numpy) when every task recorded the same steps, each once; step by step otherwise
(restarts repeat steps, a worker that left has fewer)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ddlctl.contract.causes import straggler_wait
from ddlctl.contract.stats import median_of, percentile
from ddlctl.report.stepfile import TaskSteps, kept_records


def arrival_lateness(all_steps: Sequence[TaskSteps], warmup: int) -> dict[str, float]:
    """Median lateness of each task's arrival at the synchronisation point behind the earliest task,
    over step numbers present in every stepping task (synchronous training).

    In lockstep every step starts when the previous all-reduce returns, at the same moment
    everywhere, so how late a task arrives is how much longer than the fastest it took from the
    step's start to its gradients being ready (``sync_s``). Each task measures that on its own
    clock: clock skew between hosts cannot make a healthy host look slow. Tasks without step
    records (an evaluator) take no part."""
    stepping = [s for s in all_steps if s.step]
    kept = [kept_records(s, warmup) for s in stepping]
    syncs = [np.asarray(s.sync_s)[k] for s, k in zip(stepping, kept, strict=True)]
    if any(not s.sync_s or not len(y) or y.min() < 0 for s, y in zip(stepping, syncs, strict=True)):
        return {}
    numbers = [np.asarray(s.step)[k] for s, k in zip(stepping, kept, strict=True)]
    if len(stepping) >= 2 and all(np.array_equal(n, numbers[0]) for n in numbers) \
            and bool(np.all(np.diff(numbers[0]) > 0)):  # the same steps everywhere, each once: in columns
        late = np.stack(syncs)
        late -= late.min(axis=0)
        return {s.name: percentile(np.sort(row), 50) or 0.0 for s, row in zip(stepping, late, strict=True)}
    arrivals = {s.name: dict(zip(n.tolist(), y.tolist(), strict=True))
                for s, n, y in zip(stepping, numbers, syncs, strict=True)}
    common = set.intersection(*(set(a) for a in arrivals.values())) if arrivals else set()
    if len(arrivals) < 2 or not common:
        return {}
    late: dict[str, list[float]] = {name: [] for name in arrivals}
    for step in common:
        first = min(a[step] for a in arrivals.values())
        for name, a in arrivals.items():
            late[name].append(a[step] - first)
    return {name: median_of(values) or 0.0 for name, values in late.items()}


def straggler_wait_of(lead: TaskSteps, workers: Sequence[TaskSteps]) -> float | None:
    """:func:`~ddlctl.contract.causes.straggler_wait` of the lead among ``workers`` (None: the lead is
    not one of them, or recorded no arrival); in columns when every worker recorded the same steps,
    each once, all with arrivals."""
    if lead not in workers:
        return None
    numbers = [np.asarray(w.step) for w in workers]
    syncs = [np.asarray(w.sync_s) for w in workers]
    if all(np.array_equal(n, numbers[0]) for n in numbers) and bool(np.all(np.diff(numbers[0]) > 0)) \
            and all(len(y) and y.min() >= 0 for y in syncs):
        arrivals = np.stack([np.asarray(w.start_us) / 1e6 + y for w, y in zip(workers, syncs, strict=True)])
        own = arrivals[workers.index(lead)]
        return float(np.maximum(arrivals.max(axis=0) - own, 0.0).sum()) if own.size else None
    arrivals = [{st: t / 1e6 + y for st, t, y in zip(w.step, w.start_us, w.sync_s, strict=True) if y >= 0}
                for w in workers]
    mine = arrivals[workers.index(lead)]
    return straggler_wait(mine, arrivals) if mine else None
