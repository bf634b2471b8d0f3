"""The cost model partition planning uses (no TensorFlow here):

* a model is a sequence of layers, each with its forward+backward time on a reference device
  (``cost_s``), the bytes of its parameters and optimizer state (``param_bytes``) and of its output
  activations for one whole batch (``act_bytes``: what a stage boundary sends forward, and its
  gradient back; what the stage keeps for the backward pass);
* a device has a speed relative to the reference (time = cost / speed), a memory limit and, where
  measured, what one message costs it (``message_s``); consecutive stages talk over a link
  (``bandwidth_bps``, ``latency_s``).

A plan gives each device in order a contiguous, possibly empty, run of layers. With ``m``
micro-batches (GPipe-style: the batch split in ``m``, stage *i* of micro-batch *k+1* overlapping
stage *i+1* of micro-batch *k*), the predicted step time is::

    T = sum(stage times) / m + (m - 1) * max(stage times) / m

where a stage's time is its compute (sum of its layers' costs / speed) plus sending its output
activation forward and receiving its gradient back (2 x (bytes / bandwidth + m x latency): every
micro-batch crosses the boundary), for the whole batch. With ``m = 1`` that is the sum (a
sequential pipeline); for large ``m`` the slowest stage (the bottleneck) decides.

Where each device's cost of a message is known (``message_s``: measured in place by the launched
chief, a tensor passed back and forth between it and the stage task), a stage also pays, per
micro-batch, for every message it takes part in: its input, its output (the last stage's: the
loss), the gradient it gets back (the last stage: its labels) and, but for the first stage, the
gradient it sends back (:func:`messages`), in place of the link's latency on its sends. A step
also costs a fixed ``dispatch_s`` (the link's, measured in place: sending the step to every stage).
A stage task under a 0.2-CPU quota took 0.8 ms a message where one under 0.6 took 0.2 ms, and
without this term the same plan ran 16% (4 micro-batches) and 21% (8) slower than predicted: the
bottleneck stage's messages lengthen every micro-batch's turn there.

A layer's cost includes the optimizer's update of its weights (``update_s``). A stage updates once
per step, after its last micro-batch's backward pass, while the stages before it still run theirs:
the updates are off the pipeline's critical path, and a stage's time above leaves them out. The
step waits only for what an update overhangs: the update of stage *i* less the backward passes of
the last micro-batch on the stages before it (backward taken as 2/3 of a stage's time), at least
the first stage's whole update. Measured on the built-in ``deep`` model, the update (Adam) is
15-20% of a step; counting it on the critical path overpredicted sequential steps by up to 25%.

A device's memory use is its layers' parameter/optimizer bytes plus their activations (kept for the
backward pass; ``m`` micro-batches of ``1/m`` of the batch each keep as much as the whole batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Layer:
    """One layer of the model as the cost model sees it."""

    name: str
    cost_s: float  # forward + backward + the optimizer's update on the reference device, whole batch
    param_bytes: int = 0  # parameters + optimizer state
    act_bytes: int = 0  # output activations, whole batch
    update_s: float = 0.0  # of cost_s: the optimizer's update (off the pipeline's critical path)


@dataclass(frozen=True)
class Device:
    """A device that can hold a stage: its speed relative to the reference and its memory."""

    name: str
    speed: float = 1.0
    memory_bytes: float = float("inf")
    message_s: float = 0.0  # what one message to or from it costs it (measured in place; 0: unknown)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (unlimited memory as None)."""
        return asdict(self) | {"memory_bytes": None if math.isinf(self.memory_bytes) else self.memory_bytes}

    @classmethod
    def from_dict(cls, data: dict) -> Device:
        """The device :meth:`to_dict` wrote."""
        memory = data.get("memory_bytes")
        return cls(**(data | {"memory_bytes": float("inf") if memory is None else float(memory)}))


@dataclass(frozen=True)
class Link:
    """What a stage boundary costs: bandwidth in bytes/s and a latency per message; and what a step
    costs before any stage computes (``dispatch_s``: sending the step to every stage, measured in
    place by the launched chief; added to every plan's step)."""

    bandwidth_bps: float = float("inf")
    latency_s: float = 0.0
    dispatch_s: float = 0.0


@dataclass(frozen=True)
class Stage:
    """A device and the layers ``first..last`` (inclusive, 0-based) it holds; ``first > last``: none."""

    device: str
    first: int
    last: int
    compute_s: float  # forward and backward passes (the update left out: see update_s)
    comm_s: float
    memory_bytes: int
    memory_limit: float
    update_s: float = 0.0  # the optimizer's update of the stage's weights, once per step

    @property
    def layers(self) -> int:
        return max(0, self.last - self.first + 1)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s


@dataclass(frozen=True)
class PartitionPlan:
    """A plan: its stages (every device in order, empty ones included), the predicted step time
    with ``microbatches``, or why there is none (``feasible`` False, ``reason``)."""

    algorithm: str
    microbatches: int
    stages: tuple[Stage, ...] = ()
    step_time_s: float | None = None
    bottleneck_s: float | None = None
    sum_s: float | None = None
    feasible: bool = True
    reason: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        for stage, full in zip(data["stages"], self.stages, strict=True):
            stage["layers"] = full.layers
            stage["time_s"] = full.time_s
        return data

    def assignment(self) -> list[int]:
        """Stage (device position) of every layer, in layer order."""
        owner: list[int] = []
        for position, stage in enumerate(self.stages):
            owner.extend([position] * stage.layers)
        return owner


#: the share of a stage's time that is its backward pass (forward : backward about 1 : 2 for
#: layers with weights: the input's and the weights' gradients each cost about a forward pass)
BACKWARD_SHARE = 2 / 3


def step_time(stage_times: Sequence[float], microbatches: int, update_times: Sequence[float] = ()) -> float:
    """GPipe-style step time from the stages' whole-batch times (empty stages left out), plus what
    the stages' updates (``update_times``, same order) overhang: a stage's update starts after its
    backward pass of the last micro-batch, the first stage's backward passes end the step."""
    times = [t for t in stage_times if t > 0]
    if not times:
        return 0.0
    m = max(1, microbatches)
    overhang, before = 0.0, 0.0
    for t, update in zip(stage_times, update_times, strict=False):
        if t > 0:
            overhang = max(overhang, update - before)
            before += t * BACKWARD_SHARE / m
    return sum(times) / m + (m - 1) * max(times) / m + overhang


def message_latency(link: Link, device: Device) -> float:
    """The link's latency per message, unless the device's own cost of a message is known (it
    replaces the latency: :func:`messages`)."""
    return 0.0 if device.message_s > 0 else link.latency_s


def messages(first: int) -> int:
    """Messages a stage holding layers ``first``.. takes part in per micro-batch: its input, its
    output, the gradient back (the last stage: its labels) and, unless it holds the first layer,
    the gradient of its input sent back."""
    return 3 + (1 if first > 0 else 0)


class PrefixSums:
    """Prefix sums over the layers: any contiguous run's cost and memory in O(1)."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.layers = list(layers)
        self.cost = [0.0]  # forward + backward (the updates apart)
        self.update = [0.0]
        self.mem = [0]
        for layer in self.layers:
            update = min(max(0.0, layer.update_s), layer.cost_s)
            self.cost.append(self.cost[-1] + layer.cost_s - update)
            self.update.append(self.update[-1] + update)
            self.mem.append(self.mem[-1] + layer.param_bytes + layer.act_bytes)

    def stage(self, device: Device, first: int, last: int, link: Link, microbatches: int = 1) -> Stage:
        n = len(self.layers)
        if first > last:
            return Stage(device.name, first, last, 0.0, 0.0, 0, device.memory_bytes)
        compute = (self.cost[last + 1] - self.cost[first]) / device.speed
        comm = 0.0
        if last < n - 1:  # sends its output forward and gets the gradient back, per micro-batch
            comm = 2.0 * (self.layers[last].act_bytes / link.bandwidth_bps
                          + microbatches * message_latency(link, device))
        comm += microbatches * messages(first) * device.message_s
        update = (self.update[last + 1] - self.update[first]) / device.speed
        return Stage(device.name, first, last, compute, comm, self.mem[last + 1] - self.mem[first], device.memory_bytes,
                     update)
