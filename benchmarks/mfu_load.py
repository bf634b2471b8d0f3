"""A training-step load of known FLOPs for checking MFU end to end (run under ddlctl by
``benchmarks/mfu_check.py``): every step multiplies a batch of ``--batch`` rows by ``--layers``
square ``--size`` matrices, so one sample costs ``2 x size^2 x layers`` FLOPs, exactly. It declares
that with ``ddlctl.declare_flops``, times each step with ``ddlctl.step`` (the GPU synchronised at
the step's end), and writes what it measured itself (FLOPs over the post-warm-up steps' time) to
``--out``. PyTorch on a CUDA GPU (bfloat16) when there is one, numpy on the CPU (float32) otherwise.
"""

from __future__ import annotations

import argparse
import json
import time

import ddlctl

WARMUP = 5  # the report leaves out the first 5 steps of each task: so does this load's own figure


def load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load's shape (also ``mfu_check.py``'s options, passed on to it)."""
    parser.add_argument("--size", type=int, default=8192, help="rows and columns of each square matrix")
    parser.add_argument("--batch", type=int, default=8192, help="samples (rows) per step")
    parser.add_argument("--layers", type=int, default=4, help="matrix products per step")
    parser.add_argument("--steps", type=int, default=400)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_arguments(parser)
    parser.add_argument("--cpu", action="store_true", help="numpy on the CPU even where a GPU is")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    flops_per_sample = 2 * args.size * args.size * args.layers
    try:
        import torch
        gpu = torch.cuda.is_available() and not args.cpu
    except ImportError:
        gpu = False
    if gpu:
        dtype, device = torch.bfloat16, "cuda"
        weights = [torch.randn(args.size, args.size, dtype=dtype, device=device) / args.size ** 0.5
                   for _ in range(args.layers)]
        x = torch.randn(args.batch, args.size, dtype=dtype, device=device)

        def run() -> None:
            y = x
            for w in weights:
                y = y @ w
            torch.cuda.synchronize()
        name, precision = torch.cuda.get_device_name(0), "bfloat16"
    else:
        import numpy as np
        rng = np.random.default_rng(0)
        weights = [rng.standard_normal((args.size, args.size), dtype=np.float32) / args.size ** 0.5
                   for _ in range(args.layers)]
        x = rng.standard_normal((args.batch, args.size), dtype=np.float32)

        def run() -> None:
            y = x
            for w in weights:
                y = y @ w
        name, precision = "cpu", "float32"
    ddlctl.declare_flops(flops_per_sample, precision)
    ddlctl.set_total_steps(args.steps)
    busy = 0.0
    for step in range(args.steps):
        start = time.perf_counter()
        with ddlctl.step(samples=args.batch):
            run()
        if step >= WARMUP:
            busy += time.perf_counter() - start
    own = flops_per_sample * args.batch * (args.steps - WARMUP) / busy
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"device": name, "dtype": precision, "train_flops_per_sample": flops_per_sample,
                   "achieved_flops_per_s": own, "steps": args.steps}, handle)


if __name__ == "__main__":
    main()
