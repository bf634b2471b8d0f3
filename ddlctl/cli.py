"""The ``ddlctl`` command line. It only parses options and calls the modules that do the work."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ddlctl import __version__
from ddlctl.errors import UserError
from ddlctl.planning.plan import BALANCE, STRATEGIES, WORKER_PER
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
RUNS_DIR_HELP = "Folder that receives run directories (<folder>/<run-id>/). --run-dir is an old spelling."
JSON_HELP = "Machine-readable output: JSON on stdout, and nothing else there."
EXECUTION_HELP = ("Built-in workload's execution: pipelined (tf.data parallel map + prefetch: input overlaps "
                  "compute), linear (the same input without overlap: the research's baseline) or python-feed "
                  "(batches built in Python sample by sample, one step per call). --pipeline / --no-pipeline "
                  "are old spellings of pipelined / linear.")
WORKLOAD_HELP = "Built-in workload to run when no command is given: cnn (a small CNN, augmented images) or mlp."
RunsDirOption = Annotated[str, typer.Option("--runs-dir", metavar="DIR", help=RUNS_DIR_HELP)]
OldRunDirOption = Annotated[str | None, typer.Option("--run-dir", hidden=True)]


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
    evaluator: Annotated[bool | None, typer.Option(
        "--evaluator/--no-evaluator", help="Add a side-car evaluator task (ps and mwms).",
        show_default=False)] = None,
    runs_dir: RunsDirOption = "runs",
    old_run_dir: OldRunDirOption = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="KEY=VALUE", help="Set KEY for every task; repeatable. A bare KEY passes on "
                                                 "ddlctl's own value of KEY (keeps secrets off every command line).",
        show_default=False)] = None,
    startup_timeout: Annotated[float, typer.Option(
        "--startup-timeout", metavar="SECONDS", min=0, help="Time for every task to start listening on its "
                                                            "port; the job fails naming the missing ones. 0: wait "
                                                            "forever.")] = 180.0,
    grace: Annotated[float, typer.Option(
        "--grace", metavar="SECONDS", min=0, help="Time between SIGTERM and SIGKILL when stopping tasks.")] = 5.0,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", metavar="N", min=0,
        help="Restarts allowed for the whole job (a task, its group or every task, as the strategy needs: see "
             "README 'Faults and restarts'). A lost ps worker never ends the job while the chief and another "
             "worker live.")] = 0,
    restart_on: Annotated[RestartOn, typer.Option(  # type: ignore[valid-type]
        "--restart-on", help="fault: restart after a signal (OOM kill, preemption, kill -9), exit 42/143, a hang "
                             "or a lost host; any: also after a Python exception or another non-zero exit.")
    ] = DEFAULT_RESTART_ON,
    hang_timeout: Annotated[float, typer.Option(
        "--hang-timeout", metavar="SECONDS", min=0,
        help="Time without any training step, once every task is up, before the job counts as hung: stacks "
             "are saved, the task at fault is named and handled as a fault. 0: off.")] = 600.0,
    host_timeout: Annotated[float, typer.Option(
        "--host-timeout", metavar="SECONDS", min=0, help="Time to keep reconnecting to a host whose SSH "
                                                         "connection dropped before the job fails naming it.")] = 60.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan (tasks, hosts, ports, TF_CONFIG, commands); start "
                          "nothing.")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help=JSON_HELP + " With --dry-run: the plan; otherwise summary.json at the end (task "
                                   "output and the report go to stderr).")] = False,
    legacy_keras: Annotated[bool, typer.Option(
        "--legacy-keras/--no-legacy-keras",
        help="For a command under ps/mwms, set TF_USE_LEGACY_KERAS=1 so model.fit uses "
             "tf-keras (Keras 3 model.fit does not work under ps/mwms). A program that imports Keras 3 "
             "then loads both Kerases (~0.25 s more per task start): --no-legacy-keras if it does not "
             "call model.fit.")] = True,
    telemetry: Annotated[bool, typer.Option(
        "--telemetry/--no-telemetry", help="Run a telemetry agent per host (GPU via NVML, CPU, memory, "
                                           "network, per-task CPU/RSS) into <run>/telemetry/.")] = True,
    sample_interval: Annotated[float, typer.Option(
        "--sample-interval", metavar="SECONDS", min=0.05, help="Time between telemetry samples.")] = 1.0,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Show every line tasks print, TensorFlow's start-up notices included (they are "
                                "always in <run>/tasks/*/output.log).")] = False,
    auto_steps: Annotated[bool, typer.Option(
        "--auto-steps/--no-auto-steps", help="Record step timings of Keras model.fit in your program without "
                                             "code changes (a callback ddlctl adds to every fit call).")] = True,
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
    pipeline: Annotated[bool | None, typer.Option("--pipeline/--no-pipeline", hidden=True)] = None,
    worker_per: Annotated[WorkerPer | None, typer.Option(  # type: ignore[valid-type]
        "--worker-per", help="gpu: one worker per GPU, each pinned with CUDA_VISIBLE_DEVICES (slots= workers on "
                             "CPU-only hosts), so hosts with 4 and 2 GPUs give 6 equal workers; host: workers per "
                             "host as --workers/slots= say, sharing the host's GPUs. auto: gpu under mwms when the "
                             "hosts' GPU counts differ (mwms needs the same GPUs in every worker), else host. "
                             "Default: the template's, else auto.", show_default=False)
    ] = None,
    balance: Annotated[Balance | None, typer.Option(  # type: ignore[valid-type]
        "--balance", help="mwms: speed gives each worker a share of the global batch proportional to its "
                          "speed (measured at the start of the run, or from --speeds; the built-in workload compares "
                          "the speeds shown in training after 4 steps, then at growing intervals, and splits "
                          "again where that pays, a few steps later), with the loss weighted so "
                          "the gradient equals the equal split's (README 'Heterogeneous clusters'). Built-in "
                          "workload, or programs that use ddlctl.balance. Default: the template's, else off.",
        show_default=False)] = None,
    speeds: Annotated[str | None, typer.Option(
        "--speeds", metavar="FILE", help="--balance speed: per-host speeds from a profile saved by 'ddlctl check "
                                         "--bench --save FILE' instead of measuring them at the start.",
        show_default=False)] = None,
    bench: Annotated[bool, typer.Option(
        "--bench", help="Measure every host first, as 'ddlctl check --bench' does (saved as "
                        "<run>/cluster-profile.json), and use the measured speeds for --balance speed and "
                        "--strategy model.")] = False,
    partition: Annotated[str | None, typer.Option(
        "--partition", metavar="FILE", help="--strategy model: the plan saved by 'ddlctl partition --save' (layers "
                                            "per stage task). Without it the chief plans with the greedy algorithm.",
        show_default=False)] = None,
    slurm: Annotated[bool, typer.Option(
        "--slurm", help="Run inside a Slurm allocation (salloc, sbatch): the cluster is the job's nodes (their "
                        "NodeAddr, tasks per node as worker slots, the job's GPUs), and each node's tasks start "
                        "in one srun job step, never over SSH (README 'Slurm').")] = False,
    python: SlurmPythonOption = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", metavar="NAME", help="Name of the run directory under --runs-dir (default: time, strategy "
                                         "and a random suffix).", show_default=False)] = None,
) -> None:
    """Start a TensorFlow cluster, supervise every task, and print a summary.

    \b
    Examples:
      ddlctl launch --strategy ps                  # built-in workload on this machine
      ddlctl launch --hosts hosts.txt -s mwms -- python train.py --epochs 3
      ddlctl launch --template cluster_templates/localhost-ps.yaml --dry-run
    """
    params = dict(locals())
    params.pop("ctx")
    _launch(profile=ctx.info_name == "profile", **params)


# ``profile`` takes exactly launch's options: the same function, registered under a second name.
app.command("profile", help=PROFILE_HELP, context_settings={"allow_interspersed_args": False})(launch)


def ssh_options(ssh_key: str | None, ssh_user: str | None, connect_timeout: float,
                accept_new_host_keys: bool = False) -> object:
    """The SshOptions the SSH flags describe (shared by every command that reaches hosts)."""
    from ddlctl.transport.options import SshOptions

    return SshOptions(key_file=ssh_key, user=ssh_user, connect_timeout_s=connect_timeout,
                      accept_new_host_keys=accept_new_host_keys)


def _runs_dir(runs_dir: str, old_run_dir: str | None) -> str:
    """``--runs-dir``, or its old spelling ``--run-dir`` when that was given."""
    return old_run_dir if old_run_dir is not None else runs_dir


def _execution(execution: Enum | None, pipeline: bool | None) -> str | None:
    """``--execution``, or what the old ``--pipeline/--no-pipeline`` flags meant."""
    if execution is not None and pipeline is not None:
        _fail(UserError("give --execution or the old --pipeline/--no-pipeline, not both"))
    if pipeline is not None:
        return "pipelined" if pipeline else "linear"
    return _value(execution)


def _run_id(name: str | None) -> str | None:
    """``--run-id``: a plain folder name."""
    if name is not None and (not name or "/" in name or name in (".", "..") or name.startswith("-")):
        _fail(UserError(f"--run-id {name!r} is not a folder name", "use letters, digits, '-', '_' and '.'"))
    return name


def _launch(profile: bool = False, **p: object) -> None:
    """Shared body of ``launch`` and ``profile`` (same options)."""
    from ddlctl.launch import LaunchOptions
    from ddlctl.launch import launch as run_launch

    opts = LaunchOptions(
        hosts=p["hosts"], template=p["template"], strategy=_value(p["strategy"]), workers=p["workers"],
        ps=p["ps"], evaluator=p["evaluator"], run_dir=_runs_dir(p["runs_dir"], p["old_run_dir"]),
        env=tuple(p["env"] or ()), startup_timeout_s=p["startup_timeout"], grace_s=p["grace"],
        max_restarts=p["max_restarts"], restart_on=_value(p["restart_on"]) or "fault",
        hang_timeout_s=p["hang_timeout"], host_timeout_s=p["host_timeout"], dry_run=p["dry_run"],
        json_out=p["json_out"], legacy_keras=p["legacy_keras"], telemetry=p["telemetry"],
        sample_interval_s=p["sample_interval"], auto_steps=p["auto_steps"], profile=profile,
        ssh=ssh_options(p["ssh_key"], p["ssh_user"], p["connect_timeout"], p["accept_new_host_keys"]),
        workload=_value(p["workload"]), steps=p["steps"], batch_size=p["batch_size"],
        execution=_execution(p["execution"], p["pipeline"]), partition=p["partition"],
        worker_per=_value(p["worker_per"]), balance=_value(p["balance"]), speeds=p["speeds"], bench=p["bench"],
        slurm=p["slurm"], python=p["python"], run_id=_run_id(p["run_id"]),
        command=tuple(p["command"] or ()),
        verbose=p["verbose"],
    )
    _exit_with(lambda: run_launch(opts, people_console(), error_console()))


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
        "--workload", help="Built-in workload of every run: cnn (a small CNN, augmented images) or mlp.")
    ] = DEFAULT_WORKLOAD,
    steps: Annotated[int, typer.Option("--steps", metavar="N", min=1, help="Training steps of every run.")] = 200,
    batch_size: Annotated[int, typer.Option("--batch-size", metavar="N", min=1,
                                            help="Global batch per step.")] = 64,
    workers: Annotated[int | None, typer.Option(
        "--workers", "-w", metavar="N", min=1, help="Workers for ps and mwms (default: 2 on this machine, else the "
                                                    "placement defaults).", show_default=False)] = None,
    repeats: Annotated[int, typer.Option("--repeats", metavar="N", min=1,
                                         help="Runs per strategy; the table shows the median and the spread.")] = 1,
    execution: Annotated[str, typer.Option(
        "--execution", metavar="MODE[,MODE...]",
        help="Execution modes of the built-in workload to run, comma-separated, or all: " + ", ".join(EXECUTIONS)
             + ". With several, a row each and, per strategy, how much faster pipelined is than each other "
               "mode.")] = "pipelined",
    pipeline: Annotated[str | None, typer.Option("--pipeline", hidden=True)] = None,
    plot_file: Annotated[str | None, typer.Option("--plot", metavar="FILE", help="Also draw the throughput chart "
                                                  "into this PNG (needs ddlctl[plot]).", show_default=False)] = None,
    runs_dir: RunsDirOption = "runs",
    old_run_dir: OldRunDirOption = None,
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
    p50/p95, speedup over one_device, scaling efficiency, GPU utilisation, final loss and accuracy;
    plus a bar chart. A strategy that fails gets a row that says why. Saves compare.json into
    <runs-dir>/compare-<stamp>/.

    Example: ddlctl compare --strategies one_device,mwms,ps --execution pipelined,linear --steps 300
    """
    from ddlctl.compare import CompareOptions, parse_executions, parse_strategies
    from ddlctl.compare import compare as run_compare
    from ddlctl.launch import LaunchOptions

    def run() -> int:
        old = {"on": "pipelined", "off": "linear", "both": "pipelined,linear"}  # --pipeline on|off|both
        modes = parse_executions(execution if pipeline is None else old.get(pipeline, pipeline))
        opts = CompareOptions(
            strategies=parse_strategies(strategies), executions=modes, repeats=repeats, plot=plot_file,
            json_out=json_out,
            launch=LaunchOptions(hosts=hosts, template=template, workers=workers,
                                 run_dir=_runs_dir(runs_dir, old_run_dir), startup_timeout_s=startup_timeout,
                                 workload=_value(workload), steps=steps, batch_size=batch_size, slurm=slurm,
                                 python=python,
                                 ssh=ssh_options(ssh_key, ssh_user, connect_timeout, accept_new_host_keys)))
        return run_compare(opts, people_console(), error_console())

    _exit_with(run)


@app.command()
def partition(
    hosts: Annotated[str | None, typer.Option("--hosts", metavar="FILE", help="Hosts file; speed= and memory= "
                                              "describe each device (default: this machine).",
                                              show_default=False)] = None,
    template: Annotated[str | None, typer.Option("--template", metavar="FILE", help="YAML cluster template.",
                                                 show_default=False)] = None,
    model: Annotated[str | None, typer.Option(
        "--model", metavar="MODULE:FUNCTION", help="A function that returns a Keras model (Sequential, or "
                                                    "functional taken layer by layer) or a ddlctl.modelparallel.Stack "
                                                    "(a list of callables).", show_default=False)] = None,
    workload: Annotated[Workload | None, typer.Option(  # type: ignore[valid-type]
        "--workload", help="A built-in workload's model instead of --model (default: deep, a deep MLP).",
        show_default=False)] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", metavar="N", min=1,
                                            help="Global batch the model is profiled and planned for.")] = 64,
    algorithm: Annotated[str, typer.Option(
        "--algorithm", metavar="random|greedy|optimal|all",
        help="Planning algorithm(s); 'all' prints them side by side. The single-fastest-device plan is always "
             "shown as the baseline.")] = "all",
    microbatches: Annotated[int, typer.Option(
        "--microbatches", metavar="M", min=1, help="Micro-batches per step (pipelining; 1: stages run one after "
                                                   "the other).")] = 1,
    bandwidth: Annotated[float | None, typer.Option(
        "--bandwidth", metavar="GB/S", min=0.001, help="Link bandwidth between consecutive stages. Default: the "
                                                       "profile's median measured link (--speeds), else 1.25.",
        show_default=False)] = None,
    latency: Annotated[float | None, typer.Option(
        "--latency-ms", metavar="MS", min=0, help="Link latency per message. Default: the profile's median "
                                                  "measured link (--speeds), else 0.1.", show_default=False)] = None,
    speeds: Annotated[str | None, typer.Option(
        "--speeds", metavar="FILE", help="Measured device speeds and links from 'ddlctl check --bench --save FILE' "
                                         "instead of the hosts' speed= (relative to localhost when the profile has "
                                         "it, else to the fastest host).", show_default=False)] = None,
    bench: Annotated[bool, typer.Option(
        "--bench", help="Measure every host's devices and links now (as 'ddlctl check --bench' does, through each "
                        "host's agent, so cpu_quota= applies) and plan with those speeds instead of speed=.")] = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the random plan.")] = 0,
    save: Annotated[str | None, typer.Option("--save", metavar="FILE", help="Write the plans and the chosen one "
                                             "(fastest predicted) as JSON.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Plan a model's layers over the cluster's devices (model parallelism).

    Profiles the model on this machine (per layer: forward+backward time and, apart, the
    optimizer's update, which runs off the pipeline's critical path; parameter and optimizer bytes,
    activation bytes), takes each device's speed and memory from the hosts file or template
    (speed=, memory=; measured speeds with --speeds FILE, or measured now with --bench), and
    prints, per algorithm (random: TensorFlow's native baseline; greedy: the research's; optimal:
    dynamic programming, exact for the cost model), the stages and the predicted step time. Exit
    code 2 when no algorithm can place the model (the reason is printed).

    Example: ddlctl partition --hosts hosts.txt --workload deep --microbatches 4 --save plan.json
    """
    from ddlctl.partitioning import PartitionOptions, run_partition

    def run() -> int:
        if model is not None and workload is not None:
            raise UserError("give --model or --workload, not both")
        opts = PartitionOptions(hosts=hosts, template=template, model=model or _value(workload) or "deep",
                                batch_size=batch_size, algorithm=algorithm, microbatches=microbatches,
                                bandwidth_gbps=bandwidth, latency_ms=latency, seed=seed, save=save,
                                json_out=json_out, speeds=speeds, bench=bench)
        return run_partition(opts, people_console(), error_console())

    _exit_with(run)


@app.command()
def report(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run directory (runs/<run-id>), possibly "
                                                                   "copied from elsewhere.")],
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
    from ddlctl.report.reporting import report as run_report

    _exit_with(lambda: run_report(run_dir, json_out, csv_dir, trace, warmup_steps, people_console()))


def people_console() -> Console:
    """Console for people on stdout: wide when piped (tables are not cut to 80 columns)."""
    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160, markup=False)


def error_console() -> Console:
    """Console for messages on stderr. Markup is off on every console: host names, paths, options
    and task output are the user's strings (a ``[/b]`` in a hosts file is text, not markup)."""
    return Console(stderr=True, soft_wrap=True, markup=False)


def _exit_with(run: Callable[[], int]) -> None:
    """Run a command body: its return value is the exit code; a UserError becomes a clear message."""
    try:
        code = run()
    except UserError as exc:
        _fail(exc)
    raise typer.Exit(code)


def _fail(exc: UserError) -> None:
    err = Console(stderr=True, highlight=False, markup=False)
    err.print(Text.assemble(("error:", "bold red"), " ", exc.message), soft_wrap=True)
    if exc.hint:
        err.print(f"  hint: {exc.hint}", soft_wrap=True)
    raise typer.Exit(exc.exit_code)


_ARGV: list[str] = []  # the arguments run_app was given (submit needs to see where '--' was)


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
    signal.signal(signal.SIGINT, interrupted)  # the supervisor has its own while tasks run
    try:
        code = run_app()
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
        # Leaving with an exit code: a Ctrl-C now (while the interpreter shuts down and Python
        # puts the default handler back) must not turn it into "killed by SIGINT".
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)


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
        "--bench", help="Measure instead: each device's matmul throughput in the host's TensorFlow (GPUs, else the "
                        "CPU), the controller-to-host link over the transport, and every host-to-host link (TCP "
                        "latency and bandwidth).")] = False,
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
    ports. Exits 1 when any host is unusable."""
    from ddlctl.check import check as run_check

    if save and not bench:
        _fail(UserError("--save applies with --bench", "add --bench"))
    _exit_with(lambda: run_check(hosts, template, ssh_options(ssh_key, ssh_user, connect_timeout,
                                                              accept_new_host_keys), json_out, people_console(),
                                 bench=bench, bench_seconds=bench_seconds, save=save, slurm=slurm,
                                 python=python))


@app.command()
def stop(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR",
                                           help="The run directory (runs/<run-id>) whose processes to kill.")],
    ssh_key: SshKeyOption = None,
    ssh_user: SshUserOption = None,
    connect_timeout: ConnectTimeoutOption = 10.0,
) -> None:
    """Kill whatever of a run is still alive, on every host of its plan.

    For example after the controller was killed. Processes are found by the run id in their
    environment, never by name. A Slurm run: the job ddlctl submit created, or the run's job steps
    inside your allocation, are cancelled with scancel."""
    from ddlctl.stop import stop as run_stop
    _exit_with(lambda: run_stop(run_dir, ssh_options(ssh_key, ssh_user, connect_timeout), people_console()))


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
    runs_dir: RunsDirOption = "runs",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the job's output until it ends; exit with "
                                                                "the run's exit code.")] = False,
) -> None:
    from ddlctl.slurm.submit import SubmitOptions
    from ddlctl.slurm.submit import submit as run_submit

    args = _with_separator(list(ctx.args), _ARGV or sys.argv[1:])
    _check_launch_args(args)
    opts = SubmitOptions(nodes=nodes, partition=partition, time_limit=time_limit, gpus_per_node=gpus_per_node,
                         ntasks_per_node=ntasks_per_node, job_name=job_name, sbatch_args=tuple(sbatch_arg or ()),
                         runs_dir=runs_dir, follow=follow, launch_args=tuple(args))
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
