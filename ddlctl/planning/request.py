"""What the user asked for (:class:`LaunchRequest`, after option parsing and template defaults) and
where a task goes (:class:`Placement`, before ports and commands)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddlctl.cluster.model import Host

WORKER_PER: tuple[str, ...] = ("auto", "gpu", "host")
BALANCE: tuple[str, ...] = ("off", "speed")

#: Env keys whose values are replaced by "***" in plan.json and --dry-run output.
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked for, after option parsing and template defaults.

    ``command`` is the user program's argv, or empty for the built-in workload (configured by
    ``workload_args``). ``local_python`` is the interpreter for local hosts without ``python=``;
    ``default_workdir`` is where tasks start on hosts without ``workdir=``.
    """

    strategy: str
    workers: int | None = None
    ps: int | None = None
    evaluator: bool = False
    command: tuple[str, ...] = ()
    workload_args: tuple[str, ...] = ()
    global_batch: int | None = None  # the built-in workload's examples per step (None: a command's own)
    env: Mapping[str, str] = field(default_factory=dict)
    legacy_keras: bool = True
    local_python: str = "python3"
    command_python_here: str | None = None  # what a bare ``python`` of ``command`` means here (None: PATH's)
    default_workdir: str = "."
    run_id: str = "run"
    run_dir: str = "runs/run"
    telemetry: bool = True
    sample_interval_s: float = 1.0
    auto_steps: bool = True
    prefork: bool = True  # tasks forked from a process that imported TensorFlow (ddlctl.host.prefork)
    trace: tuple[int, int] | None = None  # steps to capture with TensorFlow's profiler (ddlctl.task.trace)
    trace_auto: bool = False  # --trace auto: captures asked while the job runs (ddlctl.supervise.autotrace)
    data_workers: int | None = None  # tf.data service workers (None: a roles=data host slot each; planning.dataservice)
    worker_per: str = "auto"
    balance: str = "off"
    speeds: Mapping[str, float] = field(default_factory=dict)  # host label -> measured device speed


@dataclass(frozen=True)
class Placement:
    """A task's role, index, host and GPUs, before ports and commands are attached."""

    role: str
    index: int
    host: Host
    gpus: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"
