"""``ddlctl partition``."""

from __future__ import annotations

from typing import Annotated

import typer

from ddlctl.cli.common import (
    JSON_HELP,
    UserError,
    Workload,
    _exit_with,
    _value,
    app,
    error_console,
    people_console,
)


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
        "--speeds", metavar="FILE", help="Device speeds and links measured by 'ddlctl check --bench --save FILE', "
                                         "instead of the hosts' speed=.", show_default=False)] = None,
    bench: Annotated[bool, typer.Option(
        "--bench", help="Measure every host's devices and links now (as 'ddlctl check --bench') and plan with those "
                        "speeds.")] = False,
    in_place: Annotated[bool, typer.Option(
        "--in-place", help="Measure as a launched model-parallel chief does (its stages, messages, links) and plan "
                           "with that.")] = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the random plan.")] = 0,
    save: Annotated[str | None, typer.Option("--save", metavar="FILE", help="Write the plans and the chosen one "
                                             "(fastest predicted) as JSON.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Plan a model's layers over the cluster's devices (model parallelism).

    Profiles the model on this machine (per layer: forward+backward time and, apart, the
    optimizer's update, which runs off the pipeline's critical path; parameter and optimizer bytes,
    activation bytes), takes each device's speed and memory from the hosts file or template
    (speed=, memory=; measured speeds with --speeds FILE, or measured now with --bench; or
    everything measured on the cluster as the launched chief measures it, with --in-place), and
    prints, per algorithm (random: TensorFlow's native baseline; greedy: the research's, with a
    fastest-first pass added without micro-batching; optimal: dynamic programming, exact for the
    cost model), the stages and the predicted step time, each plan's speed-up over random
    placement's expected step (200 random draws: one draw says little). Exit code 2 when no
    algorithm can place the model (the reason is printed).

    Example: ddlctl partition --hosts hosts.txt --workload deep --microbatches 4 --save plan.json
    """
    from ddlctl.commands.partition import PartitionOptions, run_partition

    def run() -> int:
        if model is not None and workload is not None:
            raise UserError("give --model or --workload, not both")
        opts = PartitionOptions(hosts=hosts, template=template, model=model or _value(workload) or "deep",
                                batch_size=batch_size, algorithm=algorithm, microbatches=microbatches,
                                bandwidth_gbps=bandwidth, latency_ms=latency, seed=seed, save=save,
                                json_out=json_out, speeds=speeds, bench=bench,
                                in_place=in_place)
        return run_partition(opts, people_console(), error_console())

    _exit_with(run)

