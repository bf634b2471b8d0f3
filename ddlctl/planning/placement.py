"""Where each task goes: the cluster's hosts and a request -> placements (role, index, host, GPUs), one per task."""

from __future__ import annotations

from collections.abc import Sequence

from ddlctl.cluster.model import Cluster, Host
from ddlctl.contract.errors import PlanError
from ddlctl.contract.strategies import (
    SERVER_STRATEGIES,
    SINGLE_HOST_STRATEGIES,
    STRATEGIES,
    facts_of,
)
from ddlctl.contract.strategies import TABLE as STRATEGY_FACTS
from ddlctl.planning.dataservice import data_placements
from ddlctl.planning.request import WORKER_PER, LaunchRequest, Placement


def _preferred(cluster: Cluster, role: str) -> list[Host]:
    """Hosts that name ``role`` explicitly, else every host that accepts it (for ``ps``: the CPU-only
    ones among them when the cluster also has GPU hosts)."""
    explicit = [h for h in cluster.hosts if role in h.roles]
    accepting = [h for h in cluster.hosts if h.accepts(role)]
    if not explicit and role == "ps" and any(h.gpus for h in cluster.hosts):
        return [h for h in accepting if not h.gpus] or accepting
    return explicit or accepting


def _no_host(cluster: Cluster, role: str) -> PlanError:
    return PlanError(f"no host in {cluster.source or 'the cluster'} accepts the {role} role",
                     f"add {role} to some host's roles= (or drop roles= from a host)")


def _gpu_split(count: int, gpus: int) -> list[tuple[int, ...] | None]:
    """GPU ids for ``count`` tasks sharing a host with ``gpus`` GPUs."""
    if gpus <= 0:
        return [None] * count
    if count <= gpus:
        return [tuple(range(i * gpus // count, (i + 1) * gpus // count)) for i in range(count)]
    return [(i % gpus,) for i in range(count)]


def layout(cluster: Cluster, request: LaunchRequest) -> list[Placement]:
    """Place the tasks of ``request.strategy`` on ``cluster`` (see the module docstring), then the
    tf.data service's (:mod:`~ddlctl.planning.dataservice`)."""
    strategy = request.strategy
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}", "expected one of: " + ", ".join(STRATEGIES))
    if strategy in SINGLE_HOST_STRATEGIES:
        return [*_layout_single(cluster, request), *data_placements(cluster, request)]
    return [*_layout_training(cluster, request), *data_placements(cluster, request)]


def _layout_training(cluster: Cluster, request: LaunchRequest) -> list[Placement]:
    strategy = request.strategy
    if request.ps and not facts_of(strategy).has_ps:
        raise PlanError(f"--ps {request.ps} only applies to the ps strategy, not {strategy}")
    if facts_of(strategy).has_ps and request.ps is not None and request.ps < 1:
        raise PlanError("the ps strategy needs at least one ps task (--ps 1 or more)")

    worker_hosts = [h for h in cluster.hosts if h.accepts("worker")]
    if not worker_hosts:
        raise _no_host(cluster, "worker")
    per_gpu = worker_per_gpu(worker_hosts, request)
    capacity = {h: (h.gpus or h.slots) if per_gpu else h.slots for h in worker_hosts}
    total = sum(capacity.values())
    default_workers = total if strategy in SERVER_STRATEGIES or per_gpu else len(worker_hosts)
    workers = default_workers if request.workers is None else request.workers
    if workers < 1:
        raise PlanError(f"--workers must be at least 1 (got {workers})")
    if workers > total:
        what = "worker devices (one per GPU, slots= on CPU-only hosts)" if per_gpu else "worker slots"
        raise PlanError(
            f"{workers} workers requested but the cluster has {total} {what} "
            f"({', '.join(f'{h.label}: {capacity[h]}' for h in worker_hosts)})",
            "lower --workers, or raise " + ("gpus=/" if per_gpu else "") + "slots= on hosts in "
            + (cluster.source or "the hosts file"),
        )
    counts = dict.fromkeys(worker_hosts, 0)
    if strategy in SERVER_STRATEGIES:
        remaining = workers
        for host in worker_hosts:  # fill slots in file order
            counts[host] = min(capacity[host], remaining)
            remaining -= counts[host]
    else:
        placed = 0
        while placed < workers:  # one per host, then a second per host, ...
            for host in worker_hosts:
                if placed < workers and counts[host] < capacity[host]:
                    counts[host] += 1
                    placed += 1

    placements: list[Placement] = []
    if strategy in SERVER_STRATEGIES:
        chief_hosts = _preferred(cluster, "chief")
        if not chief_hosts:
            raise _no_host(cluster, "chief")
        placements.append(Placement("chief", 0, chief_hosts[0]))
    index = 0
    for host in worker_hosts:
        split = [(g,) for g in range(counts[host])] if per_gpu and host.gpus else _gpu_split(counts[host], host.gpus)
        for gpus in split:
            placements.append(Placement("worker", index, host, gpus))
            index += 1
    if facts_of(strategy).program_lockstep:
        _require_equal_gpus([p for p in placements if p.role == "worker"])
    if facts_of(strategy).has_ps:
        ps_hosts = _preferred(cluster, "ps")
        if not ps_hosts:
            raise _no_host(cluster, "ps")
        n_ps = 1 if request.ps is None else request.ps
        placements.extend(Placement("ps", i, ps_hosts[i % len(ps_hosts)], ()) for i in range(n_ps))
    if request.evaluator:
        eval_hosts = _preferred(cluster, "evaluator")
        if not eval_hosts:
            raise _no_host(cluster, "evaluator")
        placements.append(Placement("evaluator", 0, eval_hosts[-1]))
    return placements


def worker_per_gpu(worker_hosts: Sequence[Host], request: LaunchRequest) -> bool:
    """Whether workers are placed one per GPU (``--worker-per``; ``auto``: under mwms when the worker
    hosts' GPU counts differ)."""
    if request.worker_per not in WORKER_PER:
        raise PlanError(f"unknown --worker-per {request.worker_per!r}", "expected one of: " + ", ".join(WORKER_PER))
    if request.worker_per == "gpu":
        if not any(h.gpus for h in worker_hosts):
            raise PlanError("--worker-per gpu: no worker host declares gpus=N",
                            "declare gpus=N on GPU hosts, or use slots=N for CPU workers (--worker-per host)")
        return True
    if request.worker_per == "host":
        return False
    unequal = len({h.gpus for h in worker_hosts}) > 1 and any(h.gpus for h in worker_hosts)
    facts = STRATEGY_FACTS.get(request.strategy)
    return bool(facts and facts.batch_split and unequal)


def _require_equal_gpus(workers: Sequence[Placement]) -> None:
    """MultiWorkerMirroredStrategy needs the same number of GPUs in every worker (TensorFlow #47203)."""
    counts = {p.name: len(p.gpus or ()) for p in workers}
    if len(set(counts.values())) <= 1:
        return
    listing = ", ".join(f"{p.name} on {p.host.label}: {counts[p.name]}" for p in workers)
    if 0 in counts.values():
        raise PlanError(
            f"mwms needs the same number of GPUs in every worker, but some workers would have none ({listing})",
            "give CPU-only hosts roles=ps or roles=evaluator (or leave them out), or use --strategy ps, "
            "whose ps tasks go to CPU-only hosts")
    raise PlanError(
        f"mwms needs the same number of GPUs in every worker (TensorFlow #47203), but the plan gives {listing}",
        "use --worker-per gpu (one worker per GPU, each with one GPU), or equal gpus=/slots= per host")


def _layout_single(cluster: Cluster, request: LaunchRequest) -> list[Placement]:
    strategy = request.strategy
    trainers = [h for h in cluster.hosts if h.roles != ("data",)]  # (data-only hosts serve its input)
    if len(trainers) != 1:
        raise PlanError(
            f"the {strategy} strategy runs on one host, but {cluster.source or 'the cluster'} "
            f"lists {len(trainers)} hosts" + (" besides its data hosts" if len(trainers) < len(cluster.hosts) else ""),
            "use --strategy mwms or ps for several hosts, or a hosts file with one host",
        )
    for flag, value in (("--workers", request.workers), ("--ps", request.ps)):
        if value not in (None, 0) and not (flag == "--workers" and value == 1):
            raise PlanError(f"{flag} {value} does not apply to the {strategy} strategy",
                            f"{strategy} runs one process; drop {flag}")
    if request.evaluator:
        raise PlanError(f"--evaluator does not apply to the {strategy} strategy")
    if request.worker_per != "auto":
        raise PlanError(f"--worker-per {request.worker_per} does not apply to the {strategy} strategy",
                        f"{strategy} runs one process on one host; use --strategy mwms for one worker per GPU")
    host = trainers[0]
    gpus = tuple(range(host.gpus)) if host.gpus else None
    if facts_of(strategy).one_device and host.gpus:
        gpus = (0,)
    return [Placement("worker", 0, host, gpus)]
