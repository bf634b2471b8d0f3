"""The model strategy's stages in the report: what the chief recorded in its ``stages.json`` (the
plan, each stage's layers, where its variables and matrix products were, its own work per step)
with each stage task's CPU from telemetry."""

from __future__ import annotations

from ddlctl.contract.stats import mean


def stage_rows(recorded: dict, procs: dict, step_s: float | None) -> tuple[dict, ...]:
    """The model strategy's stages as the chief recorded them (``recorded``: its ``stages.json``),
    with each stage task's mean CPU % from telemetry, its share of the matmuls, its own work per
    step as the chief measured it at the end (``busy_s``) and the rest of the median step: its idle
    (bubble) share."""
    ops = recorded.get("matmul_ops") or {}
    busy = list(recorded.get("busy_s") or [])
    # the plan's stages, empty ones included; the recorded stages are the non-empty ones
    planned = (recorded.get("predicted") or {}).get("stage_s") or []
    counts = list(recorded.get("partition") or [])
    predicted = [t for t, c in zip(planned, counts, strict=False) if c] if len(planned) == len(counts) else []
    rows = []
    for i, stage in enumerate(recorded.get("stages") or []):
        device = str(stage.get("device", ""))
        task = device.split("/job:")[-1].split("/")[0] + ":" + device.split("/task:")[-1].split("/")[0] \
            if "/task:" in device else device
        cpu = procs.get(task, ((), ()))[0]
        layers = list(stage.get("layers") or [])
        rows.append({"task": task, "device": device, "layers": len(layers),
                     "first": layers[0] if layers else None, "last": layers[-1] if layers else None,
                     "variables_on_stage": stage.get("variable_devices") == [device],
                     "matmuls": ops.get(device.split("/device:")[0], 0), "cpu_mean": mean(cpu),
                     "busy_s": busy[i] if i < len(busy) else None,
                     "idle_share": max(0.0, 1.0 - busy[i] / step_s) if i < len(busy) and step_s else None,
                     "predicted_s": predicted[i] if i < len(predicted) else None})
    return tuple(rows)


def stage_plan_of(recorded: dict, step_s: float | None) -> dict | None:
    """The model strategy's plan (``recorded``: the chief's ``stages.json``): how it was chosen, the
    cost model's predicted step time (with the link TensorFlow showed between the stages) against
    the measured median, and the error; None when the chief recorded no plan."""
    if not recorded.get("partition"):
        return None
    predicted = recorded.get("predicted") or {}
    step_predicted = predicted.get("step_s")
    return {"partition": list(recorded["partition"]), "how": recorded.get("how"),
            "microbatches": recorded.get("microbatches"), "predicted_step_s": step_predicted,
            "measured_step_s": step_s, "link": predicted.get("link"), "dispatch_s": predicted.get("dispatch_s"),
            "message_s": predicted.get("message_s"),
            "error": (step_predicted - step_s) / step_s if step_predicted and step_s else None}
