"""A PyTorch program that steps (matrix products on the GPU, each step timed with ``ddlctl.step``)
and then hangs one of two ways, for ``benchmarks/gpu_hang_check.py``:

* ``--hang kernel``: a kernel that does not end (``torch.cuda._sleep``: the device spins, as an
  NCCL collective does while it waits for a peer), the main thread waiting for it in
  ``torch.cuda.synchronize``;
* ``--hang host``: the main thread waits on an event nobody sets (its GPU idle).

On a host with no CUDA device it runs the same steps on the CPU (``kernel`` then sleeps in a
library call instead).
"""

from __future__ import annotations

import argparse
import threading
import time

import ddlctl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang", choices=("kernel", "host"), required=True)
    parser.add_argument("--steps", type=int, default=30, help="steps made before the hang")
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = args.size if device == "cuda" else 256
    a = torch.randn(size, size, device=device)
    ddlctl.set_total_steps(args.steps * 100)  # not finished: the hang comes long before its last step
    for _ in range(args.steps):
        with ddlctl.step(samples=size):
            for _ in range(20):
                a = torch.tanh(a @ a)
            if device == "cuda":
                torch.cuda.synchronize()
            time.sleep(0.05)
    print(f"HANG {args.hang} on {device}", flush=True)
    if args.hang == "kernel" and device == "cuda":
        torch.cuda._sleep(2**40)  # ~10 min of spinning at 2 GHz
        torch.cuda.synchronize()
    elif args.hang == "kernel":
        time.sleep(3600)
    else:
        threading.Event().wait()


if __name__ == "__main__":
    main()
