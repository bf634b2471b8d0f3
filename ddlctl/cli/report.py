"""``ddlctl report``."""

from __future__ import annotations

from typing import Annotated

import typer

from ddlctl.cli.common import (
    JSON_HELP,
    _exit_with,
    app,
    people_console,
    run_dir_arg,
)


@app.command()
def report(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory (runs/<run-id>), possibly "
                                                                   "copied from elsewhere, or a run id in ./runs.")],
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP + " Here: summary.json.")] = False,
    csv_dir: Annotated[str | None, typer.Option("--csv", metavar="DIR",
                                                help="Also write tasks.csv, hosts.csv, gpus.csv here.",
                                                show_default=False)] = None,
    trace: Annotated[str | None, typer.Option("--trace", metavar="FILE",
                                              help="Also write a Chrome/Perfetto trace to this file.",
                                              show_default=False)] = None,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", metavar="N", min=0,
                                              help="Steps of each task left out of the statistics.")] = 5,
) -> None:
    """Render the full report of a run from its run directory alone.

    A copied run directory gives the same report. --json prints summary.json, --csv writes
    tasks/hosts/gpus tables, --trace a Chrome/Perfetto trace."""
    from ddlctl.commands.report import report as run_report

    _exit_with(lambda: run_report(run_dir_arg(run_dir), json_out, csv_dir, trace, warmup_steps, people_console()))

