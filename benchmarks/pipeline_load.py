"""A training load whose input is made on the CPU and whose step computes on the device, run under
ddlctl by ``benchmarks/pipeline_gpu.py`` to measure where pipelining pays with a GPU computing.

Input: each step's batch is cut from a pool of uint8 images (random crop, flip, brightness and
contrast jitter repeated ``--passes`` times, normalised, NCHW float32), the same batch for step k
in every mode (seeded by k). Step: a small CNN trained on it (PyTorch, bfloat16 autocast, SGD) on
a CUDA GPU; without one, a numpy two-layer classifier on the CPU (so the load runs anywhere).

Execution, as the built-in TensorFlow workload's:
- ``linear``: the batch is made, then the step runs; input and compute strictly alternate;
- ``pipelined``: ``--threads`` threads make the next batches (``--threads`` + ``--prefetch``
  ahead) while the device computes: ``--threads 1`` is overlap alone, more adds the parallel map.

Each step is timed with ``ddlctl.step``; ``timer.input_done()`` marks when its batch was in hand,
so the report's input share is the wait for input. ``--calibrate`` instead times the input alone
(one thread, per pass) and the step alone and prints them as JSON. ``--out``: the final loss.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import ddlctl

POOL, IMAGE, CROP, CLASSES = 1024, 96, 80, 10
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load's shape (also ``pipeline_gpu.py``'s options, passed on to it)."""
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=128, help="the CNN's first convolution's channels")
    parser.add_argument("--seed", type=int, default=0)


class Batches:
    """Step k's batch, made on the CPU: the same for a given (seed, k) whichever thread makes it."""

    def __init__(self, batch: int, seed: int, passes: int) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (POOL, IMAGE, IMAGE, 3), dtype=np.uint8)
        self.labels = rng.integers(0, CLASSES, POOL)
        self.batch, self.seed, self.passes = batch, seed, passes

    def __call__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.seed, k))
        ids = rng.integers(0, POOL, self.batch)
        top, left = rng.integers(0, IMAGE - CROP + 1, 2)
        crop = self.images[ids, top:top + CROP, left:left + CROP, :]
        flip = rng.random(self.batch) < 0.5
        crop[flip] = crop[flip, :, ::-1, :]
        x = crop.astype(np.float32) * np.float32(1 / 255)
        for _ in range(self.passes):  # jitter: the input's cost, in passes over the batch
            scale = rng.uniform(0.9, 1.1, (self.batch, 1, 1, 1)).astype(np.float32)
            shift = rng.uniform(-0.05, 0.05, (self.batch, 1, 1, 1)).astype(np.float32)
            x = np.clip(x * scale + shift, 0.0, 1.0)
        x = (x - MEAN) / STD
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), self.labels[ids]


def gpu_step(width: int) -> tuple[Callable[[np.ndarray, np.ndarray], float], str] | None:
    """A CNN's training step on the CUDA GPU (None without one): copy in, forward, backward, update;
    returns the loss (which waits for the GPU)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from torch import nn

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # the first steps tune; the report leaves out the warm-up
    layers, channels = [], 3
    for out, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (4 * width, 2)):
        layers += [nn.Conv2d(channels, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
        channels = out
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, CLASSES))
    net = net.cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def run(x: np.ndarray, y: np.ndarray) -> float:
        images = torch.from_numpy(x).pin_memory().cuda(non_blocking=True).to(memory_format=torch.channels_last)
        labels = torch.from_numpy(y).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.item())
    return run, torch.cuda.get_device_name(0)


def cpu_step(width: int) -> tuple[Callable[[np.ndarray, np.ndarray], float], str]:
    """A two-layer classifier's training step in numpy (no GPU here): hidden layer of ``width``."""
    rng = np.random.default_rng(0)
    features = 3 * CROP * CROP // 16  # 4x4 average pooling first, as a stem would
    w1 = rng.standard_normal((features, width), dtype=np.float32) / features ** 0.5
    w2 = rng.standard_normal((width, CLASSES), dtype=np.float32) / width ** 0.5

    def run(x: np.ndarray, y: np.ndarray) -> float:
        nonlocal w1, w2
        n = len(x)
        pooled = x.reshape(n, 3, CROP // 4, 4, CROP // 4, 4).mean(axis=(3, 5)).reshape(n, -1)
        hidden = np.maximum(pooled @ w1, 0.0)
        logits = hidden @ w2
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(n), y] + 1e-9).mean())
        grad = probs
        grad[np.arange(n), y] -= 1.0
        grad /= n
        g2 = hidden.T @ grad
        g1 = pooled.T @ ((grad @ w2.T) * (hidden > 0))
        w1 -= 0.05 * g1
        w2 -= 0.05 * g2
        return loss
    return run, "cpu"


def calibrate(make: Batches, steps: dict[int, Callable[[np.ndarray, np.ndarray], float]], device: str) -> dict:
    """The input alone (one thread, with no jitter pass and with 8: the base and each pass's cost)
    and the step alone for each width (on a ready batch), median of a few each, after a warm-up."""
    def timed(fn: Callable[[], object], times: int = 7) -> float:
        fn()
        samples = []
        for _ in range(times):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return float(np.median(samples))
    passes = make.passes
    make.passes = 0
    base = timed(lambda: make(0))
    make.passes = 8
    per_pass = max((timed(lambda: make(0)) - base) / 8, 1e-6)
    make.passes = passes
    x, y = make(0)
    return {"device": device, "input_base_s": base, "input_per_pass_s": per_pass,
            "step_s": {str(width): timed(lambda run=run: run(x, y), times=15) for width, run in steps.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load_arguments(parser)
    parser.add_argument("--execution", choices=("pipelined", "linear"), default="pipelined")
    parser.add_argument("--threads", type=int, default=1, help="pipelined: threads making batches")
    parser.add_argument("--prefetch", type=int, default=2, help="pipelined: batches ready beyond one a thread")
    parser.add_argument("--passes", type=int, default=1, help="jitter passes per batch (the input's cost)")
    parser.add_argument("--calibrate", metavar="W1,W2,...",
                        help="time the input alone and the step alone at these widths, print JSON")
    parser.add_argument("--cpu", action="store_true", help="the numpy step even where a GPU is")
    parser.add_argument("--out", help="write the final loss and the device here (JSON)")
    args = parser.parse_args()
    make = Batches(args.batch, args.seed, args.passes)
    def build(width: int) -> tuple[Callable[[np.ndarray, np.ndarray], float], str]:
        return (None if args.cpu else gpu_step(width)) or cpu_step(width)
    if args.calibrate:
        built = {int(w): build(int(w)) for w in args.calibrate.split(",")}
        print(json.dumps(calibrate(make, {w: run for w, (run, _) in built.items()}, next(iter(built.values()))[1])))
        return
    run, device = build(args.width)
    ddlctl.set_total_steps(args.steps)
    loss = float("nan")
    if args.execution == "linear":
        for k in range(args.steps):
            with ddlctl.step(samples=args.batch) as timer:
                x, y = make(k)
                timer.input_done()
                loss = run(x, y)
    else:
        with ThreadPoolExecutor(args.threads) as pool:
            ahead = deque(pool.submit(make, k) for k in range(min(args.steps, args.threads + args.prefetch)))
            for k in range(args.steps):
                with ddlctl.step(samples=args.batch) as timer:
                    x, y = ahead.popleft().result()
                    timer.input_done()
                    if k + len(ahead) + 1 < args.steps:
                        ahead.append(pool.submit(make, k + len(ahead) + 1))
                    loss = run(x, y)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"device": device, "loss": loss, "steps": args.steps}, handle)


if __name__ == "__main__":
    main()
