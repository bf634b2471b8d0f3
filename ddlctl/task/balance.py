"""Balanced synchronous data parallelism: each worker's share of the global batch proportional to
its speed (``ddlctl launch --strategy mwms --balance speed``).

The maths. With a global batch of ``B`` examples split into per-worker batches ``b_i`` (``sum b_i =
B``), worker ``i`` computes ``L_i = (1 / B) * sum over its examples of loss(x)`` (its local mean
weighted by ``w_i = b_i / B``: ``tf.nn.compute_average_loss(per_example, global_batch_size=B)``
does exactly this), and the all-reduce *sums* the gradients. The result is ``(1 / B) * sum over all B
examples of grad loss(x)``: the gradient of the mean loss over the global batch, whatever the
split. With ddlctl's data order (step ``k`` reads ids ``[k*B, (k+1)*B)``, worker ``i`` a contiguous
slice of them), an equal and a balanced split see the same examples at every step, so they train
the same model up to floating-point summation order. Only the time changes: a synchronous step
lasts as long as its slowest worker, ``max_i b_i / s_i``, which the proportional split ``b_i = B *
s_i / sum s`` brings down to ``B / sum s`` (ideal: the sum of the workers' speeds).

Custom training loops use it like this (TensorFlow is imported lazily)::

    from ddlctl.task import balance
    split = balance.split(strategy, GLOBAL_BATCH, calibrate=one_local_step)  # equal unless --balance speed
    dataset = make_dataset(batch=split.local_batch, first_example=split.offset)  # per step
    loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)

Speeds come from ``DDLCTL_SPEEDS`` (set by ``--speeds FILE``, a profile saved by ``ddlctl check
--bench``) or are measured at the start of the run: every worker times ``calibrate()`` for
``seconds`` at the same moment (after a barrier, so the workers compete for shared machines as they
will while training) and the rates are exchanged with one all-reduce. A calibration is a few calls of a
step alone, so the built-in workload goes on measuring while it trains (:class:`Rebalancer`; custom
loops may use it too): after its first ``RESPLIT_AFTER_STEPS`` steps, then at growing intervals
(``RESPLIT_WINDOW`` steps, doubled each time the split stays), the workers exchange the medians of
their compute times, and the split changes when the
split by those speeds promises a step at least ``RESPLIT_MIN_GAIN`` shorter *and* saves more over
the remaining steps than a re-split costs (measured on the steps around the previous re-split). A
re-split takes effect at a step no worker's input pipeline has begun yet (the workers exchange how
far they have read ahead). Every worker takes the same decision from the same exchanged values.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ddlctl.contract import envvars


def enabled() -> bool:
    """Whether ddlctl asked this task to balance (``DDLCTL_BALANCE=speed``)."""
    return os.environ.get(envvars.BALANCE, "off") == "speed"


def shares(speeds: Sequence[float], global_batch: int) -> list[int]:
    """``global_batch`` split proportionally to ``speeds`` (largest remainder), at least 1 each."""
    n = len(speeds)
    if n == 0 or global_batch < n:
        raise ValueError(f"a global batch of {global_batch} cannot give each of {n} workers an example")
    if any(not s > 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {list(speeds)}")
    total = sum(speeds)
    exact = [global_batch * s / total for s in speeds]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(n), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:global_batch - sum(counts)]:
        counts[i] += 1
    for i in range(n):  # a worker too slow for even one example still takes one
        if counts[i] == 0:
            counts[i] = 1
            donors = [j for j in range(n) if counts[j] > 1]
            counts[max(donors, key=lambda j: (counts[j] - exact[j], -j))] -= 1  # the most over its exact share
    return counts


@dataclass(frozen=True)
class Split:
    """This worker's part of every global batch."""

    global_batch: int
    batches: tuple[int, ...]  # per worker, in worker order
    index: int  # this worker
    speeds: tuple[float, ...]  # per worker, samples/s (or relative); () when not known
    source: str  # "equal" (not balancing), "measured" or "profile"; + ", then in training" once re-split

    @property
    def local_batch(self) -> int:
        return self.batches[self.index]

    @property
    def offset(self) -> int:
        """Position of this worker's slice inside each global batch."""
        return sum(self.batches[:self.index])

    @property
    def weight(self) -> float:
        """Factor for a *local mean* loss so that summed gradients equal the global mean's."""
        return self.local_batch / self.global_batch

    def predicted_step_s(self, batches: Sequence[int] | None = None) -> float | None:
        """Compute time of a step with ``batches`` (default: this split) at the known speeds."""
        if not self.speeds:
            return None
        return max(b / s for b, s in zip(batches or self.batches, self.speeds, strict=True))


def relative(speeds: Sequence[float]) -> str:
    """Speeds as fractions of the fastest, for a log line: ``1.00 : 0.42``. Pure."""
    top = max(speeds)
    return " : ".join(f"{v / top:.2f}" for v in speeds)


def equal_shares(global_batch: int, workers: int) -> list[int]:
    """The equal split (the first ``global_batch % workers`` workers take one more)."""
    return [global_batch // workers + (1 if i < global_batch % workers else 0) for i in range(workers)]


def speeds_from_env() -> list[float] | None:
    """Per-worker speeds ddlctl passed in ``DDLCTL_SPEEDS`` (a profile), if any."""
    text = os.environ.get(envvars.SPEEDS)
    if not text:
        return None
    return [float(v) for v in json.loads(text)]


def measure(step: Callable[[], object], seconds: float = 1.5, warmup: int = 3, min_calls: int = 4) -> float:
    """Calls of ``step`` per second in steady state: over at least ``seconds`` and ``min_calls``
    calls, after ``warmup`` untimed ones. The warm-up matters: an input pipeline that prefetches
    has batches ready at the start, made while the program was setting up, and a worker whose CPU
    is scarce looks up to 1.5x faster over its first calls than while it trains (measured with a
    CPU quota: 5,668 and 4,300 samples/s calibrated after one warm-up call, 3,815 in training).
    ``step`` must block until its work is done (return a numpy value, or call ``.numpy()``)."""
    for _ in range(warmup):
        step()
    count, start = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and count >= min_calls:
            return count / elapsed


def exchange(strategy, value: float) -> list[float]:  # noqa: ANN001 - a tf.distribute strategy
    """Every worker's ``value`` in worker order, on every worker (one all-reduce through ``strategy``;
    each worker must call it). One replica per worker is assumed."""
    return [row[0] for row in exchange_rows(strategy, [value])]


def split(strategy, global_batch: int, calibrate: Callable[[], object] | None = None,  # noqa: ANN001
          samples_per_call: int | None = None, seconds: float = 1.5) -> Split:
    """This worker's split of ``global_batch``: proportional to the workers' speeds under
    ``--balance speed``, equal otherwise. Without speeds from ddlctl, every worker measures
    ``calibrate`` (one local step on an equal share, ``samples_per_call`` examples) and the
    rates are exchanged. Saved as ``balance.json`` in the task's folder for the report."""
    workers = strategy.num_replicas_in_sync
    index = int(strategy.cluster_resolver.task_id) if getattr(strategy, "cluster_resolver", None) else 0
    if not enabled():
        result = Split(global_batch, tuple(equal_shares(global_batch, workers)), index, (), "equal")
    else:
        if workers != int(os.environ.get(envvars.NUM_WORKERS, workers)):
            raise SystemExit(f"--balance speed needs one replica per worker, but the "
                             f"{os.environ[envvars.NUM_WORKERS]} workers have {workers} replicas: "
                             "use --worker-per gpu")
        speeds = speeds_from_env()
        source = "profile"
        if speeds is None:
            if calibrate is None:
                raise ValueError("--balance speed without measured speeds needs a calibrate function")
            exchange(strategy, 0.0)  # a barrier: every worker measures at the same time
            rate = measure(calibrate, seconds) * (samples_per_call or 1)
            speeds, source = exchange(strategy, rate), "measured"
        if len(speeds) != workers:
            raise SystemExit(f"DDLCTL_SPEEDS lists {len(speeds)} speeds for {workers} workers")
        result = Split(global_batch, tuple(shares(speeds, global_batch)), index, tuple(speeds), source)
    save(result)
    return result


#: Steps after which ``--balance speed`` first compares the speeds the workers show in training.
RESPLIT_AFTER_STEPS = 4
#: Steps after a re-split takes effect that are not measured (the first steps at a new batch size):
#: with the steps before it takes effect, its cost.
RESPLIT_SETTLE = 1
#: Steps of notice beyond what the input pipelines have already made when a re-split is decided
#: (one more step may begin while the workers exchange their figures).
RESPLIT_NOTICE_MARGIN = 1
#: Later comparisons at multiples of this many steps (the built-in workload's steps per call, so
#: they fall where its blocks end), each over at least this many measured steps (medians: one step's
#: compute time varies by +-25% on a shared machine); the interval doubles, up to
#: ``RESPLIT_MAX_INTERVAL``, each time the split stays, and starts again after a change.
RESPLIT_WINDOW = 8
RESPLIT_MAX_INTERVAL = 256
#: A re-split must shorten the slowest worker's compute per step by at least this fraction.
RESPLIT_MIN_GAIN = 0.04


def exchange_rows(strategy, values: Sequence[float]) -> list[list[float]]:  # noqa: ANN001 - a tf.distribute strategy
    """Every worker's ``values`` (the same length on all) in worker order, on every worker: one
    all-reduce of a matrix with this worker's row filled in. Each worker must call it."""
    import tensorflow as tf

    n, k = strategy.num_replicas_in_sync, len(values)
    row = tf.constant([float(v) for v in values], tf.float64)

    def one_row(ctx):  # noqa: ANN001, ANN202
        return tf.one_hot(ctx.replica_id_in_sync_group, n, dtype=tf.float64)[:, None] * row[None, :]

    matrix = strategy.experimental_distribute_values_from_function(one_row)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, matrix, axis=None).numpy()
    return [[float(v) for v in total[i][:k]] for i in range(n)]


def decide(batches: Sequence[int], speeds: Sequence[float], remaining_steps: int, cost_s: float,
           min_gain: float = RESPLIT_MIN_GAIN) -> tuple[int, ...] | None:
    """The split by ``speeds`` when it is worth a re-split, else None: the slowest worker's compute
    per step (``max b_i / s_i``) must drop by at least ``min_gain`` of itself, and the time saved
    over ``remaining_steps`` must exceed ``cost_s`` (what a re-split costs). Pure."""
    verdict, proposed = judge(batches, speeds, remaining_steps, cost_s, min_gain)
    return proposed if verdict == "re-split" else None


def judge(batches: Sequence[int], speeds: Sequence[float], remaining_steps: int, cost_s: float,
          min_gain: float = RESPLIT_MIN_GAIN) -> tuple[str, tuple[int, ...] | None]:
    """:func:`decide` with its reason: ``("re-split", split)``, or ``(why not, None)`` with why not
    one of "not measured", "close enough" and "would not pay for itself". Pure."""
    if any(not s > 0 for s in speeds) or remaining_steps <= 0:
        return "not measured", None
    proposed = tuple(shares(speeds, sum(batches)))
    now = max(b / s for b, s in zip(batches, speeds, strict=True))
    then = max(b / s for b, s in zip(proposed, speeds, strict=True))
    if proposed == tuple(batches) or now - then < min_gain * now:
        return "close enough", None
    if (now - then) * remaining_steps <= cost_s:
        return "would not pay for itself", None
    return "re-split", proposed


class Rebalancer:
    """``--balance speed`` while training: when the workers compare their speeds (:attr:`due`, a
    step count) and whether the split changes (:meth:`check`). Feed it every step's compute time
    (step start to gradients ready) with :meth:`record`."""

    def __init__(self, total_steps: int, start: int = 0) -> None:
        self.total_steps = total_steps
        self.due: int | None = start + RESPLIT_AFTER_STEPS if start + RESPLIT_AFTER_STEPS < total_steps else None
        self.skip = 1  # the first step of a run warms up
        self.computes: list[float] = []
        self.resplits = 0
        self.spent_s = 0.0
        self.cost_s: float | None = None  # what the last re-split cost, once measured
        self.interval = RESPLIT_WINDOW  # measured steps before the next comparison, at least
        self.comparisons = 0
        self.compared: tuple[float, ...] = ()  # the speeds of the last comparison
        self.verdict = ""  # its outcome (see :func:`judge`)
        self.effective = start  # 0-based step from which the last re-split's split applies

    @staticmethod
    def _next(step: int, steps: int) -> int:
        """The first multiple of ``RESPLIT_WINDOW`` at least ``steps`` after ``step``."""
        return -(-(step + steps) // RESPLIT_WINDOW) * RESPLIT_WINDOW

    def record(self, compute_s: float) -> None:
        """One step's compute time on this worker."""
        self.computes.append(compute_s)

    def spent(self, seconds: float) -> None:
        """Time a re-split cost outside the steps (making the new input pipeline, a new trace)."""
        self.spent_s += seconds

    def check(self, strategy, current: Split, step: int, ahead: int = 0) -> Split:  # noqa: ANN001 - a strategy
        """At step count :attr:`due` on every worker: exchange the measured speeds, what the last
        re-split cost and how far the input pipelines have read ahead (``ahead``: steps past
        ``step`` this worker's pipeline has begun to make), and return the split to go on with
        (saved when it changed). A new split takes effect at 0-based step :attr:`effective`: at
        once when no pipeline reads ahead, else past what any worker's pipeline has made."""
        import statistics

        measured = self.computes[self.skip:] or self.computes
        compute = statistics.median(measured) if measured else 0.0
        # what the last re-split cost here: the time spent on it outside the steps, and its steps of
        # notice and settling beyond the steady compute time (before any re-split: a guess, the
        # price of two steps for a new pipeline, of one for notice)
        if self.resplits and self.cost_s is None:
            self.cost_s = self.spent_s + sum(max(0.0, c - compute) for c in self.computes[:self.skip])
        cost = self.cost_s if self.cost_s is not None else (1.0 if ahead else 2.0) * compute
        rows = exchange_rows(strategy, [current.local_batch / compute if compute > 0 else 0.0, cost, ahead])
        speeds = [r[0] for r in rows]
        most_ahead = int(max(r[2] for r in rows))
        lead = most_ahead + RESPLIT_NOTICE_MARGIN if most_ahead else 0
        self.compared = tuple(speeds)
        self.comparisons += 1
        self.verdict, proposed = judge(current.batches, speeds, self.total_steps - step - lead,
                                       max(r[1] for r in rows))
        self.computes = []
        if proposed is None:
            self.skip = 0
            result = current
            self.due = self._next(step, self.interval)
            self.interval = min(2 * self.interval, RESPLIT_MAX_INTERVAL)
        else:
            self.effective = step + lead
            self.skip = lead + RESPLIT_SETTLE
            self.resplits += 1
            self.spent_s, self.cost_s = 0.0, None
            source = current.source if current.source.endswith(", then in training") else \
                f"{current.source}, then in training"
            result = Split(current.global_batch, proposed, current.index, tuple(speeds), source)
            save(result)
            self.interval = RESPLIT_WINDOW
            self.due = self._next(self.effective + RESPLIT_SETTLE, RESPLIT_WINDOW)
        if self.due >= self.total_steps:
            self.due = None
        return result


def save(result: Split, task_dir: str | None = None) -> None:
    """Write ``balance.json`` into the task folder (``DDLCTL_TASK_DIR``), if there is one."""
    folder = task_dir or os.environ.get(envvars.TASK_DIR)
    if not folder:
        return
    record = {**asdict(result), "local_batch": result.local_batch, "offset": result.offset}
    with contextlib.suppress(OSError):  # (a full disk: the report goes without it; training goes on)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "balance.json").write_text(json.dumps(record))
