"""``ddlctl check``."""

from __future__ import annotations

from typing import Annotated

import typer

from ddlctl.cli.common import (
    JSON_HELP,
    AcceptNewOption,
    ConnectTimeoutOption,
    SlurmPythonOption,
    SshKeyOption,
    SshUserOption,
    UserError,
    _exit_with,
    _fail,
    app,
    people_console,
    ssh_options,
)


@app.command()
def check(
    hosts: Annotated[str | None, typer.Option("--hosts", metavar="FILE", help="Hosts file to check.",
                                              show_default=False)] = None,
    template: Annotated[str | None, typer.Option("--template", metavar="FILE", help="YAML cluster template to check.",
                                                 show_default=False)] = None,
    ssh_key: SshKeyOption = None,
    ssh_user: SshUserOption = None,
    connect_timeout: ConnectTimeoutOption = 10.0,
    accept_new_host_keys: AcceptNewOption = False,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP + " Here: the host reports (with --bench: "
                                                                      "the cluster profile).")] = False,
    bench: Annotated[bool, typer.Option(
        "--bench", help="Measure instead: each device's matmul throughput, the controller-to-host link and every "
                        "host-to-host link.")] = False,
    bench_seconds: Annotated[float, typer.Option(
        "--bench-seconds", metavar="SECONDS", min=0.1, help="--bench: timing per device.")] = 1.0,
    save: Annotated[str | None, typer.Option(
        "--save", metavar="FILE", help="--bench: write the cluster profile (JSON) here, for 'ddlctl launch "
                                       "--balance speed --speeds FILE'.", show_default=False)] = None,
    slurm: Annotated[bool, typer.Option(
        "--slurm", help="Check every node of the Slurm allocation ddlctl runs in (salloc, sbatch), each in a "
                        "job step through srun.")] = False,
    python: SlurmPythonOption = None,
) -> None:
    """Pre-flight every host in parallel, or measure it (--bench).

    Per host: reachable (or why not), Python, ddlctl, TensorFlow, tf-keras, GPUs (NVML) and free
    ports; a warning when other users are logged in there (a run's TensorFlow servers accept any
    connection). Exits 1 when any host is unusable."""
    from ddlctl.commands.check import check as run_check

    if save and not bench:
        _fail(UserError("--save applies with --bench", "add --bench"))
    _exit_with(lambda: run_check(hosts, template, ssh_options(ssh_key, ssh_user, connect_timeout,
                                                              accept_new_host_keys), json_out, people_console(),
                                 bench=bench, bench_seconds=bench_seconds, save=save, slurm=slurm,
                                 python=python))

