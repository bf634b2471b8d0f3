"""Balanced vs equal split of synchronous data parallelism on a heterogeneous pair of workers.

mwms with two workers on this machine, each pinned to a core of its own (host key ``cpus=``, as on
separate machines) and the second emulated at half speed with a cgroup CPU quota of 0.5 CPU (host
key ``cpu_quota=``, root needed); the built-in workload runs with the equal split and with
``--balance speed``, alternately, ``--repeats`` times each. Printed side by side: throughput
(samples/s over the run's post-warm-up window), each worker's measured speed (its examples per
step / its compute time per step, from the equal-split run's balance section), the ideal (the sum of
the workers' speeds: no worker ever waits, communication free; measured while both compute, in
the balanced runs: a worker that waits half of each step makes its input meanwhile, and its
compute looks faster than it is while training balanced) and the ideal with the all-reduce time
the run measured. Targets: balanced >= 1.3x the equal split, and >= 0.9 of the ideal.

``--no-pin`` lets the two workers share the cores (and throttles the second to 0.8 CPU, about half
the other's speed then): each worker's speed then depends on what the other does (the input
pipelines, the all-reduce and both computes compete for 2 cores), a step's compute time varies by
~14% and the expected slower of two noisy workers costs 7-8% of the step: 0.88-0.90 of the ideal
(measured 2026-11-25), where pinned runs give 0.95-0.97.

The workload is ``cnn`` without its augmentation unless ``--augment`` is given. The ideal counts
each worker's compute time (step start to gradients). With augmentation, about half of the CPU
work is the input pipeline, which runs in the background, also while both workers wait at the
all-reduce: that work is in neither worker's compute time, it takes the cores the all-reduce needs
(measured unpinned: 45-70 ms between gradients and the next step at batch 8192, against 3-15 ms
without augmentation, and 3 ms at batch 64), and the comm-free ideal is out of reach by that much.

    .venv/bin/python benchmarks/heterogeneous.py [--no-pin] [--cpu-quota 0.5] [--steps 30] \
        [--batch-size 8192] [--repeats 3] [--augment]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(hosts: Path, balance: str, args: argparse.Namespace, root: Path) -> dict:
    """summary.json of one run."""
    # the built-in workload as a command, to keep checkpoints out of the measured window (they cost
    # the same with either split and would only dilute the comparison)
    done = subprocess.run([sys.executable, "-m", "ddlctl", "launch", "-s", "mwms", "--hosts", str(hosts),
                           "--balance", balance, "--no-telemetry", "--runs-dir", str(root), "--json", "--",
                           sys.executable, "-m", "ddlctl.workloads", "--workload", args.workload, "--steps",
                           str(args.steps), "--batch-size", str(args.batch_size), "--checkpoint-every",
                           str(10 * args.steps), "--augment" if args.augment else "--no-augment"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--balance {balance} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-quota", type=float, default=None,
                        help="CPUs of the slow worker (default: 0.5 of its own core pinned; 0.8 unpinned, about "
                             "half the other's speed on 2 shared cores)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="each worker on a core of its own (host key cpus=), as on separate machines")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=False,
                        help="the cnn workload's input-heavy augmentation (see the module docstring)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the slow worker is emulated with a cgroup CPU quota)")
    root = Path(tempfile.mkdtemp(prefix="ddlctl-het-"))
    hosts = root / "hosts.txt"
    if args.cpu_quota is None:
        args.cpu_quota = 0.5 if args.pin else 0.8
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    pins = [f" cpus={cpus[0]}", f" cpus={cpus[1]}"] if args.pin else ["", ""]
    hosts.write_text(f"localhost{pins[0]}\n127.0.0.1{pins[1]} cpu_quota={args.cpu_quota:g}\n")
    results: dict[str, list[dict]] = {"off": [], "speed": []}
    for _ in range(args.repeats):
        for balance in ("off", "speed"):
            results[balance].append(run(hosts, balance, args, root))

    def median(balance: str, key) -> float:  # noqa: ANN001
        return statistics.median(key(s) for s in results[balance])

    equal = median("off", lambda s: s["throughput_samples_per_s"])
    balanced = median("speed", lambda s: s["throughput_samples_per_s"])
    speeds = [median("off", lambda s, i=i: s["balance"]["workers"][i]["speed"]) for i in range(2)]
    # The workers share this machine's cores: a worker computes faster while the other one waits
    # (equal split) than while both compute (balanced). The speeds measured in the balanced runs,
    # where both compute for most of each step, are the ones whose sum the hardware can deliver.
    concurrent = [median("speed", lambda s, i=i: s["balance"]["workers"][i]["speed"]) for i in range(2)]
    comm = median("speed", lambda s: s["balance"]["comm_s"])
    ideal = sum(concurrent)
    ideal_comm = args.batch_size / (args.batch_size / ideal + comm)
    shares = [median("speed", lambda s, i=i: s["balance"]["workers"][i]["share"]) for i in range(2)]
    predicted = median("off", lambda s: s["balance"]["predicted_balanced_samples_per_s"])
    print(f"mwms, 2 workers ({'a core each, ' if args.pin else 'sharing the cores, '}"
          f"cpu_quota={args.cpu_quota:g} on worker:1), {args.workload}"
          f"{' with' if args.augment else ' without'} augmentation, batch {args.batch_size}, "
          f"{args.steps} steps, median of {args.repeats} runs each")
    print(f"  worker speeds, compute only: equal split {speeds[0]:,.0f} / {speeds[1]:,.0f} samples/s (worker:1 at "
          f"{speeds[1] / speeds[0]:.2f}x); balanced, both computing at once {concurrent[0]:,.0f} / "
          f"{concurrent[1]:,.0f} (at {concurrent[1] / concurrent[0]:.2f}x)")
    print(f"  {'split':<34}{'samples/s':>12}{'vs equal':>10}{'of ideal':>10}")
    rows = [("equal", equal), ("--balance speed (shares " + " / ".join(f"{s:.0%}" for s in shares) + ")", balanced),
            ("predicted for balanced (report)", predicted), ("ideal with the all-reduce", ideal_comm),
            ("ideal (sum of concurrent speeds)", ideal), ("sum of equal-split speeds", sum(speeds))]
    for name, value in rows:
        print(f"  {name:<34}{value:>12,.0f}{value / equal:>9.2f}x{value / ideal:>10.2f}")
    print(f"  all runs: equal {[round(s['throughput_samples_per_s']) for s in results['off']]}, balanced "
          f"{[round(s['throughput_samples_per_s']) for s in results['speed']]}")
    print(f"target balanced >= 1.3x equal: {'met' if balanced / equal >= 1.3 else 'NOT met'} "
          f"({balanced / equal:.2f}x); >= 0.9 of ideal: {'met' if balanced / ideal >= 0.9 else 'NOT met'} "
          f"({balanced / ideal:.2f}; {balanced / ideal_comm:.2f} of the ideal with the all-reduce)")


if __name__ == "__main__":
    main()
