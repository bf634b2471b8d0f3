"""``ddlctl submit``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ddlctl.cli.common import (
    _ARGV,
    DEFAULT_RUNS_DIR,
    RunsDirOption,
    UserError,
    _exit_with,
    _fail,
    app,
    error_console,
    people_console,
)

SUBMIT_HELP = """Submit a batch job that runs 'ddlctl launch --slurm' on a new allocation.

Writes the sbatch script into a new run directory, submits it and prints the job id (stdout) and
the run directory. Every option submit does not know goes to 'ddlctl launch' inside the job, as
does '-- COMMAND'. With --follow: streams the job's output until it ends (polling 'scontrol show
job') and exits with the run's exit code; Ctrl-C asks whether to cancel the job. 'ddlctl stop
RUN_DIR' cancels it.

\b
Examples:
  ddlctl submit --nodes 3 --time 30 -s ps --steps 500 --follow
  ddlctl submit --nodes 2 --gpus-per-node 4 -p gpu -s mwms -- python train.py --epochs 3
"""


@app.command(help=SUBMIT_HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option("--nodes", "-N", metavar="N", min=1, help="Nodes to allocate.")] = 1,
    partition: Annotated[str | None, typer.Option("--partition", "-p", metavar="NAME", help="Slurm partition "
                                                  "(default: the cluster's default).", show_default=False)] = None,
    time_limit: Annotated[str | None, typer.Option("--time", "-t", metavar="TIME", help="Time limit (minutes, "
                                                   "HH:MM:SS or D-HH:MM:SS).", show_default=False)] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", metavar="G", min=0, help="GPUs per node.",
                                                      show_default=False)] = None,
    ntasks_per_node: Annotated[int | None, typer.Option(
        "--ntasks-per-node", metavar="K", min=1, help="Tasks per node: the worker slots of each node.",
        show_default=False)] = None,
    job_name: Annotated[str | None, typer.Option("--job-name", "-J", metavar="NAME", help="Job name (default: "
                                                 "ddlctl).", show_default=False)] = None,
    sbatch_arg: Annotated[list[str] | None, typer.Option(
        "--sbatch-arg", metavar="OPTION", help="Any other sbatch option, e.g. --sbatch-arg=--account=proj; "
                                               "repeatable.", show_default=False)] = None,
    runs_dir: RunsDirOption = DEFAULT_RUNS_DIR,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the job's output until it ends; exit with "
                                                                "the run's exit code.")] = False,
    requeue: Annotated[bool, typer.Option(
        "--requeue", help="The job may be requeued (a preemption, scontrol requeue): each new attempt goes on in the "
                          "same run folder, the last attempt's records moved to attempts/<n>/, its tasks resuming "
                          "from their newest checkpoint; the job's output of every attempt in one file. And "
                          "at the time limit (Slurm's SIGUSR1 --signal-before seconds ahead) every task checkpoints "
                          "and stops and ddlctl requeues the job, --max-requeues times.")] = False,
    signal_before: Annotated[int, typer.Option(
        "--signal-before", metavar="SECONDS", min=30, max=65535,
        help="With --requeue: how long before the time limit Slurm tells ddlctl (#SBATCH --signal=B:USR1@S); the "
             "tasks get that much less 30 s to checkpoint after their SIGTERM.")] = 120,
    max_requeues: Annotated[int, typer.Option(
        "--max-requeues", metavar="N", min=0,
        help="With --requeue: how many times ddlctl requeues the job at its time limit; then the run ends there, "
             "its newest checkpoint kept (preemptions, which Slurm requeues itself, are not counted).")] = 3,
) -> None:
    from ddlctl.commands.submit import SubmitOptions
    from ddlctl.commands.submit import submit as run_submit

    args = _with_separator(list(ctx.args), _ARGV or sys.argv[1:])
    _check_launch_args(args)
    opts = SubmitOptions(nodes=nodes, partition=partition, time_limit=time_limit, gpus_per_node=gpus_per_node,
                         ntasks_per_node=ntasks_per_node, job_name=job_name, sbatch_args=tuple(sbatch_arg or ()),
                         runs_dir=runs_dir, follow=follow, launch_args=tuple(args), requeue=requeue,
                         signal_before=signal_before, max_requeues=max_requeues)
    _exit_with(lambda: run_submit(opts, people_console(), error_console()))


def _with_separator(args: list[str], raw: list[str]) -> list[str]:
    """Click drops the ``--`` before a command: put it back where the raw arguments had it."""
    if "--" not in raw:
        return args
    command = raw[raw.index("--") + 1:]
    if command and args[len(args) - len(command):] == command:
        return [*args[:len(args) - len(command)], "--", *command]
    return args


def _check_launch_args(args: list[str]) -> None:
    """Refuse, before anything is submitted, arguments that 'ddlctl launch' would refuse."""
    try:  # Typer >= 0.2x carries its own copy of Click
        from typer._click import exceptions as click  # type: ignore[import-not-found]
    except ImportError:
        from click import exceptions as click

    command = typer.main.get_command(app)
    launch_command = command.commands["launch"]  # type: ignore[attr-defined]
    try:
        launch_command.make_context("ddlctl submit", ["--slurm", *args])
    except typer.Exit:
        pass
    except click.ClickException as exc:
        _fail(UserError(f"for 'ddlctl launch' in the job: {exc.format_message()}",
                        "ddlctl launch --help lists what the job's launch accepts"))

