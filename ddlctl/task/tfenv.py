"""Task-side helpers: read what ddlctl put in the environment, prepare TensorFlow for it."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ddlctl.contract import envvars
from ddlctl.contract.strategies import facts_of


@dataclass(frozen=True)
class TaskContext:
    """Who this process is in the job, from ``TF_CONFIG`` and ``DDLCTL_*`` variables."""

    strategy: str
    role: str
    index: int
    num_workers: int
    task_dir: str | None
    task: str = ""  # ddlctl's name of the task ($DDLCTL_TASK; its TF_CONFIG index differs once workers left)

    @property
    def name(self) -> str:
        return self.task or f"{self.role}:{self.index}"

    @property
    def is_chief(self) -> bool:
        """The chief task of ps, worker 0 of mwms, the only process otherwise."""
        return self.name == facts_of(self.strategy).leader


def task_context(default_strategy: str = "one_device") -> TaskContext:
    """Read the context from the environment (usable outside ddlctl: one local process, or a
    TF_CONFIG written by hand, whose cluster says the strategy: a ``ps`` job means parameter
    servers, several workers mean multi-worker mirrored)."""
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = tf_config.get("task", {})
    cluster = tf_config.get("cluster", {})
    if cluster.get("ps"):
        default_strategy = "ps"
    elif len(cluster.get("worker", [])) + len(cluster.get("chief", [])) > 1:
        default_strategy = "mwms"
    return TaskContext(
        strategy=os.environ.get(envvars.STRATEGY, default_strategy),
        role=task.get("type", "worker"),
        index=int(task.get("index", 0)),
        num_workers=int(os.environ.get(envvars.NUM_WORKERS, len(cluster.get("worker", [])) or 1)),
        task_dir=os.environ.get(envvars.TASK_DIR),
        task=os.environ.get(envvars.TASK, ""),
    )


def quiet_tensorflow_logs() -> None:
    """Hide TensorFlow's C++ INFO and WARNING lines unless the user chose a level.

    Level 1 does not hide the INFO lines TF 2.21 prints before absl logging is initialised.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow():  # noqa: ANN201 - the tensorflow module
    """``import tensorflow`` for ddlctl's own task programs: where it is not imported yet (a plain
    start: a GPU host, ``--no-prefork``), with the collector off and what it made frozen, as a
    zygote imports it (:mod:`ddlctl.task.gcfreeze`)."""
    import sys

    if "tensorflow" not in sys.modules:
        from ddlctl.task.gcfreeze import collector_off_then_frozen

        with collector_off_then_frozen():
            import tensorflow  # noqa: F401
    return sys.modules["tensorflow"]


def start_tensorflow_quietly() -> None:
    """In a ddlctl command that runs TensorFlow itself: import it and find its devices with its
    start-up notices hidden (the cuInit error line of a CPU-only host among them; TF_CPP_MIN_LOG_LEVEL
    cannot hide an ERROR line without hiding real errors). Anything else it prints is kept."""
    from ddlctl.diagnose.tfnoise import startup_noise_hidden
    from ddlctl.task.gcfreeze import collector_off_then_frozen

    quiet_tensorflow_logs()
    with startup_noise_hidden(), collector_off_then_frozen():  # (and the command's end skips what it made)
        import tensorflow as tf

        tf.config.list_physical_devices()


#: Functions of ddlctl's own measurements (``ddlctl.modelparallel.profile``, ``ddlctl.modelparallel``):
#: each is traced once per layer, stage or device it measures, which TensorFlow calls retracing.
OWN_TRACED = ("noop_call.<locals>", "_layer_step.<locals>", "_whole_step.<locals>", "_stage_work.<locals>",
              "measure_link.<locals>", "_chain.<locals>", "_update_call.<locals>")


class _OwnRetracing(logging.Filter):
    """Drops TF's "N out of the last N calls to ... triggered tf.function retracing" warning when
    it is about TensorFlow's or ddlctl's own functions, which says nothing about the program: TF
    2.21 retraces its checkpoint-saving function (``MultiDeviceSaver``) on every save under
    ParameterServerStrategy, and ddlctl's measurements trace one function per thing measured."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "retracing" not in message or not any(name in message for name in ("MultiDeviceSaver", *OWN_TRACED))


def quiet_own_retracing() -> None:
    """Install :class:`_OwnRetracing` on TensorFlow's Python logger (once per process)."""
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _OwnRetracing) for f in logger.filters):
        logger.addFilter(_OwnRetracing())


#: Set by the first SIGTERM where :func:`honour_sigterm` was asked to checkpoint first.
STOP_ASKED: list[bool] = []


def honour_sigterm(checkpoint_first: bool = False) -> None:
    """End on SIGTERM as a plain process does. MultiWorkerMirroredStrategy's preemption notifier
    installs a C handler that catches SIGTERM and keeps the process running, so every stop or
    group restart of an MWMS job waited out a grace period before SIGKILL. ddlctl's own tasks call
    this once their strategy exists: its TERM then ends them at once (a checkpoint is the way back,
    as after SIGKILL). A program of one's own can do the same (``signal.signal(SIGTERM, SIG_DFL)``).

    ``checkpoint_first`` (the built-in workload on one host, with a checkpoint folder): the first
    SIGTERM only asks (``STOP_ASKED``): the training loop saves a checkpoint at its next step
    boundary and ends (exit 143); a second one ends the process at once."""
    def asked(signum: int, _frame: object) -> None:
        if STOP_ASKED:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        STOP_ASKED.append(True)

    signal.signal(signal.SIGTERM, asked if checkpoint_first else signal.SIG_DFL)


def should_stop(strategy=None) -> bool:  # noqa: ANN001 - a tf.distribute strategy
    """Whether ddlctl asked this task to stop (SIGTERM: a preemption, Slurm's time limit under
    ``submit --requeue``, ``ddlctl stop``): save a checkpoint, then exit. The first call makes the
    first SIGTERM only ask (:func:`honour_sigterm`; a second one ends the process at once). With a
    MultiWorkerMirroredStrategy, whether any worker was asked: every worker must call it at the same
    point (a sum over the workers), so that all save at the same step."""
    if not _ASKING:
        _ASKING.append(True)
        honour_sigterm(checkpoint_first=True)
    asked = bool(STOP_ASKED)
    if strategy is None:
        return asked
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return asked
    flag = tf.constant(1.0 if asked else 0.0)
    values = strategy.experimental_distribute_values_from_function(lambda _ctx: flag)
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)) > 0


_ASKING: list[bool] = []  # (should_stop has installed its handler)


def min_inter_op_threads(num_workers: int) -> int:
    """Inter-op threads a task needs: at least ``num_workers + 1`` (small hosts hang otherwise)."""
    return max(os.cpu_count() or 1, num_workers + 1)


def not_listening(addresses: Sequence[str], up_to_s: float, interval_s: float = 0.02) -> list[str]:
    """Wait until every ``host:port`` accepts a TCP connection, or ``up_to_s`` passed; those that
    still do not. A program connecting to a cluster whose tasks are still importing TensorFlow
    otherwise waits out gRPC's reconnect backoff; this notices a task's port within ``interval_s``."""
    deadline = time.monotonic() + up_to_s
    missing = list(addresses)
    while missing:
        still = []
        for address in missing:
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                    pass
            except (OSError, ValueError):
                still.append(address)
        missing = still
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    return missing


def cluster_addresses(role: str, index: int) -> list[str]:
    """``host:port`` of every task in ``TF_CONFIG``'s cluster but this one (evaluators aside)."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    return [address for job, addresses in sorted(cluster.items()) if job != "evaluator"
            for i, address in enumerate(addresses) if (job, i) != (role, index)]
