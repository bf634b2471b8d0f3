"""Model-parallel plans measured: random vs greedy vs optimal, with and without micro-batching.

Three stage tasks on this machine, the third emulated at half speed (host key ``cpu_quota=0.5``: a
cgroup CPU quota of 1 ms per 2 ms period, set by the host agent; root needed), and a memory cap per device
that the built-in ``deep`` model does not fit on one device. ``ddlctl partition`` profiles the
model and plans it for that cluster (declared ``speed=0.5`` for the slow one); every plan is then
run with ``ddlctl launch --strategy model`` and its median step time measured, next to the cost
model's prediction. Also: the single-fastest-device row and the time to plan 1,000 layers onto 64
devices. Targets: greedy >= 1.3x faster than random, optimal <= greedy, predictions within 25%,
micro-batching >= 1.3x over none on 3 stages, planning < 1 s.

    .venv/bin/python benchmarks/model_parallel.py [--steps 40] [--memory 24MiB] [--random-seeds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_plan(counts: list[int], microbatches: int, steps: int, hosts: Path, root: Path) -> float:
    """Median step time (s) of the model strategy with these layers per stage."""
    run_root = Path(tempfile.mkdtemp(dir=root))
    done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "-s", "model", "--hosts", str(hosts),
                           "--no-telemetry", "--runs-dir", str(run_root), "--", sys.executable, "-m",
                           "ddlctl.workloads", "--workload", "deep", "--steps", str(steps),
                           "--microbatches", str(microbatches), "--partition", ",".join(map(str, counts))],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"run {counts} m={microbatches} failed: {done.stderr[-2000:]}")
    (run_dir,) = [p for p in run_root.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "tasks" / "chief-0" / "steps.jsonl").read_text().splitlines()]
    return statistics.median(r["duration_s"] for r in records[5:])  # after warm-up


def planner_speed() -> float:
    from ddlctl.planning.partition import Device, Layer, Link, plan_optimal

    rng = random.Random(1)
    layers = [Layer(f"l{i}", rng.uniform(0.001, 0.01), rng.randint(1, 50) * 2**20, rng.randint(1, 20) * 2**20)
              for i in range(1000)]
    devices = [Device(f"d{j}", rng.choice([0.5, 1.0, 2.0]), 2**30) for j in range(64)]
    start = time.perf_counter()
    plan_optimal(layers, devices, 8, Link(10e9, 1e-4))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--memory", default="24MiB")
    parser.add_argument("--random-seeds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the slow stage is emulated with a cgroup CPU quota)")
    root = Path(tempfile.mkdtemp(prefix="ddlctl-mp-bench-"))
    hosts = root / "hosts.txt"
    hosts.write_text(f"localhost slots=2 memory={args.memory}\n"
                     f"127.0.0.1 slots=1 speed=0.5 memory={args.memory} cpu_quota=0.5\n")
    rows = []
    for microbatches in (1, 4):
        plans = {}
        for seed in range(max(1, args.random_seeds)):
            saved = root / f"plan-m{microbatches}-s{seed}.json"
            subprocess.run([sys.executable, "-m", "ddlctl", "partition", "--hosts", str(hosts), "--workload", "deep",
                            "--microbatches", str(microbatches), "--seed", str(seed), "--save", str(saved), "--json"],
                           check=True, capture_output=True)
            data = json.loads(saved.read_text())
            for p in data["plans"]:
                name = p["algorithm"] if p["algorithm"] != "random" else f"random (seed {seed})"
                if p["algorithm"] == "random" or seed == 0:
                    plans[name] = p
        for name, p in plans.items():
            if not p["feasible"]:
                rows.append((microbatches, name, None, None, p["reason"]))
                continue
            counts = [s["layers"] for s in p["stages"]]
            measured = run_plan(counts, microbatches, args.steps, hosts, root)
            rows.append((microbatches, name, p["step_time_s"], measured, ",".join(map(str, counts))))
            print(f"m={microbatches} {name:<16} predicted {p['step_time_s'] * 1e3:7.1f} ms  measured "
                  f"{measured * 1e3:7.1f} ms  stages {counts}", flush=True)
    print(f"\ndeep model, 3 stage tasks (speeds 1 / 1 / 0.5 emulated, memory {args.memory} each), "
          f"{args.steps} steps, median step time")
    print(f"{'m':>2} {'plan':<18} {'predicted ms':>13} {'measured ms':>12} {'error':>7}  stages / note")
    for m, name, predicted, measured, note in rows:
        if measured is None:
            print(f"{m:>2} {name:<18} {'-':>13} {'-':>12} {'-':>7}  infeasible: {note}")
            continue
        error = (predicted - measured) / measured
        print(f"{m:>2} {name:<18} {predicted * 1e3:>13.1f} {measured * 1e3:>12.1f} {error:>+7.0%}  {note}")
    for m in (1, 4):
        measured = {name: value for mm, name, _, value, _ in rows if mm == m and value is not None}
        randoms = [v for n, v in measured.items() if n.startswith("random")]
        if randoms and "greedy" in measured and "optimal" in measured:
            base = statistics.mean(randoms)
            print(f"m={m}: greedy {base / measured['greedy']:.2f}x faster than random (mean of {len(randoms)} "
                  f"seeds), optimal {base / measured['optimal']:.2f}x; optimal / greedy "
                  f"{measured['optimal'] / measured['greedy']:.2f}")
    one = {name: value for m, name, _, value, _ in rows if m == 1 and value is not None}
    four = {name: value for m, name, _, value, _ in rows if m == 4 and value is not None}
    for name in ("greedy", "optimal"):
        if name in one and name in four:
            print(f"micro-batching (4 vs 1) with {name}: {one[name] / four[name]:.2f}x")
    print(f"planning 1,000 layers onto 64 devices (optimal, 8 micro-batches): {planner_speed():.2f} s")
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
