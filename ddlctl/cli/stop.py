"""``ddlctl stop``."""

from __future__ import annotations

from typing import Annotated

import typer

from ddlctl.cli.common import (
    ConnectTimeoutOption,
    SshKeyOption,
    SshUserOption,
    _exit_with,
    app,
    people_console,
    run_dir_arg,
    ssh_options,
)


@app.command()
def stop(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR",
                                           help="The run directory (runs/<run-id>) whose processes to kill, or its "
                                                "run id alone (in ./runs).")],
    ssh_key: SshKeyOption = None,
    ssh_user: SshUserOption = None,
    connect_timeout: ConnectTimeoutOption = 10.0,
) -> None:
    """Kill whatever of a run is still alive, on every host of its plan.

    For example after the controller was killed. Processes are found by the run id in their
    environment, never by name. A Slurm run: the job ddlctl submit created, or the run's job steps
    inside your allocation, are cancelled with scancel. The hosts (and each one's python=) come from
    the run's plan.json, which must be yours and writable by nobody else (exit 2 otherwise)."""
    from ddlctl.commands.stop import stop as run_stop
    options = ssh_options(ssh_key, ssh_user, connect_timeout)
    _exit_with(lambda: run_stop(run_dir_arg(run_dir), options, people_console()))

