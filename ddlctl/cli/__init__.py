"""The ``ddlctl`` command line. It only parses options and calls the modules that do the work:
one module here per subcommand, registered on one Typer app in the order ``--help`` lists them."""

from __future__ import annotations

import importlib
import os
import signal
import sys

from ddlctl.cli.common import _ARGV, app
from ddlctl.console import closed_stdout as stdoutgone

__all__ = ["app", "main", "run_app"]

for _command in ("launch", "compare", "partition", "report", "check", "stop", "submit"):  # --help lists them so
    importlib.import_module(f"ddlctl.cli.{_command}")


def run_app(args: list[str] | None = None) -> int:
    """Run the command line; returns the exit code. A usage error (an unknown option, a value that
    is not one of the choices) reads like every other ddlctl error: ``error: ...`` and a hint."""
    try:  # Typer >= 0.2x carries its own copy of Click
        from typer._click import exceptions as click  # type: ignore[import-not-found]
    except ImportError:
        from click import exceptions as click

    _ARGV[:] = list(args) if args is not None else []
    try:
        code = app(args, standalone_mode=False)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain "ddlctl": the help, as Click shows it
            print(exc.format_message(), file=sys.stderr)
            return 2
        command = exc.ctx.command_path if exc.ctx is not None else "ddlctl"
        message = exc.format_message().replace("Value error, ", "")
        print(f"error: {message}\n  hint: '{command} --help' lists the options and the values they take",
              file=sys.stderr)
        return 2
    except getattr(click, "Abort", ()):  # older Click turns Ctrl-C into Abort (Typer's own copy has none)
        raise KeyboardInterrupt from None
    except click.ClickException as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    return code if isinstance(code, int) else 0


def main() -> None:
    """Console-script entry point. A bug in ddlctl is one message (and a file with the traceback),
    never a traceback on the user's terminal."""
    def interrupted(_signum: int, _frame: object) -> None:
        if interrupts:  # a second Ctrl-C while the first is being handled: leave at once
            os._exit(130)
        interrupts.append(True)
        raise KeyboardInterrupt

    interrupts: list[bool] = []
    os.umask(0o077)  # private by default: run folders, logs, plans, checkpoints are the user's alone
    signal.signal(signal.SIGINT, interrupted)  # the supervisor has its own while tasks run
    code = 1
    try:
        code = run_app()
        sys.stdout.flush()  # (what a pipe holds: its reader may be gone, see ddlctl.console.closed_stdout)
    except BrokenPipeError:  # stdout's reader went away: the command's own code stands (1 if it had none)
        stdoutgone.mark_closed()
    except KeyboardInterrupt:  # Ctrl-C outside the supervisor (e.g. while planning)
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001
        import tempfile
        import traceback

        with tempfile.NamedTemporaryFile("w", prefix="ddlctl-crash-", suffix=".txt", delete=False) as handle:
            traceback.print_exc(file=handle)
        print(f"error: internal error in ddlctl: {type(exc).__name__}: {exc}\n"
              f"  hint: this is a bug in ddlctl; the full traceback is in {handle.name}", file=sys.stderr)
        sys.exit(1)
    finally:
        note = stdoutgone.closing_note()
        if note:
            print(note, file=sys.stderr)
        # Leaving with an exit code: a Ctrl-C now (while the interpreter shuts down and Python
        # puts the default handler back) must not turn it into "killed by SIGINT".
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)

