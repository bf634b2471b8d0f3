"""The tf.data service against local input, on an input-bound trainer pinned to one core.

Each round runs the built-in ``heavy`` workload (cnn's model; every image decoded from a JPEG and
augmented in the input pipeline) under ``one_device`` with its trainer pinned to CPU 0 (a hosts
file ``localhost cpus=0``), twice, in alternating order:

* **local**: the trainer's own tf.data pipeline, on its one core with the step;
* **service**: ``127.0.0.1 roles=data cpus=1`` beside it: the dispatcher and one data worker on
  CPU 1 make the batches (``--input auto`` takes the service ddlctl started), the trainer only
  trains.

It also measures, once, each half alone on CPU 0: the input (the heavy pipeline, batches made
and dropped) and the step's compute (the model's training step on one batch, again and again).
Prints each round's throughput (samples/s of the run's steps, ``summary.json``) and the
trainer's input share (its wait for input in each step, ``input_fraction``), the medians and their
ratio. Target (issue 61): at least 1.7x where the input alone takes at least the step's compute,
the input share falling accordingly. Needs 2 CPUs.

    .venv/bin/python benchmarks/dataservice.py [--rounds 3] [--steps 300] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INPUT_ALONE = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.sched_setaffinity(0, {0})
from ddlctl.workloads import synthetic
batch, count = int(sys.argv[1]), int(sys.argv[2])
batches = iter(synthetic.shard_dataset(1234, synthetic.DECODE, batch))
for _ in range(5):
    next(batches)
began = time.perf_counter()
for _ in range(count):
    next(batches)
print((time.perf_counter() - began) / count)
"""
COMPUTE_ALONE = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.sched_setaffinity(0, {0})
import keras
import tensorflow as tf
from ddlctl.workloads import models, synthetic
batch, count = int(sys.argv[1]), int(sys.argv[2])
images, labels, _ = next(iter(synthetic.shard_dataset(1234, synthetic.PLAIN, batch)))
model, optimizer = models.heavy(), keras.optimizers.Adam(2e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss
for _ in range(5):
    step().numpy()
began = time.perf_counter()
for _ in range(count):
    step().numpy()
print((time.perf_counter() - began) / count)
"""


def one_run(root: Path, hosts: str, steps: int, batch: int) -> tuple[float, float]:
    """(samples/s of the run's steps, the trainer's input share) of one ``ddlctl launch``."""
    folder = Path(tempfile.mkdtemp(dir=root))
    (folder / "hosts.txt").write_text(hosts)
    work = ["--workload", "heavy", "--steps", str(steps), "--batch-size", str(batch)]
    done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "--hosts", str(folder / "hosts.txt"),
                           "-s", "one_device", "--no-telemetry", "--runs-dir", str(folder / "runs"), *work],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"ddlctl launch ended with {done.returncode}: {done.stderr[-2000:]}\n(its folder: {folder})")
    (run_dir,) = (folder / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    [trainer] = [t for t in summary["tasks"] if t["name"] == "worker:0"]
    return float(summary["throughput_samples_per_s"]), float(trainer.get("input_fraction") or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 CPUs (the trainer on CPU 0, the data worker on CPU 1)")
    local_hosts = "localhost cpus=0\n"
    service_hosts = "localhost cpus=0\n127.0.0.1 roles=data cpus=1\n"
    with tempfile.TemporaryDirectory(prefix="ddlctl-dataservice-bench-") as tmp:
        root = Path(tmp)
        input_s = float(subprocess.run([sys.executable, "-c", INPUT_ALONE, str(args.batch_size), "40"],
                                       capture_output=True, text=True, check=True).stdout.split()[-1])
        compute_s = float(subprocess.run([sys.executable, "-c", COMPUTE_ALONE, str(args.batch_size), "60"],
                                         capture_output=True, text=True, check=True).stdout.split()[-1])
        print(f"alone on CPU 0, a batch of {args.batch_size}: input {input_s * 1e3:.1f} ms, step's compute "
              f"{compute_s * 1e3:.1f} ms (a training step on one batch, again and again): input/compute "
              f"{input_s / compute_s:.2f}", flush=True)
        figures: dict[str, list[tuple[float, float]]] = {"local": [], "service": []}
        for round_ in range(args.rounds):
            order = ("local", "service") if round_ % 2 == 0 else ("service", "local")
            for kind in order:
                began = time.monotonic()
                rate, share = one_run(root, local_hosts if kind == "local" else service_hosts, args.steps,
                                      args.batch_size)
                figures[kind].append((rate, share))
                print(f"round {round_ + 1} {kind:8s} {rate:8,.0f} samples/s, input share {share:.0%} "
                      f"({time.monotonic() - began:.0f}s)", flush=True)
    local = statistics.median(r for r, _ in figures["local"])
    service = statistics.median(r for r, _ in figures["service"])
    print(f"median: local {local:,.0f} samples/s (input share "
          f"{statistics.median(s for _, s in figures['local']):.0%}), service {service:,.0f} samples/s (input share "
          f"{statistics.median(s for _, s in figures['service']):.0%}): service/local {service / local:.2f}x "
          f"(target: at least 1.7x where input/compute >= 1)")


if __name__ == "__main__":
    main()
