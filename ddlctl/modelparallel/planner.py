"""Model-parallel partition planning: which contiguous run of layers each device holds.

Pure functions over the cost model of :mod:`ddlctl.modelparallel.costmodel` (layers, devices, links,
a plan's predicted step).

Algorithms (all respect memory limits; a model that cannot be placed is refused with the reason):

* ``random`` -- the baseline TensorFlow's native placement amounts to: stage boundaries drawn at
  random (seeded), uniformly among the contiguous splits over the devices in order, redrawn (up
  to 1,000 times) until every stage fits its device's memory.
* ``greedy`` -- the research's, and a second pass: layers are taken in order and each device, in
  order, is filled until it holds its share of the total cost in proportion to its speed
  (``speed_j / sum(speed)``; a layer goes where it overshoots the share less); a layer that would
  overflow the device's memory moves on to the next device, and a device keeps taking layers past
  its share while the layers left need more memory than the devices after it can surely hold
  (their memory less one largest layer each: what filling in order may leave unused). The last
  device takes the rest. That balances the stages: what a pipeline needs. Without micro-batching
  the step is the sum of the stages, least with the most on the fastest devices, so there a second
  pass fills the same way with shares of the model's *memory* given out from the fastest device
  down (each up to its memory; a slower device takes only what the faster ones cannot hold), and
  the plan the cost model predicts faster of the two is taken. One or two passes, O(layers +
  devices).
* ``optimal`` -- dynamic programming over contiguous partitions, exact for the cost model with the
  devices in the given order: with micro-batching it minimises the bottleneck stage time (ties:
  the smaller sum), without it the sum of stage times (the updates' overhang, a small term, is
  added to its predicted step but not minimised). O(devices x layers^2), vectorised.
* ``single`` -- every layer on the fastest device: the baseline row (infeasible when it does not
  fit its memory; without memory limits it is the best sequential plan).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ddlctl.contract.stats import percentile
from ddlctl.modelparallel.costmodel import (
    Device,
    Layer,
    Link,
    PartitionPlan,
    PrefixSums,
    message_latency,
    messages,
    step_time,
)

ALGORITHMS: tuple[str, ...] = ("random", "greedy", "optimal")
RANDOM_TRIES = 1000


def _plan(algorithm: str, model: PrefixSums, devices: Sequence[Device], cuts: Sequence[int], link: Link,
          microbatches: int, notes: Sequence[str] = ()) -> PartitionPlan:
    """The plan whose stage ``j`` holds layers ``cuts[j]..cuts[j+1]-1`` (``cuts`` has devices+1
    entries, from 0 to the number of layers, non-decreasing)."""
    stages = tuple(model.stage(d, cuts[j], cuts[j + 1] - 1, link, microbatches) for j, d in enumerate(devices))
    times = [s.time_s for s in stages if s.layers]
    over = [s for s in stages if s.memory_bytes > s.memory_limit]
    if over:
        worst = over[0]
        return PartitionPlan(algorithm, microbatches, stages, feasible=False,
                             reason=f"{worst.device} would need {_gib(worst.memory_bytes)} of its "
                                    f"{_gib(worst.memory_limit)}", notes=tuple(notes))
    step = step_time([s.time_s for s in stages], microbatches, [s.update_s for s in stages]) + link.dispatch_s
    return PartitionPlan(algorithm, microbatches, stages, step, max(times, default=0.0), sum(times),
                         notes=tuple(notes))


def _gib(value: float) -> str:
    return "unlimited memory" if value == float("inf") else f"{value / 2**30:.2f} GiB"


def _refuse(algorithm: str, microbatches: int, reason: str) -> PartitionPlan:
    return PartitionPlan(algorithm, microbatches, feasible=False, reason=reason)


def _check(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int) -> None:
    if not layers:
        raise ValueError("the model has no layers to place")
    if not devices:
        raise ValueError("there is no device to place layers on")
    if microbatches < 1:
        raise ValueError(f"micro-batches must be at least 1, not {microbatches}")
    for device in devices:
        if not device.speed > 0:
            raise ValueError(f"device {device.name}: speed must be positive, not {device.speed}")


def unplaceable(layers: Sequence[Layer], devices: Sequence[Device]) -> str | None:
    """Why no plan can exist for ``layers`` on ``devices`` from memory alone (their sizes suffice:
    no cost needs measuring to know it), or None."""
    return fits_at_all(PrefixSums(layers), devices) if layers and devices else None


def fits_at_all(model: PrefixSums, devices: Sequence[Device]) -> str | None:
    """Why no plan can exist (a layer larger than every device; more memory needed than all
    devices have), or None."""
    biggest = max(devices, key=lambda d: d.memory_bytes)
    for layer in model.layers:
        need = layer.param_bytes + layer.act_bytes
        if need > biggest.memory_bytes:
            return (f"layer {layer.name} alone needs {_gib(need)}, more than any device has "
                    f"(the largest, {biggest.name}, has {_gib(biggest.memory_bytes)})")
    total = model.mem[-1]
    room = sum(d.memory_bytes for d in devices)
    if total > room:
        return f"the model needs {_gib(total)} and all devices together have {_gib(room)}"
    return None


def plan_random(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1, link: Link = Link(),
                seed: int = 0) -> PartitionPlan:
    """Random contiguous boundaries (seeded), redrawn until the stages fit their memory."""
    _check(layers, devices, microbatches)
    model = PrefixSums(layers)
    why = fits_at_all(model, devices)
    if why:
        return _refuse("random", microbatches, why)
    rng = random.Random(seed)
    n, k = len(layers), len(devices)
    for attempt in range(RANDOM_TRIES):
        inner = sorted(rng.randint(0, n) for _ in range(k - 1))
        plan = _plan("random", model, devices, [0, *inner, n], link, microbatches,
                     [f"seed {seed}, draw {attempt + 1}"])
        if plan.feasible:
            return plan
    return _refuse("random", microbatches, f"no random split of {RANDOM_TRIES} fitted the devices' memory")


#: random placement's draws whose mean is its expected step (``partition``'s "vs random")
RANDOM_DRAWS = 200


@dataclass(frozen=True)
class RandomSpread:
    """Random placement over many draws: the mean predicted step (its expected step) and the 10th
    and 90th percentiles of the draws' steps."""

    draws: int
    mean_s: float
    p10_s: float
    p90_s: float

    def to_dict(self) -> dict[str, object]:
        return {"draws": self.draws, "mean_step_s": self.mean_s, "p10_step_s": self.p10_s, "p90_step_s": self.p90_s}


def random_spread(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1, link: Link = Link(),
                  draws: int = RANDOM_DRAWS) -> RandomSpread | None:
    """Random placement's predicted step over ``draws`` seeds (0, 1, ...: each the plan
    :func:`plan_random` gives for that seed). One seed's plan says little: on 3 devices of speeds
    1 : 1 : 0.59 a single draw ranged from 1.04x to 1.44x the optimal step (10-90%), the mean of 5
    from 1.09x to 1.39x. None where seed 0 finds no split that fits (the rest would not either,
    after as long a search each)."""
    steps = []
    for seed in range(max(1, draws)):
        drawn = plan_random(layers, devices, microbatches, link, seed)
        if not drawn.feasible:
            if seed == 0:
                return None
            continue
        steps.append(drawn.step_time_s)
    ordered = sorted(steps)
    return RandomSpread(len(steps), sum(steps) / len(steps), percentile(ordered, 10), percentile(ordered, 90))


def plan_greedy(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1,
                link: Link = Link(), research_only: bool = False) -> PartitionPlan:
    """The research's greedy pass: fill each device in order up to its speed-proportional share of
    the cost, within memory (a balanced pipeline). Without micro-batching (the step is the sum of
    the stages) also a second one-pass fill, the fastest devices first, each up to its memory, the
    slower ones only what the faster cannot hold; then the plan the cost model predicts faster.
    ``research_only``: the research's pass alone (to measure it)."""
    _check(layers, devices, microbatches)
    model = PrefixSums(layers)
    why = fits_at_all(model, devices)
    if why:
        return _refuse("greedy", microbatches, why)
    total_speed = sum(d.speed for d in devices)
    total_cost = model.cost[-1] + model.update[-1]
    passes = [(_fill(model, devices, [total_cost * d.speed / total_speed for d in devices], "cost"),
               "balanced by speed (the research's greedy)")]
    if microbatches == 1 and not research_only:
        passes.append((_fill(model, devices, _fastest_first_bytes(model, devices), "bytes"),
                       "no micro-batches: the fastest devices filled first"))
    n = len(layers)
    plans = [_plan("greedy", model, devices, cuts, link, microbatches, [note])
             for cuts, note in passes if cuts[-1] == n]
    best = fastest(plans)
    if best is None:
        stuck = passes[0][0][-1]
        return _refuse("greedy", microbatches, f"greedy filling ran out of device memory at layer "
                                               f"{layers[stuck].name} ({stuck + 1} of {n})")
    return best


def fastest(plans: Sequence[PartitionPlan]) -> PartitionPlan | None:
    """The feasible plan with the shortest predicted step (a tie: the exact one, then greedy's),
    None when none is feasible."""
    rank = {"optimal": 0, "greedy": 1, "random": 2}
    feasible = [p for p in plans if p.feasible]
    return min(feasible, key=lambda p: (p.step_time_s or math.inf, rank.get(p.algorithm, 3)), default=None)


def _fastest_first_bytes(model: PrefixSums, devices: Sequence[Device]) -> list[float]:
    """Bytes each device should hold for a sequential step: the model's memory given out to the
    devices from the fastest down (ties: in order), each up to its memory."""
    left = float(model.mem[-1])
    quota = [0.0] * len(devices)
    for j in sorted(range(len(devices)), key=lambda j: -devices[j].speed):
        quota[j] = min(left, devices[j].memory_bytes)
        left -= quota[j]
    return quota


def _fill(model: PrefixSums, devices: Sequence[Device], shares: Sequence[float], unit: str) -> list[int]:
    """One pass over the layers in order: each device in order takes layers up to its share (of the
    cost, ``unit`` "cost", a layer going where it overshoots less; or of the bytes, "bytes", never
    over), within its memory; a layer that would overflow the memory moves on to the next device,
    and a device keeps taking layers past its share while the layers left need more memory than the
    devices after it can surely hold (their memory less one largest layer each: what filling in
    order may leave unused). The last device takes the rest. The cuts (the last one short of the
    layers when they outlast the devices: where it stopped)."""
    layers, n = model.layers, len(model.layers)
    largest = max(layer.param_bytes + layer.act_bytes for layer in layers)
    room_after = [sum(max(0.0, d.memory_bytes - largest) for d in devices[j + 1:]) for j in range(len(devices))]
    cuts, i = [0], 0
    for j, device in enumerate(devices):
        start, cost, mem = i, 0.0, 0
        last_device = j == len(devices) - 1
        while i < n:
            layer = layers[i]
            need = layer.param_bytes + layer.act_bytes
            if mem + need > device.memory_bytes:
                break  # this layer goes to the next device
            if unit == "cost":
                share_filled = i > start and cost + layer.cost_s / 2 > shares[j]
            else:
                share_filled = mem + need > shares[j]
            if not last_device and share_filled and model.mem[n] - model.mem[i] <= room_after[j]:
                break  # the share is filled and the rest fits after
            cost += layer.cost_s
            mem += need
            i += 1
        cuts.append(i)
    return cuts


def plan_single(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1,
                link: Link = Link()) -> PartitionPlan:
    """Everything on the fastest device (the others empty): the baseline row."""
    _check(layers, devices, microbatches)
    model = PrefixSums(layers)
    fastest = max(range(len(devices)), key=lambda j: devices[j].speed)
    n = len(layers)
    cuts = [0] * (fastest + 1) + [n] * (len(devices) - fastest)
    plan = _plan("single", model, devices, cuts, link, microbatches)
    return plan if plan.feasible else PartitionPlan(
        "single", microbatches, plan.stages, feasible=False,
        reason=f"the whole model does not fit the fastest device: {plan.reason}")


def plan_optimal(layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1,
                 link: Link = Link()) -> PartitionPlan:
    """Exact for the cost model, devices in the given order: minimal bottleneck (micro-batching;
    ties: smaller sum) or minimal sum (no micro-batching), by dynamic programming."""
    import numpy as np

    _check(layers, devices, microbatches)
    model = PrefixSums(layers)
    why = fits_at_all(model, devices)
    if why:
        return _refuse("optimal", microbatches, why)
    n, k = len(layers), len(devices)
    cost = np.asarray(model.cost)
    mem = np.asarray(model.mem, dtype=np.float64)
    # boundary[i]: what a stage ending before layer i sends on (nothing after the last layer), its
    # bytes and its messages' latency apart (a device's own message cost replaces the latency)
    boundary, latency = np.zeros(n + 1), np.zeros(n + 1)
    for i in range(1, n):
        boundary[i] = 2.0 * layers[i - 1].act_bytes / link.bandwidth_bps
        latency[i] = 2.0 * microbatches * link.latency_s
    lo = np.arange(n + 1)[:, None]  # a stage holds layers lo..hi-1
    hi = np.arange(n + 1)[None, :]
    nonempty, empty = lo < hi, lo == hi
    span_cost = np.where(nonempty, cost[None, :] - cost[:, None], 0.0)
    span_mem = np.where(nonempty, mem[None, :] - mem[:, None], 0.0)
    columns = np.arange(n + 1)

    kinds: dict[tuple[float, float, float], tuple] = {}  # devices of one kind share their matrices
    per_message = microbatches * np.where(lo > 0, messages(1), messages(0))  # by the stage's first layer

    def stage_of(device: Device):  # noqa: ANN202 - (time of layers lo..hi-1 on it, where they do NOT fit)
        key = (device.speed, device.memory_bytes, device.message_s)
        if key not in kinds:
            sends = boundary + latency * (message_latency(link, device) > 0)
            time_ = np.where(nonempty, span_cost / device.speed + sends[None, :] + per_message * device.message_s, 0.0)
            kinds[key] = (time_, ~(empty | (nonempty & (span_mem <= device.memory_bytes))))
        return kinds[key]

    buffer = np.empty((n + 1, n + 1))

    def min_sum(cap: float) -> tuple[float, list[int]]:
        """Smallest summed stage time with every stage <= ``cap``, and its cuts (DP)."""
        total = np.where(columns == 0, 0.0, np.inf)  # layers 0..i-1 on the devices so far
        choice = np.zeros((k, n + 1), dtype=np.int64)
        excluded: dict[tuple[float, float, float], object] = {}
        for j, device in enumerate(devices):
            time_, misfit = stage_of(device)
            key = (device.speed, device.memory_bytes, device.message_s)
            if key not in excluded:
                excluded[key] = misfit | (time_ > cap) if np.isfinite(cap) else misfit
            np.add(total[:, None], time_, out=buffer)
            np.copyto(buffer, np.inf, where=excluded[key])
            choice[j] = buffer.argmin(axis=0)
            total = buffer[choice[j], columns]
        cuts = [n]
        for j in range(k - 1, -1, -1):
            cuts.append(int(choice[j][cuts[-1]]))
        return float(total[n]), [0, *reversed(cuts[:-1])]

    micro = microbatches > 1
    cap = np.inf
    if micro:  # first the smallest possible bottleneck, then the smallest sum under it
        best = np.where(columns == 0, 0.0, np.inf)
        for device in devices:
            time_, misfit = stage_of(device)
            np.maximum(best[:, None], time_, out=buffer)
            np.copyto(buffer, np.inf, where=misfit)
            best = buffer.min(axis=0)
        cap = float(best[n]) * (1 + 1e-12)
    total, cuts = min_sum(cap)
    if not np.isfinite(total):
        return _refuse("optimal", microbatches, "no contiguous split fits the devices' memory")
    objective = "the bottleneck stage (micro-batching)" if micro else "the sum of stage times"
    return _plan("optimal", model, devices, cuts, link, microbatches, [f"minimises {objective}"])


def plan_counts(layers: Sequence[Layer], devices: Sequence[Device], counts: Sequence[int], microbatches: int = 1,
                link: Link = Link(), algorithm: str = "given") -> PartitionPlan:
    """The cost model's prediction for a plan given as layers per device (in device order)."""
    _check(layers, devices, microbatches)
    if len(counts) != len(devices) or sum(counts) != len(layers) or min(counts) < 0:
        raise ValueError(f"the plan {list(counts)} does not place {len(layers)} layers on {len(devices)} devices")
    cuts = [0]
    for count in counts:
        cuts.append(cuts[-1] + int(count))
    return _plan(algorithm, PrefixSums(layers), devices, cuts, link, microbatches)


def gap(plans: Sequence[PartitionPlan], algorithm: str = "greedy", reference: str = "optimal") -> float | None:
    """How much longer ``algorithm``'s predicted step is than ``reference``'s (0.05: 5% longer),
    among ``plans``; None unless both are there and feasible."""
    steps = {p.algorithm: p.step_time_s for p in plans if p.feasible and p.step_time_s}
    if algorithm not in steps or reference not in steps:
        return None
    return steps[algorithm] / steps[reference] - 1.0


def plan(algorithm: str, layers: Sequence[Layer], devices: Sequence[Device], microbatches: int = 1,
         link: Link = Link(), seed: int = 0) -> PartitionPlan:
    """The plan of one algorithm (``random``, ``greedy``, ``optimal`` or ``single``)."""
    if algorithm == "random":
        return plan_random(layers, devices, microbatches, link, seed)
    if algorithm == "greedy":
        return plan_greedy(layers, devices, microbatches, link)
    if algorithm == "optimal":
        return plan_optimal(layers, devices, microbatches, link)
    if algorithm == "single":
        return plan_single(layers, devices, microbatches, link)
    raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join((*ALGORITHMS, 'single'))}")
