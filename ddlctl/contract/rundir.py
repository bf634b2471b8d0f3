"""The run directory's file names, ``runs/<run-id>/``: the contract between whoever writes them (the
controller, the host agent, the tasks) and whoever reads them (the summary, ``ddlctl report``,
``ddlctl stop``). Names only, no import: the host agent and every task import it, and start faster
without (:mod:`ddlctl.contract.runfolder` has the controller's helpers for the folder)."""

#: Where ddlctl keeps its files on remote hosts (``~`` is expanded on the host by the watchdog).
REMOTE_ROOT = "~/.ddlctl"

PLAN_FILE = "plan.json"
PIDS_FILE = "pids.json"
OUTCOME_FILE = "outcome.json"
SUMMARY_FILE = "summary.json"
TRACE_FILE = "trace.json"
TASKS_DIR = "tasks"
ATTEMPTS_DIR = "attempts"  # submit --requeue: the records of a run's attempts before the last, attempts/<n>/
TELEMETRY_DIR = "telemetry"
HANG_DIR = "hang"
TASK_LOG = "output.log"
TASK_ERROR = "error.json"
TASK_STEPS = "steps.jsonl"  # a task's step records (ddlctl.task.steps)
TASK_TRACE_DIR = "profile"  # a task's TensorFlow Profiler captures (ddlctl.task.trace): plugins/profile/<session>/
TASK_CAPTURE = "capture.json"  # what a task's profiler capture covered: steps, times, its session folder
TASK_TRACE_REQUEST = "trace-request.json"  # --trace auto: a capture ddlctl asks of a running task
TASK_PROFILING = "profiling.json"  # while a task's profiler captures: its session (a crash then is TensorFlow's)
PROFILE_DIR = "profile"  # a run's captures of every task, laid out for XProf / TensorBoard
TASK_PID = "pid.json"  # the pid a host agent started a task as (ddlctl.host.agent)
TASK_PHASES = "phases.jsonl"  # a task's checkpoint saves and evaluations (ddlctl.phase)
TASK_RESULT = "result.json"  # the built-in workload's final loss and accuracy
TASK_FLOPS = "flops.json"  # model FLOPs per training sample (ddlctl.task.flops)
TASK_CHECKPOINT_COPY = "ckpt-scratch"  # an mwms worker's own copy of each checkpoint (worker 0 writes the shared one)
