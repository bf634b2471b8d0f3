"""Model FLOPs per training sample, counted from a Keras model's layers (task side).

The model FLOPs of MFU (as PaLM and MegaScale count them): the arithmetic the model needs, not
what the hardware happened to run (no recomputation, no padding). A forward pass costs 2 FLOPs per
multiply-accumulate of its Dense and convolution layers (the rest is negligible beside them);
training costs 3 forward passes (forward, and backward for activations and for weights).
The built-in workload and ddlctl's ``model.fit`` hook write ``flops.json`` in the task directory;
the report turns it into achieved FLOP/s and, on GPUs, MFU.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ddlctl.contract import envvars
from ddlctl.contract.rundir import TASK_FLOPS

#: Training FLOPs per forward FLOP (forward + backward for activations + backward for weights).
TRAIN_FACTOR = 3
METHOD = "3 x forward; forward = 2 x multiply-accumulates of Dense and convolution layers"


def _shape(value: object) -> tuple[int | None, ...]:
    return tuple(None if d is None else int(d) for d in getattr(value, "shape", ()))


def layer_flops(layer: object) -> int:
    """Forward FLOPs per sample of one Keras layer (0 for layers without multiply-accumulates)."""
    kind = type(layer).__name__
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return 0
    weights = math.prod(d or 0 for d in _shape(kernel))
    if kind in ("Dense", "EinsumDense"):
        return 2 * weights
    if kind in ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D"):
        # the kernel (k..., inputs per group, outputs) is applied at every output position of a sample
        output = _shape(getattr(layer, "output", None))[1:-1]  # (batch, positions..., channels)
        return 2 * weights * math.prod(output) if output and None not in output else 0  # type: ignore[arg-type]
    return 0


def model_flops(model: object) -> tuple[int, int]:
    """(forward FLOPs per sample, layers counted) of a Keras model, nested models included."""
    total = counted = 0
    for layer in getattr(model, "layers", ()):
        if getattr(layer, "layers", None):
            inner, n = model_flops(layer)
            total, counted = total + inner, counted + n
            continue
        flops = layer_flops(layer)
        if flops:
            total, counted = total + flops, counted + 1
    return total, counted


def _declared(path: Path) -> bool:
    try:
        return "declare_flops" in str(json.loads(path.read_text()).get("method"))
    except (OSError, ValueError, AttributeError):
        return False


def record_model_flops(model: object, task_dir: str | None = None) -> dict | None:
    """Write ``flops.json`` for ``model`` in the task directory (``$DDLCTL_TASK_DIR``); the record,
    or None outside ddlctl, for a model with no layer counted, or when the program declared its own
    count (:func:`declare_flops`). Never raises: FLOPs are a figure
    of the report, not a reason to stop training."""
    folder = task_dir or os.environ.get(envvars.TASK_DIR)
    try:
        if folder and _declared(Path(folder) / TASK_FLOPS):
            return None  # the program's own count stands
        forward, layers = model_flops(model)
        if not folder or not forward:
            return None
        dtype = getattr(getattr(model, "dtype_policy", None), "compute_dtype", None) or "float32"
        record = {"train_flops_per_sample": TRAIN_FACTOR * forward, "forward_flops_per_sample": forward,
                  "layers_counted": layers, "dtype": str(dtype), "method": METHOD}
        (Path(folder) / TASK_FLOPS).write_text(json.dumps(record) + "\n")
        return record
    except Exception:  # noqa: BLE001 - a layer of a kind never seen must not stop training
        return None


#: Compute dtypes whose dense peak the MFU table knows (the rest count as float32: TF32 on Ampere+).
DTYPES = ("float32", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16")


def declare_flops(train_flops_per_sample: float, dtype: str = "float32", task_dir: str | None = None) -> dict | None:
    """Write ``flops.json`` with the model FLOPs one training sample costs, as the program counts them
    (a model that is not Keras, a custom loop, or a count of its own replacing ddlctl's); the
    record, or None outside ddlctl (or where the disk refused it). ``dtype``: the precision the
    matrix products run in, which picks the dense peak MFU divides by (one of :data:`DTYPES`)."""
    if not (isinstance(train_flops_per_sample, (int, float)) and math.isfinite(train_flops_per_sample)
            and train_flops_per_sample > 0):
        raise ValueError(f"train_flops_per_sample must be a positive number, not {train_flops_per_sample!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: one of {', '.join(DTYPES)}")
    folder = task_dir or os.environ.get(envvars.TASK_DIR)
    if not folder:
        return None
    record = {"train_flops_per_sample": float(train_flops_per_sample), "forward_flops_per_sample": None,
              "layers_counted": None, "dtype": dtype, "method": "declared by the program (ddlctl.declare_flops)"}
    try:
        (Path(folder) / TASK_FLOPS).write_text(json.dumps(record) + "\n")
    except OSError:
        return None  # (a full disk: the report goes without MFU; training goes on)
    return record
