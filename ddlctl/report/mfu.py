"""Model FLOPs utilisation: the model FLOPs a task achieved per second (``flops.json`` x its
samples/s) over the *dense* peak of the GPUs it trains on (pure).

Peaks are NVIDIA's datasheet figures without 2:4 sparsity (the sparse figure is twice as large and
would halve a reported MFU). A float32 Keras model runs its matrix products in TF32 on Ampere and
newer (TensorFlow's default), so its peak is the TF32 tensor-core figure there and plain FP32 on
older GPUs; float16/bfloat16 models use the 16-bit tensor-core figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlctl.contract.rundir import TASK_FLOPS, TASKS_DIR
from ddlctl.contract.runfolder import load_record
from ddlctl.contract.strategies import facts_of

# (substring of the NVML name, {precision: dense TFLOP/s}); the first match wins, so the more
# specific names come first ("H100 PCIe" before "H100", "L40S" before "L4"). Sources: NVIDIA data
# sheets: H100 (SXM5 / PCIe, 2023), H200 (SXM, 2024), A100 (2021), L40S (2023), L4 (2023),
# A10 (2021), V100 (2020), T4 (2019).
DENSE_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),  # SXM5 ("H100 80GB HBM3")
    ("H200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    ("V100-PCIE", {"fp32": 14.0, "fp16": 112.0}),
    ("V100", {"fp32": 15.7, "fp16": 125.0}),
    ("T4", {"fp32": 8.1, "fp16": 65.0}),
)


def dense_peak_flops(gpu_name: str, dtype: str = "float32") -> float | None:
    """Dense peak FLOP/s of one GPU for a model computing in ``dtype`` (None: a GPU not in the table)."""
    for pattern, peaks in DENSE_TFLOPS:
        if pattern.lower() in gpu_name.lower():
            if dtype in ("float16", "mixed_float16"):
                tflops = peaks.get("fp16")
            elif dtype in ("bfloat16", "mixed_bfloat16"):
                tflops = peaks.get("bf16")
            else:
                tflops = peaks.get("tf32", peaks["fp32"])
            return None if tflops is None else tflops * 1e12
    return None


def task_mfu(flops: Mapping[str, object] | None, samples_per_s: float | None, gpus: Sequence[str]) -> dict:
    """One task's figures: model FLOPs per sample, achieved FLOP/s and MFU over ``gpus`` (the names
    of the GPUs it trains on; none: a CPU host, MFU n/a)."""
    per_sample = float(flops["train_flops_per_sample"]) if flops and flops.get("train_flops_per_sample") else None
    achieved = per_sample * samples_per_s if per_sample is not None and samples_per_s else None
    peaks = [dense_peak_flops(name, str((flops or {}).get("dtype") or "float32")) for name in gpus]
    if not gpus:
        peak, note = None, "n/a: no GPU (CPU host)"
    elif any(p is None for p in peaks):
        peak, note = None, f"n/a: no dense peak known for {', '.join(sorted(set(gpus)))}"
    else:
        peak, note = sum(peaks), None  # type: ignore[arg-type]
    return {"train_flops_per_sample": per_sample, "achieved_flops_per_s": achieved, "peak_flops_per_s": peak,
            "mfu": achieved / peak if achieved is not None and peak else None, "note": note,
            "declared": "declare_flops" in str((flops or {}).get("method"))}


def mfu_rows(run_dir: Path, plan: Mapping, tasks: Sequence[Any], hosts: Sequence[Any]) -> tuple[dict, ...]:
    """Each task that wrote ``flops.json``: achieved model FLOP/s and MFU over the GPUs it trains on
    (its host's, shared with the other training tasks there; a ps chief: every worker's host's)."""
    gpus = {h.host: [g.name or "unknown GPU" for g in h.gpus] for h in hosts}
    flops = {t.name: load_record(run_dir / TASKS_DIR / t.name.replace(":", "-") / TASK_FLOPS) for t in tasks}
    flops = {name: record for name, record in flops.items() if record}
    planned = {t["name"]: t.get("host") for t in plan.get("tasks", [])}
    rows = []
    for task in tasks:
        if task.name not in flops:
            continue
        if facts_of(plan.get("strategy")).asynchronous and task.role == "chief":
            hosts_used = sorted({h for n, h in planned.items() if n.startswith("worker:")})
            names = [g for h in hosts_used for g in gpus.get(h, [])]
        else:
            sharing = sum(1 for n in flops if planned.get(n) == task.host)
            names = gpus.get(task.host, [])[:max(1, len(gpus.get(task.host, [])) // max(1, sharing))]
        rows.append({"task": task.name, **task_mfu(flops[task.name], task.samples_per_s, names)})
    return tuple(rows)
