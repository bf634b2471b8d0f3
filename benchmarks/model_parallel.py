"""Model-parallel plans measured: random vs greedy vs optimal, with and without micro-batching.

Three stage tasks on this machine emulate devices of speeds 1 : 1 : 0.5 with cgroup CPU quotas
(host key ``cpu_quota=``: 0.6, 0.6 and 0.3 CPUs by default, together less than the machine's two
cores, so that the stages can really run side by side as separate devices do; root needed). The
chief (the client that drives the stages) runs unthrottled on a host entry of its own
(``roles=chief``). Each device gets a memory cap that the built-in ``deep`` model does not fit on
one device. Then:

1. ``ddlctl check --bench`` measures each stage host's speed (GFLOP/s under its quota, the stage
   hosts side by side as while training);
2. ``ddlctl partition --speeds`` profiles the model and plans it with each algorithm (random with
   several seeds, greedy, optimal), at 1 and at 4 micro-batches, with its predicted step time;
3. every plan runs under ``ddlctl launch --strategy model`` and its median step time is measured;
   so does, at each m, the plan the launched chief makes itself (no ``--partition``: ddlctl's
   default planner, from the speeds and message costs it measures in place).

Every plan runs ``--rounds`` times, interleaved (each plan once per round, round after round), so
that a drift of the machine falls on every plan alike. Printed side by side: predicted and
measured per plan (median of the rounds, with the lowest and highest) and the error, the
single-fastest-device row, greedy and optimal over random (the mean of the random plans' medians:
random placement's expected step, with the range over the random plans), greedy over optimal and
micro-batching (4 vs 1) as ratios of medians with the lowest and highest that any pair of runs
gives ("inside the noise" when the two plans' runs overlap), the cost model's ceiling (random
placement's expected step over 200 draws against the optimal plan's: what any planner can gain on
these devices) next to the seeds drawn, and the time to plan 1,000 layers onto 64 devices.
Targets (issue 31): greedy >= 1.3x and optimal >= 1.36x faster than random, optimal never slower
than greedy beyond the spread, predictions within 15%, micro-batching >= 1.3x over none with the
default planner, planning < 1 s.

    .venv/bin/python benchmarks/model_parallel.py [--steps 30] [--batch-size 512] [--memory 40MiB]
        [--random-seeds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def ddlctl(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ddlctl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ddlctl {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done


def run_plan(counts: tuple[int, ...] | None, microbatches: int, args: argparse.Namespace, hosts: Path,
             profile: Path, root: Path) -> tuple[float, float | None, tuple[int, ...]]:
    """Median step time (s) of the model strategy with these layers per stage (None: the plan the
    chief makes in place, as ``launch`` does by default), the step time the chief predicted for
    the plan before it trained (its own profile, the speeds and message costs it measured, the link
    between the stage tasks as TensorFlow moved tensors), and the plan that ran."""
    run_root = Path(tempfile.mkdtemp(dir=root))
    given = ["--partition", ",".join(map(str, counts))] if counts is not None else []
    ddlctl("launch", "-s", "model", "--hosts", str(hosts), "--no-telemetry", "--speeds", str(profile),
           "--runs-dir", str(run_root), "--",
           sys.executable, "-m", "ddlctl.workloads", "--workload", "deep", "--steps", str(args.steps),
           "--batch-size", str(args.batch_size), "--microbatches", str(microbatches),
           "--checkpoint-every", str(args.steps + 1), *given)
    (run_dir,) = [p for p in run_root.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "tasks" / "chief-0" / "steps.jsonl").read_text().splitlines()]
    stages = json.loads((run_dir / "tasks" / "chief-0" / "stages.json").read_text())
    return (statistics.median(r["duration_s"] for r in records[3:]),  # after warm-up
            (stages.get("predicted") or {}).get("step_s"), tuple(stages["partition"]))


def in_place_model(microbatches: int, args: argparse.Namespace, hosts: Path, root: Path):  # noqa: ANN201
    """``ddlctl partition --in-place``: the cluster measured as the launched chief measures it, once
    per m; a function giving the cost model's step for any plan (layers per stage) from it."""
    from ddlctl.modelparallel.planner import Device, Layer, Link, plan_counts

    saved = root / f"in-place-m{microbatches}.json"
    ddlctl("partition", "--hosts", str(hosts), "--in-place", "--workload", "deep", "--batch-size",
           str(args.batch_size), "--microbatches", str(microbatches), "--save", str(saved), "--json")
    data = json.loads(saved.read_text())
    layers = [Layer(**layer) for layer in data["layers"]]
    devices = [Device.from_dict(d) for d in data["devices"]]
    given = data["link"]
    link = Link(given["bandwidth_gbps"] * 1e9, given["latency_ms"] / 1e3, given["dispatch_ms"] / 1e3)
    return lambda counts: plan_counts(layers, devices, list(counts), microbatches, link).step_time_s


def planner_speed() -> float:
    from ddlctl.modelparallel.planner import Device, Layer, Link, plan_optimal

    rng = random.Random(1)
    layers = [Layer(f"l{i}", rng.uniform(0.001, 0.01), rng.randint(1, 50) * 2**20, rng.randint(1, 20) * 2**20)
              for i in range(1000)]
    devices = [Device(f"d{j}", rng.choice([0.5, 1.0, 2.0]), 2**30) for j in range(64)]
    start = time.perf_counter()
    plan_optimal(layers, devices, 8, Link(10e9, 1e-4))
    return time.perf_counter() - start


def plans_for(microbatches: int, args: argparse.Namespace, hosts: Path, profile: Path, root: Path) -> dict:
    """name -> plan dict (``ddlctl partition --json``): greedy, optimal, single from seed 0; one
    random plan per seed; and under "expected", random placement over many draws (its JSON's
    ``random_expected``)."""
    plans = {}
    for seed in range(max(1, args.random_seeds)):
        saved = root / f"plan-m{microbatches}-s{seed}.json"
        ddlctl("partition", "--hosts", str(hosts), "--speeds", str(profile), "--workload", "deep",
               "--batch-size", str(args.batch_size), "--microbatches", str(microbatches), "--seed", str(seed),
               "--save", str(saved), "--json")
        for p in json.loads(saved.read_text())["plans"]:
            if p["algorithm"] == "random":
                plans[f"random (seed {seed})"] = p
            elif seed == 0:
                plans[p["algorithm"]] = p
        if seed == 0:
            expected = json.loads(saved.read_text()).get("random_expected")
    return {**plans, "expected": expected}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--memory", default="40MiB", help="memory cap of each emulated device")
    parser.add_argument("--quotas", default="0.6,0.3", metavar="FAST,SLOW",
                        help="CPUs of the two fast stage tasks (each) and of the slow one")
    parser.add_argument("--random-seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="runs per plan, interleaved (median and spread)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the stage devices are emulated with cgroup CPU quotas)")
    fast, slow = (float(v) for v in args.quotas.split(","))
    root = Path(tempfile.mkdtemp(prefix="ddlctl-mp-bench-"))
    hosts = root / "hosts.txt"
    hosts.write_text("localhost roles=chief\n"
                     f"127.0.0.1 roles=worker slots=2 memory={args.memory} cpu_quota={fast}\n"
                     f"::1 roles=worker slots=1 memory={args.memory} cpu_quota={slow}\n")
    # the stage hosts only: measured side by side as they train (the chief's host would compete for
    # the cores the quotas leave free, and it holds no stage)
    stage_hosts = root / "stage-hosts.txt"
    stage_hosts.write_text("".join(hosts.read_text().splitlines(keepends=True)[1:]))
    profile = root / "profile.json"
    ddlctl("check", "--bench", "--hosts", str(stage_hosts), "--save", str(profile))
    gflops = {label: round(h["speed"], 1) for label, h in json.loads(profile.read_text())["hosts"].items()}
    print(f"measured GFLOP/s per device: {gflops}", flush=True)
    planned = {m: plans_for(m, args, hosts, profile, root) for m in (1, 4)}
    in_place = {m: in_place_model(m, args, hosts, root) for m in planned}
    expected = {m: plans.pop("expected") for m, plans in planned.items()}
    distinct = sorted({(m, tuple(s["layers"] for s in p["stages"]))
                       for m, plans in planned.items() for p in plans.values() if p["feasible"]})
    # ... and at each m the plan the chief makes itself (no --partition: ddlctl's default planner, with
    # the speeds and message costs it measures in place), which may differ from launch to launch
    distinct += [(m, None) for m in planned]
    # every plan once per round, the rounds one after the other (A, B, C, A, B, C ...): a drift of the
    # machine falls on every plan alike; a plan two algorithms agree on runs once per round
    runs_of: dict[tuple, list[tuple[float, float | None, tuple[int, ...]]]] = {key: [] for key in distinct}
    for round_ in range(max(1, args.rounds)):
        for m, counts in distinct:
            runs_of[(m, counts)].append(run_plan(counts, m, args, hosts, profile, root))
            measured, _, ran = runs_of[(m, counts)][-1]
            what = f"stages {list(ran)}" if counts is not None else f"default: the chief chose {list(ran)}"
            print(f"round {round_ + 1}: m={m} {what} measured {measured * 1e3:7.1f} ms", flush=True)
    rows = []
    for m, plans in planned.items():
        for name, p in plans.items():
            if not p["feasible"]:
                rows.append((m, name, None, None, p["reason"], None, None))
                continue
            counts = tuple(s["layers"] for s in p["stages"])
            steps = [r[0] for r in runs_of[(m, counts)]]
            chief = [r[1] for r in runs_of[(m, counts)] if r[1]]
            rows.append((m, name, p["step_time_s"], steps, ",".join(map(str, counts)),
                         statistics.median(chief) if chief else None, in_place[m](counts)))
        runs = runs_of[(m, None)]
        chief = [r[1] for r in runs if r[1]]
        chosen = {r[2] for r in runs}  # the chief's plan, when it chose the same one every time
        rows.append((m, "default", None, [r[0] for r in runs], " / ".join(",".join(map(str, r[2])) for r in runs),
                     statistics.median(chief) if chief else None,
                     in_place[m](next(iter(chosen))) if len(chosen) == 1 else None))
    print(f"\ndeep model, batch {args.batch_size}, 3 stage tasks (CPU quotas {fast}/{fast}/{slow}, memory "
          f"{args.memory} each), {args.steps} steps, median step time of each run, median [lowest-highest] over "
          f"{args.rounds} interleaved round(s)")
    print("predicted: by `ddlctl partition --speeds` (offline: GFLOP/s and link from check --bench); in place: "
          "by `ddlctl partition --in-place` (one measuring job per m, as the chief measures); chief: by each "
          "launched chief before training (its own in-place measurements)")
    print(f"{'m':>2} {'plan':<22} {'predicted ms':>13} {'error':>7} {'in place':>9} {'error':>7} {'chief ms':>9} "
          f"{'error':>7} {'measured ms [spread]':>24}  stages / note")
    errors, chief_errors, in_place_errors = [], [], []
    for m, name, predicted, steps, note, in_situ, placed in rows:
        label = {"single": "single fastest device", "default": "default (chief plans)"}.get(name, name)
        if steps is None:
            print(f"{m:>2} {label:<22} {'-':>13} {'-':>7} {'-':>9} {'-':>7} {'-':>9} {'-':>7} {'-':>24}  "
                  f"infeasible: {note}")
            continue
        measured = statistics.median(steps)
        offline = f"{'-':>13} {'-':>7}"
        if predicted is not None:  # the default plan is the chief's: no offline prediction
            error = (predicted - measured) / measured
            errors.append((m, error))
            offline = f"{predicted * 1e3:>13.1f} {error:>+7.0%}"
        chief = f"{in_situ * 1e3:>9.1f} {(in_situ - measured) / measured:>+7.0%}" if in_situ else f"{'-':>9} {'-':>7}"
        if in_situ:
            chief_errors.append((m, (in_situ - measured) / measured))
        there = f"{placed * 1e3:>9.1f} {(placed - measured) / measured:>+7.0%}" if placed else f"{'-':>9} {'-':>7}"
        if placed:
            in_place_errors.append((m, (placed - measured) / measured))
        spread = f"{measured * 1e3:.1f} [{min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f}]"
        print(f"{m:>2} {label:<22} {offline} {there} {chief} {spread:>24}  {note}")

    from ddlctl.commands.compare import speedup_range

    def ratio(slow: list[float], fast: list[float]) -> str:
        """median(slow) / median(fast), with the lowest and highest any pair of runs gives."""
        low, high, noise = speedup_range(slow, fast) or (math.nan, math.nan, True)
        inside = " (inside the noise)" if noise else ""
        return f"{statistics.median(slow) / statistics.median(fast):.2f}x [{low:.2f}-{high:.2f}]{inside}"

    def versus_random(randoms: list[list[float]], steps: list[float]) -> str:
        """The mean of the random plans' medians over this plan's median (random placement's expected
        step against this plan's), with the range over the random plans one by one."""
        each = [statistics.median(r) / statistics.median(steps) for r in randoms]
        mean = statistics.mean(statistics.median(r) for r in randoms) / statistics.median(steps)
        return f"{mean:.2f}x (each random plan {min(each):.2f}-{max(each):.2f}x)"

    for m in (1, 4):
        measured = {name: steps for mm, name, _, steps, _, _, _ in rows if mm == m and steps is not None}
        randoms = [steps for n, steps in measured.items() if n.startswith("random")]
        if randoms and "greedy" in measured and "optimal" in measured:
            print(f"m={m}: greedy {versus_random(randoms, measured['greedy'])} faster than random "
                  f"({len(randoms)} seeds), optimal {versus_random(randoms, measured['optimal'])}; greedy over "
                  f"optimal {ratio(measured['greedy'], measured['optimal'])}")
        # the cost model's view: how much any plan can gain over random placement's expected step on
        # these devices, and how lucky the seeds drawn here were
        optimal = planned[m].get("optimal", {}).get("step_time_s")
        drawn = [p["step_time_s"] for n, p in planned[m].items() if n.startswith("random") and p["feasible"]]
        if expected[m] and optimal and drawn:
            print(f"m={m}, by the cost model: random placement's expected step ({expected[m]['draws']} draws) is "
                  f"{expected[m]['mean_step_s'] / optimal:.2f}x the optimal plan's (the most any plan gains over "
                  f"random here); the {len(drawn)} seeds drawn here {statistics.mean(drawn) / optimal:.2f}x")
    one = {name: steps for m, name, _, steps, _, _, _ in rows if m == 1 and steps is not None}
    four = {name: steps for m, name, _, steps, _, _, _ in rows if m == 4 and steps is not None}
    for name in ("default", "greedy", "optimal"):
        if name in one and name in four:
            who = "the default planner (the chief's, in place)" if name == "default" else name
            print(f"micro-batching (4 vs 1) with {who}: {ratio(one[name], four[name])}")
    for who, found in (("partition --speeds", errors), ("partition --in-place", in_place_errors),
                       ("chief", chief_errors)):
        if found:
            sizes = [abs(e) for _, e in found]
            signed = {m: [e for mm, e in found if mm == m] for m in sorted({m for m, _ in found})}
            by_m = ", ".join(f"m={m}: {min(e):+.0%} to {max(e):+.0%}" for m, e in signed.items())
            print(f"prediction error ({who}, on the medians): median {statistics.median(sizes):.0%}, "
                  f"largest {max(sizes):.0%} ({by_m})")
    print(f"planning 1,000 layers onto 64 devices (optimal, 8 micro-batches): {planner_speed():.2f} s")
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
