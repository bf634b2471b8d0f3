"""``ddlctl compare``."""

from __future__ import annotations

from typing import Annotated

import typer

from ddlctl.cli.common import (
    DEFAULT_RUNS_DIR,
    DEFAULT_WORKLOAD,
    EXECUTIONS,
    JSON_HELP,
    STRATEGIES,
    AcceptNewOption,
    ConnectTimeoutOption,
    RunsDirOption,
    SlurmPythonOption,
    SshKeyOption,
    SshUserOption,
    Workload,
    _exit_with,
    _value,
    app,
    error_console,
    people_console,
    ssh_options,
)


@app.command()
def compare(
    strategies: Annotated[str, typer.Option(
        "--strategies", metavar="S1,S2,...", help="Strategies to run, comma-separated: " + ",".join(STRATEGIES) + ".")
    ] = "one_device,mirrored,central_storage,mwms,ps",
    hosts: Annotated[str | None, typer.Option("--hosts", metavar="FILE", help="Hosts file (default: this machine).",
                                              show_default=False)] = None,
    template: Annotated[str | None, typer.Option("--template", metavar="FILE", help="YAML cluster template.",
                                                 show_default=False)] = None,
    workload: Annotated[Workload, typer.Option(  # type: ignore[valid-type]
        "--workload", help="Built-in workload of every run: cnn (small CNN), mlp (wide, communication-heavy), deep "
                           "(for the model strategy) or heavy (cnn, input-bound: JPEG-decoded images).")
    ] = DEFAULT_WORKLOAD,
    steps: Annotated[int, typer.Option("--steps", metavar="N", min=1, help="Training steps of every run.")] = 200,
    batch_size: Annotated[int, typer.Option("--batch-size", metavar="N", min=1,
                                            help="Global batch per step.")] = 64,
    workers: Annotated[int | None, typer.Option(
        "--workers", "-w", metavar="N", min=1, help="Workers for ps and mwms (default: 2 on this machine, else the "
                                                    "placement defaults).", show_default=False)] = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", metavar="N", min=1,
        help="Runs per strategy and mode, interleaved: medians, spreads, and whether each speed-up is inside the noise "
             "(docs/cli.md).")] = 1,
    execution: Annotated[str, typer.Option(
        "--execution", metavar="MODE[,MODE...]",
        help="Execution modes of the built-in workload to run, comma-separated, or all: " + ", ".join(EXECUTIONS)
             + ". With several, a row each and, per strategy, how much faster pipelined is than each other "
               "mode.")] = "pipelined",
    input_: Annotated[str, typer.Option(
        "--input", metavar="INPUT[,INPUT...]",
        help="Where the built-in workload's batches are made, comma-separated: local (each trainer's own tf.data "
             "pipeline) and service (the tf.data service ddlctl starts for the run: --data-workers). With both, a "
             "row each and, per strategy, the service's throughput over local input's and each one's wait for "
             "input.")] = "local",
    data_workers: Annotated[int, typer.Option(
        "--data-workers", metavar="N", min=1,
        help="Data workers of the runs with --input service (on hosts with roles=data, else on the hosts without "
             "roles=: this machine).")] = 1,
    plot_file: Annotated[str | None, typer.Option("--plot", metavar="FILE", help="Also draw the throughput chart "
                                                  "into this PNG (needs ddlctl[plot]).", show_default=False)] = None,
    runs_dir: RunsDirOption = DEFAULT_RUNS_DIR,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP + " Here: compare.json.")] = False,
    startup_timeout: Annotated[float, typer.Option("--startup-timeout", metavar="SECONDS", min=0,
                                                   help="Per run, as for launch.")] = 180.0,
    ssh_key: SshKeyOption = None,
    ssh_user: SshUserOption = None,
    connect_timeout: ConnectTimeoutOption = 10.0,
    accept_new_host_keys: AcceptNewOption = False,
    slurm: Annotated[bool, typer.Option(
        "--slurm", help="Every run inside the Slurm allocation ddlctl runs in, as 'launch --slurm'.")] = False,
    python: SlurmPythonOption = None,
) -> None:
    """Run the same workload under several strategies and compare them side by side.

    Same seed, same machines; one table: throughput (median of repeats, with spread), step time
    p50/p95, speedup over one_device, scaling efficiency, GPU utilisation, the share of a step spent
    on input, final loss and accuracy; plus a bar chart, and for each run whether input or compute
    bound it (with linear runs: the most overlap can gain). A strategy that fails gets a row that
    says why. Saves compare.json into <runs-dir>/compare-<stamp>/.

    Example: ddlctl compare --strategies one_device,mwms,ps --execution pipelined,linear --steps 300;
    ddlctl compare --strategies mwms --workload heavy --input local,service
    """
    from ddlctl.commands.compare import CompareOptions, parse_executions, parse_inputs, parse_strategies
    from ddlctl.commands.compare import compare as run_compare
    from ddlctl.commands.config import ClusterSource, LaunchConfig, OutputOptions, RequestOptions, WorkloadOptions
    from ddlctl.supervise.job import SupervisorOptions

    def run() -> int:
        modes = parse_executions(execution)
        opts = CompareOptions(
            strategies=parse_strategies(strategies), executions=modes, inputs=parse_inputs(input_),
            data_workers=data_workers, repeats=repeats, plot=plot_file,
            json_out=json_out,
            launch=LaunchConfig(
                cluster=ClusterSource(hosts=hosts, template=template, slurm=slurm, python=python),
                request=RequestOptions(workers=workers),
                workload=WorkloadOptions(workload=_value(workload), steps=steps, batch_size=batch_size),
                supervision=SupervisorOptions(startup_timeout_s=startup_timeout),
                output=OutputOptions(run_dir=runs_dir),
                ssh=ssh_options(ssh_key, ssh_user, connect_timeout, accept_new_host_keys)))
        return run_compare(opts, people_console(), error_console())

    _exit_with(run)

