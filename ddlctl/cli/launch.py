"""``ddlctl launch`` and ``ddlctl profile`` (the same options)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ddlctl.cli.common import (
    _ARGV,
    DEFAULT_RESTART_ON,
    DEFAULT_RUNS_DIR,
    EXECUTION_HELP,
    JSON_HELP,
    STRATEGY_HELP,
    WORKLOAD_HELP,
    AcceptNewOption,
    Balance,
    ConnectTimeoutOption,
    Execution,
    RestartOn,
    RunsDirOption,
    SlurmPythonOption,
    SshKeyOption,
    SshUserOption,
    Strategy,
    UserError,
    WorkerPer,
    Workload,
    _exit_with,
    _fail,
    _value,
    app,
    error_console,
    people_console,
    ssh_options,
)

PROFILE_HELP = """Run like launch, with a live view and the full report at the end.

Live view: per-task step rate, per-host GPU and CPU. Report: step-time percentiles, throughput,
stragglers, GPU utilisation / SM activity / memory / power, host CPU, diagnosis. Writes
summary.json and trace.json into the run directory.

\b
Examples:
  ddlctl profile --strategy mwms               # built-in workload on this machine
  ddlctl profile --hosts hosts.txt -s ps -- python train.py
"""



@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    ctx: typer.Context,
    command: Annotated[list[str] | None, typer.Argument(
        metavar="[-- COMMAND...]",
        help="The training program and its arguments, after '--'. Without it, ddlctl runs its "
             "built-in workload (a CNN on synthetic images).", show_default=False)] = None,
    hosts: Annotated[str | None, typer.Option(
        "--hosts", metavar="FILE", help="Hosts file: one '[user@]host [slots=N] [gpus=N] [port=P] [roles=..] "
                                        "[python=PATH] [workdir=PATH]' per line.", show_default=False)] = None,
    template: Annotated[str | None, typer.Option(
        "--template", metavar="FILE", help="YAML cluster template (see cluster_templates/); alternative to "
                                           "--hosts. With neither, the cluster is this machine.",
        show_default=False)] = None,
    strategy: Annotated[Strategy | None, typer.Option(  # type: ignore[valid-type]
        "--strategy", "-s", help=STRATEGY_HELP, show_default=False)] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", "-w", metavar="N", min=1, help="Worker tasks. Default: ps fills every slot, mwms one per host "
                                                    "(2 on this machine when no hosts are given).",
        show_default=False)] = None,
    ps: Annotated[int | None, typer.Option(
        "--ps", metavar="N", min=1, help="Parameter-server tasks (ps strategy only). Default: 1.",
        show_default=False)] = None,
    data_workers: Annotated[int | None, typer.Option(
        "--data-workers", metavar="N", help="Start the tf.data service: a dispatcher and N data workers (on the hosts "
        "with roles=data, else on this machine's), before the trainers; each trainer gets its address "
        "(DDLCTL_DATA_SERVICE) and ddlctl.data.distribute(dataset) reads through it (the built-in workload does). "
        "Default: one a roles=data host's slot, none without such hosts.", show_default=False)] = None,
    evaluator: Annotated[bool | None, typer.Option(
        "--evaluator/--no-evaluator", help="Add a side-car evaluator task (ps and mwms).",
        show_default=False)] = None,
    runs_dir: RunsDirOption = DEFAULT_RUNS_DIR,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="KEY=VALUE", help="Set KEY for every task; repeatable. A bare KEY passes on ddlctl's "
                                                 "own value (keeps secrets off command lines).",
        show_default=False)] = None,
    startup_timeout: Annotated[float, typer.Option(
        "--startup-timeout", metavar="SECONDS", min=0, help="Time for every task to listen on its port; a task still "
                                                            "preparing its data gets more, up to 30 min. 0: wait "
                                                            "forever.")] = 180.0,
    grace: Annotated[float, typer.Option(
        "--grace", metavar="SECONDS", min=0, help="Time between SIGTERM and SIGKILL when stopping tasks.")] = 5.0,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", metavar="N", min=0,
        help="Restarts allowed for the whole job (a task, its group or every task, as the strategy needs: "
             "docs/faults.md).")] = 0,
    restart_on: Annotated[RestartOn, typer.Option(  # type: ignore[valid-type]
        "--restart-on", help="fault: restart after a signal, exit 42/143, a hang or a lost host; any: also after an "
                             "exception or a non-zero exit.")
    ] = DEFAULT_RESTART_ON,
    hang_timeout: Annotated[float | None, typer.Option(
        "--hang-timeout", metavar="SECONDS", min=0,
        help="Time a task may make no progress before it counts as hung. Default: max(10 x its p99 step interval, 60 "
             "s). 0: off.")] = None,
    host_timeout: Annotated[float, typer.Option(
        "--host-timeout", metavar="SECONDS", min=0, help="Time to keep reconnecting to a host whose SSH "
                                                         "connection dropped before the job fails naming it.")] = 60.0,
    min_workers: Annotated[int | None, typer.Option(
        "--min-workers", metavar="N", min=1,
        help="mwms, ps: go on with the workers that remain while at least N do when a host is lost for good. Default: "
             "off.",
        show_default=False)] = None,
    rejoin_after: Annotated[float, typer.Option(
        "--rejoin-after", metavar="SECONDS", min=0,
        help="--min-workers: a host that answers again and stays up this long is taken back at the next "
             "checkpoint.")] = 10.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan (tasks, hosts, ports, TF_CONFIG, commands); start "
                          "nothing.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help=JSON_HELP + " With --dry-run: the plan; otherwise summary.json at the end (task "
                                   "output and the report go to stderr).")] = False,
    legacy_keras: Annotated[bool, typer.Option(
        "--legacy-keras/--no-legacy-keras",
        help="For a command under ps/mwms, set TF_USE_LEGACY_KERAS=1 so model.fit uses tf-keras (Keras 3's fails "
             "there).")] = True,
    telemetry: Annotated[bool, typer.Option(
        "--telemetry/--no-telemetry", help="Run a telemetry agent per host (GPU via NVML, CPU, memory, network, "
                                           "per-task CPU/RSS) into <run>/telemetry/.")] = True,
    sample_interval: Annotated[float, typer.Option(
        "--sample-interval", metavar="SECONDS", min=0.05, help="Time between telemetry samples.")] = 1.0,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Show every line tasks print (by default a line several tasks print is shown once). "
                                "output.log keeps every line.")] = False,
    metrics_port: Annotated[str | None, typer.Option(
        "--metrics-port", metavar="[HOST:]PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics while the job runs; HOST defaults to "
             "127.0.0.1.", show_default=False)] = None,
    task_colors: Annotated[bool, typer.Option(
        "--task-colors", help="Let the colour sequences tasks print reach the console; other control characters are "
                              "always shown as text.")] = False,
    auto_steps: Annotated[bool, typer.Option(
        "--auto-steps/--no-auto-steps", help="Record step timings of Keras model.fit in your program without "
                                             "code changes (a callback ddlctl adds to every fit call).")] = True,
    prefork: Annotated[bool, typer.Option(
        "--prefork/--no-prefork", help="Fork each host's TensorFlow tasks from one process that imported TensorFlow "
                                       "once: starts and restarts sooner.")] = True,
    ssh_key: SshKeyOption = None,
    ssh_user: SshUserOption = None,
    connect_timeout: ConnectTimeoutOption = 10.0,
    accept_new_host_keys: AcceptNewOption = False,
    workload: Annotated[Workload | None, typer.Option(  # type: ignore[valid-type]
        "--workload", help=WORKLOAD_HELP + " Default: cnn.", show_default=False)] = None,
    steps: Annotated[int | None, typer.Option(
        "--steps", metavar="N", min=1, help="Built-in workload: training steps (default 200).",
        show_default=False)] = None,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", metavar="N", min=1, help="Built-in workload: global batch per step (default 64).",
        show_default=False)] = None,
    execution: Annotated[Execution | None, typer.Option(  # type: ignore[valid-type]
        "--execution", help=EXECUTION_HELP + " Default: pipelined.", show_default=False)] = None,
    worker_per: Annotated[WorkerPer | None, typer.Option(  # type: ignore[valid-type]
        "--worker-per", help="gpu: one worker per GPU; host: workers per host as --workers/slots= say; auto: gpu where "
                             "mwms needs it, else host.", show_default=False)
    ] = None,
    balance: Annotated[Balance | None, typer.Option(  # type: ignore[valid-type]
        "--balance", help="mwms: speed gives each worker a share of the batch proportional to its speed "
                          "(docs/heterogeneous.md). Default: off.",
        show_default=False)] = None,
    speeds: Annotated[str | None, typer.Option(
        "--speeds", metavar="FILE", help="--balance speed: per-host speeds from a profile saved by 'ddlctl check "
                                         "--bench --save FILE' instead of measuring them at the start.",
        show_default=False)] = None,
    bench: Annotated[bool, typer.Option(
        "--bench", help="Measure every host that runs tasks first (as 'check --bench'), for --balance speed and "
                        "--strategy model.")] = False,
    partition: Annotated[str | None, typer.Option(
        "--partition", metavar="FILE", help="--strategy model: the plan saved by 'ddlctl partition --save' (layers "
                                            "per stage task). Without it the chief plans with the greedy algorithm.",
        show_default=False)] = None,
    slurm: Annotated[bool, typer.Option(
        "--slurm", help="Run inside a Slurm allocation (salloc, sbatch): the job's nodes are the cluster, tasks start "
                        "in srun steps.")] = False,
    python: SlurmPythonOption = None,
    private_network: Annotated[bool, typer.Option(
        "--private-network", help="Run a job of this machine in a network namespace of its own, out of other users' "
                                  "reach (Linux).")] = False,
    tensorboard: Annotated[bool, typer.Option(
        "--tensorboard", help="At the end, write the run's scalars (each task's step time and samples/s, loss and "
                              "accuracy; each host's CPU and GPU use) as TensorBoard event files in "
                              "runs/<id>/profile.")] = False,
    trace: Annotated[str | None, typer.Option(
        "--trace", metavar="A-B|auto|off", help="A-B: capture TensorFlow's profiler in every training task over its "
        "steps A to B (e.g. 100-110, each task by its own step count); auto (profile's default): capture a task and a "
        "typical peer for 10 steps when its steps stand out while the job runs (a straggler, steps slower than early "
        "in the run; at most once every 10 minutes); off: never. runs/<id>/profile opens in XProf or TensorBoard, "
        "and the report splits the captured steps by what they did.", show_default=False)] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", metavar="NAME", help="Name of the run directory under --runs-dir (default: time, strategy "
                                         "and a random suffix).", show_default=False)] = None,
    resume: Annotated[Path | None, typer.Option(
        "--resume", metavar="RUN_DIR", help="Continue a run that ended before its training did (Ctrl-C, a host "
        "gone, a fault past --max-restarts): in its folder, as its next attempt, with the options and command it "
        "was launched with (give no others; an --env KEY=VALUE it had takes KEY's value from ddlctl's "
        "environment again); its tasks resume from their newest checkpoint and the report covers every attempt.",
        show_default=False)] = None,
    resumed: Annotated[bool, typer.Option("--resumed", hidden=True)] = False,
) -> None:
    """Start a TensorFlow cluster, supervise every task, and print a summary.

    \b
    Examples:
      ddlctl launch --strategy ps                  # built-in workload on this machine
      ddlctl launch --hosts hosts.txt -s mwms -- python train.py --epochs 3
      ddlctl launch --template cluster_templates/localhost-ps.yaml --dry-run
    """
    from ddlctl.commands.config import ClusterSource, LaunchConfig, OutputOptions, RequestOptions, WorkloadOptions
    from ddlctl.commands.launch import launch as run_launch
    from ddlctl.commands.resume import own_options
    from ddlctl.supervise.job import SupervisorOptions

    options = own_options(_ARGV or sys.argv[1:], command or ())
    if resume is not None:
        _exit_with(lambda: _resume(resume, options, command))

    config = LaunchConfig(
        cluster=ClusterSource(hosts=hosts, template=template, slurm=slurm, python=python,
                              private_network=private_network),
        request=RequestOptions(
            strategy=_value(strategy), workers=workers, ps=ps, evaluator=evaluator, env=tuple(env or ()),
            data_workers=data_workers,
            legacy_keras=legacy_keras, telemetry=telemetry, sample_interval_s=sample_interval, auto_steps=auto_steps,
            prefork=prefork, partition=partition, worker_per=_value(worker_per), balance=_value(balance),
            speeds=speeds, bench=bench, command=tuple(command or ()),
            trace=trace if trace is not None else "auto" if ctx.info_name == "profile" else None),
        workload=WorkloadOptions(workload=_value(workload), steps=steps, batch_size=batch_size,
                                 execution=_value(execution)),
        supervision=SupervisorOptions(startup_timeout_s=startup_timeout, grace_s=grace, max_restarts=max_restarts,
                                      restart_on=_value(restart_on) or "fault", hang_timeout_s=hang_timeout,
                                      host_timeout_s=host_timeout, min_workers=min_workers or 0,
                                      rejoin_after_s=rejoin_after),
        output=OutputOptions(run_dir=runs_dir, run_id=_run_id(run_id), dry_run=dry_run,
                             json_out=json_out, profile=ctx.info_name == "profile", verbose=verbose,
                             task_colors=task_colors, metrics=metrics_port, tensorboard=tensorboard,
                             resumed=resumed, options=tuple(options)),
        ssh=ssh_options(ssh_key, ssh_user, connect_timeout, accept_new_host_keys),
    )
    _exit_with(lambda: run_launch(config, people_console(), error_console()))


# ``profile`` takes exactly launch's options: the same function, registered under a second name.
app.command("profile", help=PROFILE_HELP, context_settings={"allow_interspersed_args": False})(launch)



def _resume(run_dir: Path, options: list[str], command: list[str] | None) -> int:
    """``--resume RUN_DIR``: the run's own launch again, from the folder it was launched in."""
    from ddlctl.cli import run_app
    from ddlctl.commands.resume import resume_argv

    given = iter(options)  # (--resume and the value after it left out)
    others = [o for o in given if not o.startswith("--resume=") and (o != "--resume" or next(given, None) is None)]
    if others or command:
        raise UserError(f"--resume takes the run's own options and command: {' '.join([*others, *(command or [])])} "
                        "given besides it", f"ddlctl launch --resume {run_dir}")
    argv, cwd = resume_argv(run_dir.expanduser().resolve())
    if cwd is not None:
        os.chdir(cwd)  # (its command's relative paths)
    return run_app(argv)


def _run_id(name: str | None) -> str | None:
    """``--run-id``: a plain folder name."""
    if name is not None and (not name or "/" in name or name in (".", "..") or name.startswith("-")):
        _fail(UserError(f"--run-id {name!r} is not a folder name", "use letters, digits, '-', '_' and '.'"))
    return name
