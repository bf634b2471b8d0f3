"""Planning a model's stages from inside a ``--strategy model`` chief, over the stage tasks it is
connected to: the plan ``ddlctl launch --partition`` gave, else the one a restarted job kept, else
the ``greedy`` or the ``optimal`` plan for the devices as measured in place, whichever the cost
model predicts faster. Used by the built-in workload and by user programs through
:func:`ddlctl.modelparallel.plan`. Imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.errors import UserError


@dataclass(frozen=True)
class StagePlan:
    """Layers per stage task, how they were chosen (``given``, ``resumed``, ``greedy``,
    ``optimal``) and, but
    for a resumed plan, the cost model's prediction (step time with the dispatch cost, each stage's
    time, the measured link)."""

    counts: list[int]
    how: str
    predicted: dict | None = None


def cost_inputs(model: object, stage_devices: Sequence[str], batch_size: int, microbatches: int) -> tuple[list, list]:
    """The cost model's layers (``model`` profiled here, with the run's batch and micro-batches) and
    devices: memory from ``$DDLCTL_DEVICES``; speed measured in place, the whole model's step timed
    on each stage task against this process (:func:`ddlctl.modelparallel.profile.device_speeds`),
    else from the GFLOP/s ``--speeds`` gave (relative to this process's, measured here with the
    same kernel), else the declared relative speeds."""
    from ddlctl.modelparallel.planner import Device
    from ddlctl.modelparallel.profile import device_speeds, profile, reference_step

    n_devices = len(stage_devices)
    described = json.loads(os.environ.get(envvars.DEVICES) or "[]")
    if len(described) != n_devices:
        described = [{} for _ in range(n_devices)]
    speeds = [float(d.get("speed") or 1.0) for d in described]
    reference = reference_step(model, batch_size, microbatches)  # (traced once for both)
    layers = profile(model, batch_size, repeats=3, microbatches=microbatches, reference=reference)
    in_place = device_speeds(model, list(stage_devices), batch_size, microbatches, reference=reference)
    if in_place:
        speeds = in_place
        print("stage speeds measured in place (the model's step on each stage task, relative to this task): "
              + ", ".join(f"{s:.2f}" for s in speeds), flush=True)
    elif described and all(d.get("gflops") for d in described):
        from ddlctl.task.devbench import local_gflops

        reference = local_gflops()
        speeds = [float(d["gflops"]) / reference for d in described]
        print(f"measured stage speeds relative to this task's {reference:,.1f} GFLOP/s: "
              + ", ".join(f"{s:.2f}" for s in speeds), flush=True)
    devices = [Device(d.get("name") or f"worker:{i}", speed, float(d.get("memory_bytes") or float("inf")))
               for i, (d, speed) in enumerate(zip(described, speeds, strict=True))]
    return layers, devices


def measured_link(stage_devices: Sequence[str], layers: list, microbatches: int) -> tuple[object, list[float]]:
    """The link between stage tasks as TensorFlow moves a micro-batch's activation, with a step's
    fixed dispatch cost (see :func:`ddlctl.modelparallel.measure_link`), and what a message costs
    each stage task (:func:`ddlctl.modelparallel.connect.message_costs`: the cost model charges
    those in place of the link's latency)."""
    from ddlctl.modelparallel.connect import measure_link, message_costs
    from ddlctl.modelparallel.planner import Link

    sizes = sorted(layer.act_bytes for layer in layers) or [4]
    latency, bandwidth, dispatch = measure_link(stage_devices, sizes[len(sizes) // 2] // max(1, microbatches))
    costs = message_costs(stage_devices)
    print(f"stage link as TensorFlow moves tensors: {latency * 1e3:.2f} ms per message + "
          f"{bandwidth / 1e9:.2f} GB/s; {dispatch * 1e3:.1f} ms to dispatch a step; a message costs the stage "
          f"tasks " + ", ".join(f"{c * 1e3:.2f}" for c in costs) + " ms", flush=True)
    return Link(bandwidth, latency, dispatch), costs


def measure_in_place(model: object, stage_devices: Sequence[str], batch_size: int,
                     microbatches: int) -> tuple[list, list, object]:
    """What the chief plans with: the layers (``model`` profiled here), the stage devices (speeds
    and message costs measured in place, memory as ddlctl described them) and the link, as
    :func:`cost_inputs` and :func:`measured_link` measure them."""
    layers, devices = cost_inputs(model, stage_devices, batch_size, microbatches)
    link, costs = measured_link(stage_devices, layers, microbatches)
    devices = [dataclasses.replace(device, message_s=cost) for device, cost in zip(devices, costs, strict=True)]
    return layers, devices, link


def parse_counts(text: str) -> list[int]:
    """``"5,5,4"`` (``--partition`` / ``$DDLCTL_PARTITION``) as layer counts."""
    try:
        return [int(c) for c in str(text).split(",")]
    except ValueError:
        raise UserError(f"the partition {text!r} is not a comma-separated list of layer counts",
                        "give e.g. 5,5,4, or a plan file to ddlctl launch --partition") from None


def plan_stages(model: object, stage_devices: Sequence[str], batch_size: int, microbatches: int = 1,
                partition: str | None = None, checkpoint_dir: str | None = None, predict: bool = True) -> StagePlan:
    """Layers per stage: ``partition`` (``"5,5,4"``), else the plan kept in ``checkpoint_dir`` by
    an earlier attempt of this job (a restart resumes its plan without re-measuring), else the
    greedy or the optimal plan, whichever the cost model predicts faster (:func:`plan_fastest`),
    for this model over the devices ddlctl described (:func:`cost_inputs`) and the link measured
    between them. A new plan is kept in ``checkpoint_dir`` when one is given. A
    given plan is still measured, to predict its step time, unless ``predict`` is false (that
    saves the profile: 1-3 s for a small model)."""
    from ddlctl.modelparallel.planner import plan_counts

    kept = Path(checkpoint_dir or "") / "partition.json"
    if not partition and checkpoint_dir and kept.is_file():
        return StagePlan([int(c) for c in json.loads(kept.read_text())["partition"]], "resumed")
    if partition and not predict:
        return _kept(StagePlan(parse_counts(partition), "given"), checkpoint_dir)
    layers, devices, link = measure_in_place(model, stage_devices, batch_size, microbatches)
    if partition:
        counts, how = parse_counts(partition), "given"
        if len(counts) != len(devices) or sum(counts) != len(layers) or min(counts) < 0:
            return StagePlan(counts, how)  # the Pipeline says what is wrong with it
        planned = plan_counts(layers, devices, counts, microbatches, link)
    else:
        planned = plan_fastest(layers, devices, microbatches, link)
        counts, how = [stage.layers for stage in planned.stages], planned.algorithm
    predicted = {"step_s": planned.step_time_s or 0.0, "dispatch_s": link.dispatch_s,
                 "stage_s": [stage.time_s for stage in planned.stages],
                 "message_s": [device.message_s for device in devices],
                 "link": {"latency_s": link.latency_s,
                          "bandwidth_bps": link.bandwidth_bps if math.isfinite(link.bandwidth_bps) else None}}
    print(f"predicted step time of the {how} plan {counts}: {predicted['step_s'] * 1e3:.1f} ms", flush=True)
    return _kept(StagePlan(counts, how, predicted), checkpoint_dir)


def plan_fastest(layers: list, devices: list, microbatches: int, link: object) -> object:
    """The greedy and the optimal plan, and of the two the one the cost model predicts faster, as
    ``ddlctl partition`` chooses (:func:`ddlctl.modelparallel.planner.fastest`); the gap between them
    said when it is 5% or more."""
    from ddlctl.modelparallel.planner import fastest, gap, plan_greedy, plan_optimal

    greedy = plan_greedy(layers, devices, microbatches, link)
    if not greedy.feasible:
        raise UserError(f"cannot place the model on the {len(devices)} stage task(s): {greedy.reason}",
                        "add devices or memory (memory= in the hosts file), or use a smaller model")
    optimal = plan_optimal(layers, devices, microbatches, link)
    slower = gap([greedy, optimal])
    if slower is not None and slower >= 0.05:
        print(f"greedy's plan is predicted {slower:.0%} slower than the optimal one: running the optimal plan",
              flush=True)
    return fastest([greedy, optimal]) or greedy


def _kept(planned: StagePlan, checkpoint_dir: str | None) -> StagePlan:
    """``planned``, kept in ``checkpoint_dir`` (when given) for a restart to resume."""
    if checkpoint_dir:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        (Path(checkpoint_dir) / "partition.json").write_text(json.dumps({"partition": planned.counts}) + "\n")
    return planned
