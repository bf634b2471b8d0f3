"""The partition planners on many random models: how far the research's greedy plan is from the
exact (optimal) one, by the cost model, and how long planning a large model takes.

No TensorFlow: random layer-cost profiles (log-normal costs, a few MiB of parameters and
activations per layer), 8-64 layers on 2-8 devices, equal devices or speeds drawn from 0.25-1,
a 10 GB/s link with 10 us per message, without and with memory caps, at 1 and 4 micro-batches.
For each case it prints the gap of greedy's predicted step over optimal's (median, 90th
percentile, largest) and how often greedy is within 5% of it; then the time to plan 1,000 layers
onto 64 devices with each algorithm (target: under 1 s).

    .venv/bin/python benchmarks/planner.py [--profiles 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from ddlctl.modelparallel.planner import Device, Layer, Link, gap, plan_greedy, plan_optimal, plan_random

MIB = 2**20


def random_model(rng: random.Random, layers: int, devices: int, equal: bool,
                 capped: bool) -> tuple[list[Layer], list[Device]]:
    """A random layer-cost profile and devices for it (capped: each device holds about 1.5 times
    its share of the model's memory, so that memory constrains the split)."""
    model = [Layer(f"l{i}", rng.lognormvariate(0, 0.8) * 1e-3, rng.randint(1, 8) * MIB, rng.randint(1, 8) * MIB // 4)
             for i in range(layers)]
    total = sum(layer.param_bytes + layer.act_bytes for layer in model)
    largest = max(layer.param_bytes + layer.act_bytes for layer in model)
    memory = max(1.5 * total / devices, 1.2 * largest) if capped else float("inf")
    speeds = [1.0 if equal else rng.uniform(0.25, 1.0) for _ in range(devices)]
    return model, [Device(f"d{j}", speed, memory) for j, speed in enumerate(speeds)]


def gaps(rng: random.Random, count: int, microbatches: int, equal: bool, capped: bool,
         research_only: bool = False) -> list[float]:
    """Greedy's predicted step over optimal's, less 1, for ``count`` random models (feasible ones);
    ``research_only``: the research's pass alone (ddlctl's greedy adds a second one at m=1)."""
    link = Link(10e9, 1e-5)
    found = []
    while len(found) < count:
        layers, devices = random_model(rng, rng.choice([8, 16, 32, 64]), rng.choice([2, 3, 4, 8]), equal, capped)
        value = gap([plan_greedy(layers, devices, microbatches, link, research_only=research_only),
                     plan_optimal(layers, devices, microbatches, link)])
        if value is not None:
            found.append(value)
    return found


def _figures(found: list[float]) -> str:
    """median, 90th percentile, largest gap and the share within 5% (sorted gaps)."""
    p90 = found[int(0.9 * (len(found) - 1))]
    within = sum(1 for g in found if g <= 0.05) / len(found)
    return f"{statistics.median(found):>+7.1%} {p90:>+7.1%} {found[-1]:>+8.1%} {within:>10.0%}"


def planning_time(algorithm: object, layers: list[Layer], devices: list[Device]) -> float:
    start = time.perf_counter()
    algorithm(layers, devices, 8, Link(10e9, 1e-4))  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=300, help="random models per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"greedy's predicted step over optimal's, {args.profiles} random models per case (at m=1 also the "
          "research's pass alone: ddlctl's greedy adds the fastest-first pass there)")
    print(f"{'m':>2} {'devices':<8} {'memory':<7} {'median':>7} {'p90':>7} {'largest':>8} {'within 5%':>10}"
          f"  {'research pass: median':>21} {'p90':>7} {'largest':>8} {'within 5%':>10}")
    for microbatches in (1, 4):
        for equal in (True, False):
            for capped in (False, True):
                state = rng.getstate()
                found = sorted(gaps(rng, args.profiles, microbatches, equal, capped))
                line = f"{microbatches:>2} {'equal' if equal else 'unequal':<8} {'capped' if capped else 'free':<7} " \
                       f"{_figures(found)}"
                if microbatches == 1:  # the same models, the research's pass alone
                    rng.setstate(state)
                    line += f"  {_figures(sorted(gaps(rng, args.profiles, microbatches, equal, capped, True))):>39}"
                print(line)
    big = random.Random(1)
    layers = [Layer(f"l{i}", big.uniform(0.001, 0.01), big.randint(1, 50) * MIB, big.randint(1, 20) * MIB)
              for i in range(1000)]
    devices = [Device(f"d{j}", big.choice([0.5, 1.0, 2.0]), 2**30) for j in range(64)]
    for name, algorithm in (("greedy", plan_greedy), ("optimal", plan_optimal), ("random", plan_random)):
        print(f"planning 1,000 layers onto 64 devices ({name}, 8 micro-batches): "
              f"{planning_time(algorithm, layers, devices):.3f} s (target < 1 s)")


if __name__ == "__main__":
    main()
