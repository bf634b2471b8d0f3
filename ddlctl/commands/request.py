"""The launch's options -> a LaunchRequest: strategy, environment, a saved partition or speeds, a batch
that divides among the workers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ddlctl.cluster.source import DEFAULT_LOCAL_WORKERS
from ddlctl.cluster.template import LaunchDefaults
from ddlctl.commands.config import RequestOptions, WorkloadOptions
from ddlctl.contract import envvars
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.strategies import facts_of
from ddlctl.planning.plan import (
    MULTI_HOST_STRATEGIES,
    LaunchRequest,
)
from ddlctl.task.trace import parse_steps

if TYPE_CHECKING:
    pass


def parse_env(items: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``["A=1", "B=x=y", "TOKEN"]`` -> ``{"A": "1", "B": "x=y", "TOKEN": <TOKEN of environ>}``: a
    bare KEY passes ddlctl's own value on (so a secret never has to be on any command line)."""
    environ = os.environ if environ is None else environ
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not envvars.ENV_NAME.match(key):
            raise ConfigError(f"--env {item!r} is not KEY=VALUE or KEY",
                              "KEY is letters, digits and '_', not starting with a digit")
        if not sep:
            if key not in environ:
                raise ConfigError(f"--env {key}: {key} is not set in ddlctl's environment",
                                  f"export {key}=... before running ddlctl, or give --env {key}=VALUE")
            value = environ[key]
        env[key] = value
    return env


def partition_counts(path: str) -> list[int]:
    """Layers per stage of the chosen plan in a ``ddlctl partition --save`` file."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
        chosen = next(p for p in data["plans"] if p["algorithm"] == data["chosen"])
        return [int(stage["layers"]) for stage in chosen["stages"]]
    except OSError as exc:
        raise ConfigError(f"--partition {path}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, StopIteration):
        raise ConfigError(f"--partition {path}: not a plan saved by ddlctl partition --save (or no plan in it "
                          "could place the model)") from None


def own_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ddlctl runs from a Python environment of its own (a venv) that no other replaced on
    PATH (none activated: ``VIRTUAL_ENV``, ``CONDA_PREFIX`` unset): then a bare ``python`` of the
    command means ddlctl's interpreter on this machine (PATH's would be the system's, without
    TensorFlow), not whatever PATH finds."""
    environ = os.environ if environ is None else environ
    return sys.prefix != sys.base_prefix and not environ.get("VIRTUAL_ENV") and not environ.get("CONDA_PREFIX")


def load_speeds(path: str) -> dict[str, float]:
    """Per-host device speeds from a cluster profile (``ddlctl check --bench --save FILE``)."""
    from ddlctl.commands.bench import load_profile

    return {label: host.speed for label, host in load_profile(path).hosts.items()}


def resolve_strategy(req: RequestOptions, defaults: LaunchDefaults) -> str:
    """The option, else the template's strategy, else mwms."""
    return req.strategy or defaults.strategy or "mwms"


def build_request(req: RequestOptions, work: WorkloadOptions, runs_dir: str, defaults: LaunchDefaults,
                  implicit: bool, legacy_keras: bool, run_id: str) -> LaunchRequest:
    """Merge options over template defaults into a :class:`LaunchRequest`."""
    strategy = resolve_strategy(req, defaults)
    workers = req.workers if req.workers is not None else defaults.workers
    if workers is None and implicit and strategy in MULTI_HOST_STRATEGIES:
        workers = DEFAULT_LOCAL_WORKERS
    workload_given = [f for f, v in (("--workload", work.workload), ("--steps", work.steps),
                                     ("--batch-size", work.batch_size), ("--execution", work.execution))
                      if v is not None]
    if req.command and workload_given:
        verb = "applies" if len(workload_given) == 1 else "apply"
        raise ConfigError(f"{', '.join(workload_given)} only {verb} to the built-in workload, "
                          f"not to a command ({' '.join(req.command)})",
                          "pass them to your own program after '--' instead")
    workload_args: tuple[str, ...] = ()
    global_batch = None
    if not req.command:
        global_batch = work.batch_size or 64
        workload_args = ("--workload", work.workload or "cnn", "--steps", str(work.steps or 200),
                         "--batch-size", str(global_batch),
                         "--execution", work.execution or "pipelined")
    env = {**defaults.env, **parse_env(req.env)}
    if req.partition:
        if not facts_of(strategy).stages:
            raise ConfigError(f"--partition applies to --strategy model, not {strategy}")
        env[envvars.PARTITION] = ",".join(map(str, partition_counts(req.partition)))
    balance = req.balance or defaults.balance or "off"
    if req.speeds and req.bench:
        raise ConfigError("give --speeds FILE or --bench, not both", "--bench measures now; --speeds reads a profile")
    if req.speeds and balance != "speed" and not facts_of(strategy).stages:
        raise ConfigError("--speeds applies with --balance speed (mwms) or --strategy model",
                          "add --balance speed, or drop --speeds")
    speeds = req.speeds or (defaults.profile if balance == "speed" or facts_of(strategy).stages else None)
    run_root = Path(runs_dir).expanduser().resolve()
    evaluator = req.evaluator if req.evaluator is not None else bool(defaults.evaluator)
    return LaunchRequest(
        strategy=strategy,
        workers=workers,
        ps=req.ps if req.ps is not None else defaults.ps,
        evaluator=evaluator,
        data_workers=req.data_workers,
        command=tuple(req.command),
        workload_args=workload_args,
        global_batch=global_batch,
        env=env,
        legacy_keras=legacy_keras,
        local_python=sys.executable,
        command_python_here=sys.executable if own_environment() else None,
        default_workdir=os.getcwd(),
        run_id=run_id,
        run_dir=str(run_root / run_id),
        telemetry=req.telemetry,
        sample_interval_s=req.sample_interval_s,
        auto_steps=req.auto_steps,
        prefork=req.prefork,
        trace=trace_steps(req.trace),
        trace_auto=req.trace == "auto",
        worker_per=req.worker_per or defaults.worker_per or "auto",
        balance=balance,
        speeds=load_speeds(speeds) if speeds else {},
    )


def trace_steps(text: str | None) -> tuple[int, int] | None:
    """``--trace A-B`` as (A, B) (None: no capture, or ``auto``/``off``); a clear error for anything else."""
    if text is None or text in ("auto", "off"):
        return None
    try:
        return parse_steps(text)
    except ValueError as exc:
        raise ConfigError(f"--trace {exc}") from None


def check_min_workers(min_workers: int, strategy: str, workers: int, max_restarts: int) -> None:
    """``--min-workers`` needs a strategy whose workers can leave (mwms, ps), no more than there are,
    and a restart to spend (going on without a lost host is one)."""
    if not min_workers:
        return
    if not facts_of(strategy).elastic:
        raise ConfigError(f"--min-workers applies to --strategy mwms or ps, not {strategy}",
                          "drop --min-workers, or use -s mwms / -s ps")
    if not max_restarts:
        raise ConfigError("--min-workers needs --max-restarts 1 or more: going on without a lost host is a "
                          "restart (of the group under mwms)", "add --max-restarts N")
    if min_workers > workers:
        raise ConfigError(f"--min-workers {min_workers} is more than the {workers} worker(s) of this cluster",
                          f"use at most --min-workers {workers}")


def sizes_to_split(workers: int, min_workers: int = 0) -> int:
    """The number every mwms batch must divide by: each worker count the job may have (from
    ``min_workers`` to ``workers``), so the global batch stays the same through membership changes."""
    return math.lcm(*range(max(1, min_workers or workers), workers + 1))


def fit_batch_to_workers(batch_size: int | None, request: LaunchRequest, workers: int,
                         min_workers: int = 0) -> LaunchRequest:
    """mwms splits each step's batch evenly over workers: round the default batch up to a multiple,
    refuse a given one that does not divide (before anything starts). With ``--min-workers`` it must
    divide by every worker count from that to ``workers``: the global batch is kept when workers
    leave (each remaining worker takes more), so the model trains on as before."""
    if request.command or not facts_of(request.strategy).batch_split or workers <= 1:
        return request
    multiple = sizes_to_split(workers, min_workers)
    if request.balance == "speed":  # shares by speed: any batch with an example per worker
        batch = batch_size or 64
        if batch < workers:
            raise ConfigError(f"--batch-size {batch} cannot give each of {workers} mwms workers an example",
                              f"use at least --batch-size {workers}")
        return request
    if batch_size is not None:
        if batch_size % multiple:
            fitted = -(-batch_size // multiple) * multiple
            counts = f"{workers} mwms workers" if multiple == workers else \
                f"any of {min_workers} to {workers} mwms workers (--min-workers)"
            raise ConfigError(f"--batch-size {batch_size} cannot be split evenly over {counts}",
                              f"use a multiple of {multiple}, e.g. --batch-size {fitted}")
        return request
    args = list(request.workload_args)
    index = args.index("--batch-size") + 1
    fitted = -(-int(args[index]) // multiple) * multiple
    args[index] = str(fitted)
    return dataclasses.replace(request, workload_args=tuple(args), global_batch=fitted)


def tf_keras_available() -> bool:
    """Whether tf-keras (Keras 2, needed for model.fit under ps/mwms) is importable here."""
    return importlib.util.find_spec("tf_keras") is not None
