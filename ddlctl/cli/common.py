"""What every ``ddlctl`` subcommand shares: the Typer app, option types and choices, the consoles,
and turning a command's result (or a UserError) into an exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ddlctl import __version__
from ddlctl.console import closed_stdout as stdoutgone
from ddlctl.console.safe import SafeConsole
from ddlctl.contract.errors import UserError
from ddlctl.contract.rundir import PLAN_FILE
from ddlctl.contract.strategies import STRATEGIES
from ddlctl.planning.request import BALANCE, WORKER_PER
from ddlctl.transport.options import SshOptions
from ddlctl.workloads import EXECUTIONS, WORKLOADS


def _plain_arguments() -> None:
    """Arguments read as the README writes them: ``RUN_DIR``, ``[-- COMMAND...]``. Typer (0.2x)
    shows every argument with a type (``run_dir <str>``) and a required one in braces in the usage
    line, whatever its metavar; with a metavar, show just the metavar."""
    from typer.core import TyperArgument

    display = getattr(TyperArgument, "display_type_rich", None)
    usage = getattr(TyperArgument, "_usage_display_name", None)
    if display is not None:  # (older Typer shows arguments plainly already)
        TyperArgument.display_type_rich = lambda self, ctx: None if self.metavar else display(self, ctx)
    if usage is not None:
        TyperArgument._usage_display_name = lambda self: self.metavar if self.metavar else usage(self)


_plain_arguments()

app = typer.Typer(
    name="ddlctl",
    help="Launch and profile TensorFlow distributed training on one or many machines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[user@]host [slots=N]" must stay as written
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A str Enum of ``values``: ``--help`` lists them and Click refuses anything else."""
    return Enum(name, {v.replace("-", "_"): v for v in values}, type=str)  # type: ignore[return-value]


Strategy = _choices("Strategy", STRATEGIES)
Workload = _choices("Workload", WORKLOADS)
Execution = _choices("Execution", EXECUTIONS)
RestartOn = _choices("RestartOn", ("fault", "any"))
WorkerPer = _choices("WorkerPer", WORKER_PER)
Balance = _choices("Balance", BALANCE)
DEFAULT_RESTART_ON = RestartOn("fault")
DEFAULT_WORKLOAD = Workload("cnn")


def _value(choice: Enum | None) -> str | None:
    return None if choice is None else str(choice.value)


SshKeyOption = Annotated[str | None, typer.Option(
    "--ssh-key", metavar="FILE",
    help="Private key file for SSH hosts (default: ~/.ssh/config, ssh-agent, ~/.ssh/id_*).",
    show_default=False)]
SshUserOption = Annotated[str | None, typer.Option(
    "--ssh-user", metavar="NAME", help="Login name for SSH hosts without user@ (default: ~/.ssh/config, else yours).",
    show_default=False)]
ConnectTimeoutOption = Annotated[float, typer.Option(
    "--connect-timeout", metavar="SECONDS", min=0.1, help="Seconds to wait for each SSH connection.")]
#: ``--python`` of the commands that take ``--slurm`` (launch, profile, check, compare)
SlurmPythonOption = Annotated[str | None, typer.Option(
    "--python", metavar="PATH", help="--slurm: the Python the nodes run tasks with. Default: the one running "
                                     "ddlctl (same path on every node).", show_default=False)]
AcceptNewOption = Annotated[bool, typer.Option(
    "--accept-new-host-keys", help="Accept and record unknown SSH host keys in ~/.ssh/known_hosts "
                                   "(a changed key is always refused).")]

STRATEGY_HELP = ("ps (chief + workers + parameter servers), mwms (multi-worker mirrored), model (model "
                 "parallelism: a stage task per device, your program as the chief), or a single-host strategy: "
                 "mirrored, central_storage, one_device. Default: the template's, else mwms.")
#: Where launch, profile, compare and submit put run directories unless --runs-dir says otherwise.
DEFAULT_RUNS_DIR = "runs"
RUNS_DIR_HELP = "Folder that receives run directories (<folder>/<run-id>/)."
JSON_HELP = "Machine-readable output: JSON on stdout, and nothing else there."
EXECUTION_HELP = ("Built-in workload's execution: pipelined (tf.data parallel map + prefetch: input overlaps "
                  "compute), linear (the same input without overlap: the research's baseline) or python-feed "
                  "(batches built in Python sample by sample, one step per call).")
WORKLOAD_HELP = ("Built-in workload to run when no command is given: cnn (a small CNN, augmented images), mlp (a "
                 "wide MLP: many parameters, communication-heavy), deep (a deep MLP, for --strategy model) or heavy "
                 "(cnn's model, input-bound: each image decoded from a JPEG first; for --data-workers).")
RunsDirOption = Annotated[str, typer.Option("--runs-dir", metavar="DIR", help=RUNS_DIR_HELP)]


def _version(value: bool) -> None:
    if value:
        print(f"ddlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Launch and profile TensorFlow distributed training on one or many machines."""




def ssh_options(ssh_key: str | None, ssh_user: str | None, connect_timeout: float,
                accept_new_host_keys: bool = False) -> SshOptions:
    """The SshOptions the SSH flags describe (shared by every command that reaches hosts)."""
    return SshOptions(key_file=ssh_key, user=ssh_user, connect_timeout_s=connect_timeout,
                      accept_new_host_keys=accept_new_host_keys)


def run_dir_arg(value: str, runs_dir: str = DEFAULT_RUNS_DIR) -> str:
    """A RUN_DIR argument: a run directory, or a run id alone (as the report's first line gives it)
    naming one in ``runs_dir``, launch's default ``--runs-dir``."""
    if (Path(value) / PLAN_FILE).is_file() or "/" in value:
        return value
    named = Path(runs_dir) / value
    return str(named) if (named / PLAN_FILE).is_file() else value



class _PeopleConsole(SafeConsole):
    """A stdout console that outlives its reader (:mod:`ddlctl.console.closed_stdout`): rich's own answer to a
    closed pipe is to exit at once."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdoutgone.mark_closed()


def people_console() -> Console:
    """Console for people on stdout: wide when piped (tables are not cut to 80 columns); what it
    cannot show once its reader is gone (``| head``) is dropped, not fatal."""
    return _PeopleConsole(soft_wrap=True, width=None if sys.stdout.isatty() else 160, markup=False)


def error_console() -> Console:
    """Console for messages on stderr. Markup is off on every console: host names, paths, options
    and task output are the user's strings (a ``[/b]`` in a hosts file is text, not markup)."""
    return SafeConsole(stderr=True, soft_wrap=True, markup=False)


def _exit_with(run: Callable[[], int]) -> None:
    """Run a command body: its return value is the exit code; a UserError becomes a clear message."""
    try:
        code = run()
    except UserError as exc:
        _fail(exc)
    raise typer.Exit(code)


def _fail(exc: UserError) -> None:
    err = SafeConsole(stderr=True, highlight=False, markup=False)
    err.print(Text.assemble(("error:", "bold red"), " ", exc.message), soft_wrap=True)
    if exc.hint:
        err.print(f"  hint: {exc.hint}", soft_wrap=True)
    raise typer.Exit(exc.exit_code)



_ARGV: list[str] = []  # the arguments run_app was given (submit needs to see where '--' was)

