"""The environment variables ddlctl gives every task: the contract between the controller (which
writes them into each task's spec), the host agent and the code inside the tasks (which read them).

Standard library only, on purpose: the host agent and the instrumentation import it on any Python.
"""

import re

RUN_ID = "DDLCTL_RUN_ID"  # the run's id (every process of a run carries it: ``ddlctl stop`` finds them)
#: One launch's own key (random, every process of one ``ddlctl launch`` carries it): what tells two
#: launches given the same ``--run-id`` apart (the second is refused while the first runs).
LAUNCH = "DDLCTL_LAUNCH"
TASK = "DDLCTL_TASK"  # the task's name, ``role:index``
TASK_DIR = "DDLCTL_TASK_DIR"  # the task's folder on its host: steps.jsonl, result.json ...
STRATEGY = "DDLCTL_STRATEGY"  # ps, mwms, model, mirrored, central_storage, one_device
NUM_WORKERS = "DDLCTL_NUM_WORKERS"
CHECKPOINT_DIR = "DDLCTL_CHECKPOINT_DIR"  # where the built-in workload checkpoints (restarts resume there)
RESTART_COUNT = "DDLCTL_RESTART_COUNT"  # how often this task was started again (0 the first time)
TRACE_STEPS = "DDLCTL_TRACE_STEPS"  # "A-B": capture the TensorFlow Profiler over steps A to B (ddlctl.task.trace)
PROFILER_SERVE = "DDLCTL_PROFILER_SERVE"  # --trace: the port ddlctl planned for this server task's profiler
PROFILER_ADDRESSES = "DDLCTL_PROFILER_ADDRESSES"  # --trace, a ps chief: JSON server task -> "host:port" to trace
DATA_SERVICE = "DDLCTL_DATA_SERVICE"  # a trainer: the tf.data service's dispatcher, grpc://host:port
DATA_DISPATCHER = "DDLCTL_DATA_DISPATCHER"  # a data worker: its dispatcher's host:port
DATA_ADDRESS = "DDLCTL_DATA_ADDRESS"  # a dispatcher or data worker: its own host:port (binds the port)
SIGNAL_BEFORE = "DDLCTL_SIGNAL_BEFORE"  # submit --requeue: seconds before the time limit Slurm sends SIGUSR1
#: "1": the built-in workload checkpoints on SIGTERM, then ends (set under --min-workers and where
#: ddlctl may stop the job at a Slurm time limit: a worker leaving, or the job stopping, loses no
#: step; ``--env DDLCTL_STOP_CHECKPOINTS=0`` turns it off)
STOP_CHECKPOINTS = "DDLCTL_STOP_CHECKPOINTS"
MAX_REQUEUES = "DDLCTL_MAX_REQUEUES"  # submit --requeue: the times ddlctl requeues the job at its time limit
TOTAL_STEPS = "DDLCTL_TOTAL_STEPS"  # the steps the program declared it will run (progress bars)
AUTO_STEPS = "DDLCTL_AUTO_STEPS"  # "1": the model.fit hook records steps on its own
PARTITION = "DDLCTL_PARTITION"  # model parallelism: layers per stage, "3,2,1"
SPEEDS = "DDLCTL_SPEEDS"  # per-worker device speeds (JSON list), for --balance speed and model stages
BALANCE = "DDLCTL_BALANCE"  # "speed": split each step's batch by speed
DEVICES = "DDLCTL_DEVICES"  # JSON: each worker's host and GPUs
# a diagnostic: a server task (ps worker or ps, model stage) also serves TensorFlow's profiler, on
# this port + its index (workers) or + 100 + its index (ps), for tf.profiler's client.trace
PROFILER_PORT = "DDLCTL_PROFILER_PORT"
PREFORK = "DDLCTL_PREFORK"  # "0": every task starts as its own interpreter (no zygote; --no-prefork)
#: Python's own (3.11+): "1" keeps the working directory off ``sys.path`` (``python -m`` puts it first).
#: Set for ddlctl's own processes so that a ``json.py`` in a shared working directory is never
#: imported by them: the host agents, probes and ``submit``'s batch script by whoever starts them;
#: the tasks by their host agent, which gives it to ``python -m ddlctl...`` (servers, the built-in
#: workload, telemetry agents, benches) and takes it out of a program's environment unless
#: ``--env`` asks for it.
SAFE_PATH = "PYTHONSAFEPATH"


#: A variable name a process environment can hold and a shell can export.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_entry_problem(key: str, value: str) -> str | None:
    """Why ``KEY=VALUE`` cannot be in a task's environment (None when it can): the name must be
    letters, digits and '_' (not starting with a digit; an '=' would cut it short), and no value
    may hold a NUL byte (nothing after it would arrive)."""
    if not isinstance(key, str) or not ENV_NAME.match(key):
        return f"{key!r} is not a variable name (letters, digits and '_', not starting with a digit)"
    if not isinstance(value, str):
        return f"the value of {key} is not text ({value!r})"
    if "\0" in value:
        return f"the value of {key} holds a NUL byte"
    return None
