"""``ddlctl partition``: profile a model, plan its layers over the cluster's devices with each
algorithm, print the plans side by side and save the chosen one.

Devices: one per GPU of a host (``gpus=``), else one per slot (``slots=``), each with the host's
``speed=`` (relative to the machine running this command, which profiles the model: speed 1) and
``memory=`` (default: unlimited). With ``--speeds FILE`` (a profile of ``ddlctl check --bench``),
or ``--bench`` (the same measurement taken now), the measured speeds replace ``speed=``: each
host's GFLOP/s over this machine's, measured here with the same kernel just before the model is
profiled (the profile's own ``localhost`` figure is not used: ``check --bench`` measures all hosts
at once, so hosts sharing a machine compete, while the model's layers are timed here alone), and
the median measured host-to-host link replaces the default ``--bandwidth`` / ``--latency-ms``.
The planning itself is :mod:`ddlctl.modelparallel.planner` (pure).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddlctl.cluster.model import Cluster
from ddlctl.contract.errors import ConfigError
from ddlctl.modelparallel.planner import (
    ALGORITHMS,
    Device,
    Layer,
    Link,
    PartitionPlan,
    RandomSpread,
    fastest,
    gap,
    plan,
    random_spread,
)

SCHEMA = 1
DEFAULT_BANDWIDTH_GBPS = 1.25
DEFAULT_LATENCY_MS = 0.1


@dataclass(frozen=True)
class PartitionOptions:
    """What ``ddlctl partition`` was asked for."""

    hosts: str | None = None
    template: str | None = None
    model: str = "deep"
    batch_size: int = 64
    algorithm: str = "all"
    microbatches: int = 1
    bandwidth_gbps: float | None = None  # None: the profile's median link, else 1.25
    latency_ms: float | None = None  # None: the profile's median link, else 0.1
    seed: int = 0
    speeds: str | None = None  # a cluster profile of ddlctl check --bench
    bench: bool = False  # measure the hosts now, as check --bench does, and use those speeds
    in_place: bool = False  # measure as the launched chief does (a short job on the cluster), and use that
    dispatch_ms: float = 0.0  # a step's fixed cost (measured in place)
    save: str | None = None
    json_out: bool = False


def devices_of(cluster: Cluster) -> list[Device]:
    """One device per GPU of each host that takes workers, else one per slot."""
    devices = []
    for host in cluster.hosts:
        if not host.accepts("worker"):
            continue
        kind, count = ("gpu", host.gpus) if host.gpus else ("cpu", host.slots)
        memory = float(host.memory_bytes) if host.memory_bytes else math.inf
        devices.extend(Device(f"{host.label}/{kind}:{i}", host.speed, memory) for i in range(count))
    if not devices:
        raise ConfigError("no host of the cluster takes workers: there is no device to place layers on")
    return devices


def with_profile(cluster: Cluster, opts: PartitionOptions, reference: Callable[[], float] | None = None,
                 measured: object | None = None) -> tuple[Cluster, PartitionOptions, float | None]:
    """Measured speeds and link from ``measured`` (a :class:`ddlctl.commands.bench.ClusterProfile` just
    taken, ``--bench``) or ``opts.speeds`` (a saved one); the defaults otherwise. ``reference``
    measures this machine's GFLOP/s (called only when the profile is usable): speeds are relative
    to it; without it, to the profile's ``localhost``, else its fastest host. Also returns the
    reference GFLOP/s used (None without a profile or ``reference``)."""
    link = None
    base = None
    if measured is not None or opts.speeds:
        from ddlctl.commands.bench import load_profile, relative_speeds, typical_link

        profile = measured if measured is not None else load_profile(opts.speeds)  # type: ignore[arg-type]
        missing = [h.label for h in cluster.hosts if h.accepts("worker") and h.label not in profile.hosts]
        if missing:
            raise ConfigError(f"{'--speeds ' + opts.speeds if opts.speeds else '--bench'}: no speed for "
                              f"{', '.join(missing)}",
                              "measure this cluster with: ddlctl check --bench --save FILE")
        base = reference() if reference is not None else None
        speeds = relative_speeds(profile, "localhost", base)
        cluster = dataclasses.replace(cluster, hosts=tuple(
            dataclasses.replace(h, speed=speeds[h.label]) if h.label in speeds else h for h in cluster.hosts))
        link = typical_link(profile)
    bandwidth = opts.bandwidth_gbps or (link[0] / 1e9 if link else DEFAULT_BANDWIDTH_GBPS)
    latency = opts.latency_ms if opts.latency_ms is not None else (link[1] * 1e3 if link else DEFAULT_LATENCY_MS)
    return cluster, dataclasses.replace(opts, bandwidth_gbps=bandwidth, latency_ms=latency), base


def algorithms(choice: str) -> tuple[str, ...]:
    if choice == "all":
        return ALGORITHMS
    if choice not in ALGORITHMS:
        raise ConfigError(f"--algorithm {choice!r} is not one of: all, " + ", ".join(ALGORITHMS))
    return (choice,)


def link_of(opts: PartitionOptions) -> Link:
    """The link between stages the plans assume (``--bandwidth``, ``--latency-ms`` or the defaults)."""
    latency_ms = DEFAULT_LATENCY_MS if opts.latency_ms is None else opts.latency_ms
    return Link((opts.bandwidth_gbps or DEFAULT_BANDWIDTH_GBPS) * 1e9, latency_ms / 1e3, opts.dispatch_ms / 1e3)


def plans_for(layers: list[Layer], devices: list[Device], opts: PartitionOptions) -> list[PartitionPlan]:
    """Every asked algorithm's plan, then the single-fastest-device baseline."""
    link = link_of(opts)
    chosen = [plan(a, layers, devices, opts.microbatches, link, opts.seed) for a in algorithms(opts.algorithm)]
    return [*chosen, plan("single", layers, devices, opts.microbatches, link)]


def random_expected(layers: list[Layer], devices: list[Device], opts: PartitionOptions) -> RandomSpread | None:
    """Random placement over many draws (:func:`random_spread`), when random is among the plans."""
    if "random" not in algorithms(opts.algorithm):
        return None
    return random_spread(layers, devices, opts.microbatches, link_of(opts))


def document(opts: PartitionOptions, layers: list[Layer], devices: list[Device],
             plans: list[PartitionPlan], reference_gflops: float | None = None,
             spread: RandomSpread | None = None) -> dict[str, object]:
    """The JSON of ``--json`` and of the saved plan (``chosen``: the plan ``launch`` uses;
    ``random_expected``: random placement over many draws)."""
    best = fastest([p for p in plans if p.algorithm != "single"])
    chosen = best.algorithm if best is not None else None
    return {"schema": SCHEMA, "model": opts.model, "batch_size": opts.batch_size,
            "microbatches": opts.microbatches, "reference_gflops": reference_gflops,
            "link": {"bandwidth_gbps": opts.bandwidth_gbps, "latency_ms": opts.latency_ms,
                     "dispatch_ms": opts.dispatch_ms},
            "measured_in_place": opts.in_place,
            "devices": [d.to_dict() for d in devices],
            "layers": [asdict(layer) for layer in layers], "plans": [p.to_dict() for p in plans], "chosen": chosen,
            "greedy_vs_optimal": gap(plans), "random_expected": spread.to_dict() if spread else None}


def run_partition(opts: PartitionOptions, out: Console, err: Console) -> int:
    """Profile, plan, print; exit code 0 when some algorithm found a plan, 2 when none could."""
    from ddlctl.cluster.source import load_cluster
    from ddlctl.modelparallel.planner import unplaceable
    from ddlctl.modelparallel.profile import load_model_factory, profile, sizes
    from ddlctl.task.tfenv import start_tensorflow_quietly

    if opts.microbatches < 1 or opts.batch_size < 1:
        raise ConfigError("--microbatches and --batch-size must be at least 1")
    if opts.batch_size % opts.microbatches:
        raise ConfigError(f"--batch-size {opts.batch_size} cannot be split into {opts.microbatches} micro-batches",
                          "use a multiple of --microbatches")
    if sum(map(bool, (opts.speeds, opts.bench, opts.in_place))) > 1:
        raise ConfigError("give one of --speeds FILE, --bench and --in-place",
                          "--bench measures the hosts' matrix-multiply speed now, --speeds reads such a profile, "
                          "--in-place measures the model's own step on the stage tasks")
    cluster, _, _ = load_cluster(opts.hosts, opts.template, 1)
    start_tensorflow_quietly()  # before anything imports TensorFlow (the model's module may)
    factory = load_model_factory(opts.model)
    measured = None
    if opts.bench:
        from ddlctl.commands.bench import bench

        err.print("measuring every host's devices and links (--bench)…", highlight=False)
        measured = bench(opts.hosts, opts.template, None, 1.0)

    def reference() -> float:
        from ddlctl.task.devbench import local_gflops

        err.print("measuring this machine's matrix-multiply speed (the measured speeds are relative to it)…",
                  highlight=False)
        return local_gflops()

    given = opts
    cluster, opts, base = with_profile(cluster, opts, reference, measured)
    devices = devices_of(cluster)
    model = factory()
    layers = sizes(model, opts.batch_size)
    why = unplaceable(layers, devices)
    if why:  # memory alone refuses every plan: nothing to time (the plans below say why, costs unmeasured)
        err.print(f"not profiled: {why}", highlight=False)
    elif opts.in_place:
        from ddlctl.commands.partition_inplace import measure_on_cluster, with_measured

        found = measure_on_cluster(cluster, opts.hosts, opts.template, opts.model, opts.batch_size,
                                   opts.microbatches, err)
        devices, layers = with_measured(devices, found), found.layers
        opts = dataclasses.replace(
            opts, bandwidth_gbps=given.bandwidth_gbps or found.link.bandwidth_bps / 1e9,
            latency_ms=given.latency_ms if given.latency_ms is not None else found.link.latency_s * 1e3,
            dispatch_ms=found.link.dispatch_s * 1e3)
    else:
        err.print(f"profiling {opts.model} on this machine (batch {opts.batch_size} in {opts.microbatches} "
                  "micro-batch(es), forward + backward per layer)…", highlight=False)
        layers = profile(model, opts.batch_size, microbatches=opts.microbatches)
    plans = plans_for(layers, devices, opts)
    spread = random_expected(layers, devices, opts)
    data = document(opts, layers, devices, plans, base, spread)
    if opts.save:
        Path(opts.save).write_text(json.dumps(data, indent=1) + "\n")
    if opts.json_out:
        out.print_json(data=data)
    else:
        render(plans, layers, devices, opts, out, spread)
        if opts.in_place and not why:
            out.print("measured in place (as the launched chief does): the model profiled on the chief's host, "
                      "stage speeds " + ", ".join(f"{d.speed:.2f}" for d in devices) + " relative to it, a message "
                      "costs each stage " + ", ".join(f"{d.message_s * 1e3:.2f}" for d in devices) + " ms, "
                      f"{opts.dispatch_ms:.1f} ms to dispatch a step", highlight=False)
        if base:
            out.print(f"speeds measured ({opts.speeds or 'now, --bench'}), relative to this machine's "
                      f"{base:,.1f} GFLOP/s",
                      highlight=False)
        if opts.save:
            out.print(f"plan saved to {opts.save} (chosen: {data['chosen'] or 'none'})", highlight=False)
    return 0 if data["chosen"] else 2


def greedy_line(greedy_gap: float | None) -> str | None:
    """What ``partition`` says of the research's greedy plan against the exact one, for this model."""
    if greedy_gap is None:
        return None
    if abs(greedy_gap) < 0.005:
        return "greedy's plan is predicted as fast as the optimal one for this model"
    if greedy_gap < 0:  # optimal minimises the slowest stage (or the sum), not the whole predicted step
        return (f"greedy's plan is predicted {-greedy_gap:.0%} faster than the optimal one for this model "
                "(optimal minimises the slowest stage, not the updates' overhang)")
    return (f"greedy's plan is predicted {greedy_gap:.0%} slower than the optimal one for this model "
            "(launch uses the faster: the saved plan's 'chosen')")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f}"


def _gib(value: float) -> str:
    return "unlimited" if math.isinf(value) else f"{value / 2**30:.2f} GiB"


def render(plans: list[PartitionPlan], layers: list[Layer], devices: list[Device], opts: PartitionOptions,
           console: Console, spread: RandomSpread | None = None) -> None:
    """A summary row per algorithm ("vs random": against random placement's expected step when
    ``spread`` gives it, else against the one random draw), then each feasible plan's stages."""
    total = sum(layer.cost_s for layer in layers)
    update = sum(layer.update_s for layer in layers)
    memory = sum(layer.param_bytes + layer.act_bytes for layer in layers)
    where = "the chief's host" if opts.in_place else "this machine"
    timed = (f"{_ms(total)} ms forward+backward+update on {where} ({_ms(update)} ms of it the optimizer's "
             "update, off the pipeline's critical path)") if total > 0 else "not timed (memory refuses every plan)"
    console.print(f"{opts.model}: {len(layers)} layers, {timed}, "
                  f"{memory / 2**30:.2f} GiB with optimizer state and activations; {len(devices)} device(s); "
                  f"batch {opts.batch_size}, {opts.microbatches} micro-batch(es)", highlight=False)
    random_time = spread.mean_s if spread else \
        next((p.step_time_s for p in plans if p.algorithm == "random" and p.feasible), None)
    summary = Table(title="predicted step time per plan", title_justify="left")
    for column in ("plan", "step ms", "slowest stage ms", "all stages ms", "vs random", "note"):
        summary.add_column(column, justify="left" if column in ("plan", "note") else "right")
    for p in plans:
        name = "single fastest device" if p.algorithm == "single" else p.algorithm
        if not p.feasible:
            summary.add_row(name, "-", "-", "-", "-", Text(f"infeasible: {p.reason}", style="red"))
            continue
        ratio = f"{random_time / p.step_time_s:.2f}x" if random_time and p.step_time_s else "-"
        summary.add_row(name, _ms(p.step_time_s), _ms(p.bottleneck_s), _ms(p.sum_s), ratio, "; ".join(p.notes))
    console.print(summary)
    if spread:
        console.print(f"random placement over {spread.draws} draws: expected step {_ms(spread.mean_s)} ms (10-90%: "
                      f"{_ms(spread.p10_s)}-{_ms(spread.p90_s)} ms); 'vs random' is against the expected step, the "
                      f"random row one draw (--seed {opts.seed})", highlight=False)
    line = greedy_line(gap(plans))
    if line:
        console.print(line, highlight=False)
    for p in plans:
        if not p.feasible or p.algorithm == "single":
            continue
        table = Table(title=f"{p.algorithm}: stages", title_justify="left")
        for column in ("device", "layers", "count", "compute ms", "link ms", "update ms", "memory / limit"):
            table.add_column(column, justify="left" if column in ("device", "layers") else "right")
        for stage in p.stages:
            span = f"{layers[stage.first].name} … {layers[stage.last].name}" if stage.layers else "-"
            table.add_row(stage.device, span, str(stage.layers), _ms(stage.compute_s), _ms(stage.comm_s),
                          _ms(stage.update_s), f"{_gib(stage.memory_bytes)} / {_gib(stage.memory_limit)}")
        console.print(table)
