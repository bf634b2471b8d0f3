"""``ddlctl submit``: write an sbatch script that runs ``ddlctl launch --slurm``, submit it, and
(with ``--follow``) stream its output until the job ends, polling ``scontrol show job`` (no
``sacct``: many clusters do not expose accounting).

The script, the job's output (``slurm-<job>.out``) and ``submit.json`` (the job id, for ``ddlctl
stop``) are in the run directory, which the batch node must see (a shared file system) for
``--follow`` and the report; the job itself runs either way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from ddlctl.cluster.slurm import job_state
from ddlctl.contract import envvars
from ddlctl.contract.errors import ConfigError, LaunchError
from ddlctl.contract.rundir import OUTCOME_FILE
from ddlctl.contract.runfolder import make_dir, new_run_id

#: Job states after which nothing more happens (``scontrol show job``'s JobState).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+-\d+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class SubmitOptions:
    """What ``ddlctl submit`` was given; ``launch_args`` go to ``ddlctl launch --slurm`` as they are."""

    nodes: int = 1
    partition: str | None = None
    time_limit: str | None = None
    gpus_per_node: int | None = None
    ntasks_per_node: int | None = None
    job_name: str | None = None
    sbatch_args: Sequence[str] = ()
    runs_dir: str = "runs"
    follow: bool = False
    poll_s: float = 1.0
    launch_args: Sequence[str] = field(default_factory=tuple)
    requeue: bool = False  # the job may be requeued (preemption, scontrol requeue): it goes on in its run folder
    signal_before: int = 120  # --requeue: Slurm's SIGUSR1 this many seconds before the time limit
    max_requeues: int = 3  # --requeue: times ddlctl requeues the job at its time limit


def sbatch_script(opts: SubmitOptions, run_dir: Path, run_id: str, python: str, workdir: str) -> str:
    """The batch script (pure): ``#SBATCH`` lines, then ``ddlctl launch --slurm`` of this run."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={opts.job_name or 'ddlctl'}", f"#SBATCH --nodes={opts.nodes}",
             f"#SBATCH --output={run_dir}/slurm-%j.out", f"#SBATCH --chdir={workdir}"]
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.time_limit:
        lines.append(f"#SBATCH --time={opts.time_limit}")
    if opts.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={opts.gpus_per_node}")
    if opts.ntasks_per_node:
        lines.append(f"#SBATCH --ntasks-per-node={opts.ntasks_per_node}")
    if opts.requeue:  # (and the output of every attempt kept in one file)
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append", f"#SBATCH --signal=B:USR1@{opts.signal_before}"]
    lines += [f"#SBATCH {arg}" for arg in opts.sbatch_args]
    launch = [python, "-m", "ddlctl", "launch", "--slurm", "--runs-dir", str(run_dir.parent), "--run-id", run_id,
              *opts.launch_args]
    lines += ["# written by ddlctl submit: runs the job's tasks in srun steps of this allocation",
              "export PYTHONUNBUFFERED=1", f"export {envvars.SAFE_PATH}=1",
              *([f"export {envvars.SIGNAL_BEFORE}={opts.signal_before}", f"export {envvars.MAX_REQUEUES}="
                 f"{opts.max_requeues}"] if opts.requeue else []), f"exec {shlex.join(launch)}", ""]
    return "\n".join(lines)


def hide_env_values(launch_args: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``launch_args`` with every ``--env KEY=VALUE`` (``-e KEY=VALUE``, ``--env=KEY=VALUE``,
    ``-eKEY=VALUE``) turned into ``--env KEY``, and those values:
    the batch script holds names only; sbatch exports the values to the job from its environment
    (its default ``--export=ALL``), where ``launch --env KEY`` picks them up."""
    args: list[str] = []
    values: dict[str, str] = {}
    items = list(launch_args)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "--":
            args += items[i:]
            break
        if arg in ("--env", "-e") and i + 1 < len(items) and "=" in items[i + 1]:
            key, value = items[i + 1].split("=", 1)
            values[key] = value
            args += [arg, key]
            i += 2
            continue
        # the attached forms click takes too: --env=KEY=VALUE and -eKEY=VALUE (which once reached
        # the batch script's command line whole: in `ps` on the batch node, stored by Slurm)
        attached = arg[len("--env="):] if arg.startswith("--env=") else \
            arg[2:] if arg.startswith("-e") and not arg.startswith("--") else None
        if attached is not None and "=" in attached:
            key, value = attached.split("=", 1)
            values[key] = value
            args.append(f"--env={key}")
        else:
            args.append(arg)
        i += 1
    return tuple(args), values


def check_options(opts: SubmitOptions) -> None:
    """Refuse what sbatch would refuse later, with the option named."""
    if opts.time_limit and not _TIME.match(opts.time_limit):
        raise ConfigError(f"--time {opts.time_limit!r} is not a Slurm time",
                          "use minutes (30), MM:SS, HH:MM:SS, D-HH or D-HH:MM:SS")
    for option, value in (("--job-name", opts.job_name), ("--partition", opts.partition), ("--time", opts.time_limit),
                          *(("--sbatch-arg", a) for a in opts.sbatch_args), ("the working directory", os.getcwd())):
        if value and _CONTROL.search(str(value)):  # a newline would start a line of the script of its own
            raise ConfigError(f"{option} {str(value)!r} holds a control character (a newline, a tab...)",
                              "a #SBATCH line is one line: give the value without it")
    for arg in opts.sbatch_args:
        if not arg.startswith("-"):
            raise ConfigError(f"--sbatch-arg {arg!r} is not an sbatch option", "e.g. --sbatch-arg=--account=proj")
    if "--slurm" in opts.launch_args:
        raise ConfigError("submit runs 'ddlctl launch --slurm' itself: drop --slurm")
    for given in ("--runs-dir", "--run-id", "--hosts", "--template"):
        if given in opts.launch_args or any(a.startswith(given + "=") for a in opts.launch_args):
            raise ConfigError(f"{given} does not apply to submit" + (
                " (the cluster is the allocation)" if given in ("--hosts", "--template") else
                " here: give submit's own --runs-dir"))


def strategy_of(launch_args: Sequence[str]) -> str:
    """The strategy named in launch's arguments (for the run id), else mwms."""
    for i, arg in enumerate(launch_args):
        if arg == "--":
            break
        if arg in ("-s", "--strategy") and i + 1 < len(launch_args):
            return launch_args[i + 1]
        if arg.startswith("--strategy="):
            return arg.split("=", 1)[1]
    return "mwms"


def submit(opts: SubmitOptions, out: Console, err: Console, env: Mapping[str, str] | None = None) -> int:
    """Write the script, submit it, print the job id and the run directory; with ``follow``, stream
    the job's output until it ends and return the run's exit code."""
    env = dict(os.environ if env is None else env)
    check_options(opts)
    run_id = new_run_id(strategy_of(opts.launch_args))
    # (the runs folder checked as launch checks it: /tmp, writable by everyone, is refused)
    run_dir = make_dir(make_dir(Path(opts.runs_dir).expanduser().resolve(), "--runs-dir") / run_id, "--runs-dir")
    launch_args, values = hide_env_values(opts.launch_args)
    if values and any(a.startswith("--export") for a in opts.sbatch_args):
        raise ConfigError("--env KEY=VALUE needs sbatch to export ddlctl's environment to the job",
                          "drop --sbatch-arg=--export..., or export the variables yourself and give --env KEY")
    env.update(values)
    script = run_dir / "submit.sbatch"
    text = sbatch_script(dataclasses.replace(opts, launch_args=launch_args), run_dir, run_id, sys.executable,
                         os.getcwd())
    with os.fdopen(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)  # 0600: the command line is the user's business
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env,
                              timeout=60)
    except FileNotFoundError:
        raise LaunchError("sbatch is not on PATH", "run ddlctl submit where the Slurm client commands are") from None
    except subprocess.TimeoutExpired:
        raise LaunchError("sbatch did not answer within 60s (is slurmctld reachable?)") from None
    if done.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}",
                          f"the script is {script}")
    job_id = done.stdout.strip().split(";")[0]
    (run_dir / "submit.json").write_text(json.dumps({"job_id": job_id, "script": str(script),
                                                      "submitted": time.time()}) + "\n")
    err.print(f"submitted Slurm job {job_id}; run directory {run_dir}", highlight=False)
    out.print(job_id, highlight=False)
    if not opts.follow:
        err.print(f"output: {run_dir}/slurm-{job_id}.out · stop it: ddlctl stop {run_dir}", highlight=False)
        return 0
    return follow(job_id, run_dir, err, env, opts.poll_s)


def exit_code_of(run_dir: Path, state: str, slurm_exit: str) -> int:
    """The run's exit code: ddlctl's own (``outcome.json``), else what Slurm says of the job."""
    try:
        return int(json.loads((run_dir / OUTCOME_FILE).read_text())["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    code, _, signal = slurm_exit.partition(":")
    if code.isdigit() and int(code):
        return int(code)
    if signal.isdigit() and int(signal):
        return 128 + int(signal)
    return 0 if state == "COMPLETED" else 1


def follow(job_id: str, run_dir: Path, err: Console, env: Mapping[str, str], poll_s: float = 1.0,
           write: Callable[[bytes], None] | None = None, confirm: Callable[[str], bool] | None = None) -> int:
    """Stream ``slurm-<job>.out`` while the job lives; Ctrl-C asks whether to cancel it."""
    write = write or (lambda data: (sys.stdout.buffer.write(data), sys.stdout.buffer.flush()))
    # every Ctrl-C is a question here (not "the second one leaves at once" as elsewhere in ddlctl)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    output = run_dir / f"slurm-{job_id}.out"
    offset, said, state, reason, slurm_exit = 0, "", "PENDING", "", ""
    cancelled = False

    def drain() -> None:
        nonlocal offset
        try:
            with output.open("rb") as handle:
                handle.seek(offset)
                while data := handle.read(1 << 20):  # (in pieces: a job that printed a lot is not held whole)
                    offset += len(data)
                    write(data)
        except FileNotFoundError:
            return

    while True:
        try:
            state, reason, found_exit = job_state(job_id, env)
            slurm_exit = found_exit or slurm_exit
            if state in ("PENDING", "CONFIGURING") and f"{state} {reason}" != said:
                said = f"{state} {reason}"
                err.print(f"ddlctl: job {job_id} {state.lower()} ({reason})", highlight=False)
            drain()
            if state in FINAL_STATES or state == "GONE":
                break
            time.sleep(poll_s)
        except KeyboardInterrupt:
            if cancelled:
                continue
            ask = confirm or _ask
            if ask(f"cancel Slurm job {job_id}?"):
                subprocess.run(["scancel", job_id], env=dict(env), capture_output=True, timeout=30)
                cancelled = True
                err.print(f"ddlctl: cancelling job {job_id}; waiting for it to end", highlight=False)
            else:
                err.print(f"ddlctl: job {job_id} keeps running; follow its output in {output}; "
                          f"stop it with: ddlctl stop {run_dir}", highlight=False)
                return 130
    time.sleep(min(poll_s, 0.5))
    drain()  # what the job wrote last
    code = exit_code_of(run_dir, state, slurm_exit)
    if state not in ("COMPLETED", "GONE") or code:
        err.print(f"ddlctl: Slurm job {job_id} ended {state} (exit code {code}); output in {output}", highlight=False)
    return code


def _ask(question: str) -> bool:
    """Ask on the terminal (no terminal: no)."""
    if not sys.stdin.isatty():
        return False
    try:
        return input(f"\n{question} [y/N] ").strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        return False
