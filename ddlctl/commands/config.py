"""What ``ddlctl launch`` (and ``profile``, ``compare``) was asked to do, as typed values grouped
by concern. The CLI builds one :class:`LaunchConfig` with explicit keywords; each consumer takes
only its group (the cluster loader the source, the planner the request and workload, the
supervisor its options, the console the output). ``None`` means "not given": the template's
value, else the default, applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddlctl.supervise.job import SupervisorOptions
from ddlctl.transport.options import SshOptions


@dataclass(frozen=True)
class ClusterSource:
    """Where the cluster comes from: a hosts file, a template, the Slurm allocation, or this machine."""

    hosts: str | None = None
    template: str | None = None
    slurm: bool = False  # the cluster is the Slurm allocation ddlctl runs in; tasks start through srun
    python: str | None = None  # --slurm: the nodes' interpreter (default: the one running ddlctl)
    private_network: bool = False  # a local-only job in a network namespace of its own (transport/netns.py)


@dataclass(frozen=True)
class RequestOptions:
    """What to run on the cluster: strategy, tasks, environment, the program."""

    strategy: str | None = None
    workers: int | None = None
    ps: int | None = None
    evaluator: bool | None = None
    data_workers: int | None = None  # --data-workers: the tf.data service's workers
    env: Sequence[str] = ()  # KEY=VALUE or KEY (ddlctl's own value)
    legacy_keras: bool = True
    telemetry: bool = True
    sample_interval_s: float = 1.0
    auto_steps: bool = True
    prefork: bool = True  # TensorFlow tasks forked from a zygote per host (--no-prefork: plain starts)
    partition: str | None = None  # a plan file of ddlctl partition (--strategy model)
    worker_per: str | None = None  # None: the template's, else "auto"
    balance: str | None = None  # None: the template's, else "off"
    speeds: str | None = None  # a cluster profile of ddlctl check --bench (--balance speed)
    bench: bool = False  # measure the hosts first (as check --bench) and use those speeds
    trace: str | None = None  # "A-B": a TensorFlow Profiler capture of those steps in every task; "auto"; "off"
    command: Sequence[str] = field(default_factory=tuple)  # empty: the built-in workload


@dataclass(frozen=True)
class WorkloadOptions:
    """The built-in workload's settings (refused beside a command of the user's)."""

    workload: str | None = None
    steps: int | None = None
    batch_size: int | None = None
    execution: str | None = None


@dataclass(frozen=True)
class OutputOptions:
    """Where the run goes and what people (or programs) see."""

    run_dir: str = "runs"  # the folder that receives run directories
    run_id: str | None = None  # the run directory's name (default: generated)
    dry_run: bool = False
    json_out: bool = False
    profile: bool = False  # the live view and the full report
    quiet: bool = False
    verbose: bool = False
    task_colors: bool = False  # let tasks' colour sequences through to the console (other controls never)
    metrics: str | None = None  # --metrics-port: [HOST:]PORT to serve Prometheus metrics on while the job runs
    tensorboard: bool = False  # --tensorboard: the run's scalars as TensorBoard event files at its end
    resumed: bool = False  # launch --resume: the run folder (--run-id) goes on as its next attempt
    options: tuple[str, ...] = ()  # the launch's own options, recorded in launch.json (ddlctl.commands.resume)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything ``ddlctl launch`` was given."""

    cluster: ClusterSource = field(default_factory=ClusterSource)
    request: RequestOptions = field(default_factory=RequestOptions)
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    supervision: SupervisorOptions = field(default_factory=SupervisorOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    ssh: SshOptions = field(default_factory=SshOptions)
