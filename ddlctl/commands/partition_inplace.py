"""``ddlctl partition --in-place``: measure the cluster as the launched chief of ``--strategy model``
does before it plans, by launching a short job whose chief only measures
(:mod:`ddlctl.modelparallel.measure`): the model profiled on the chief's host, each stage task's
speed for the model's own step (at the run's batch and micro-batches), what a message costs each
stage task, the link between them as TensorFlow moves tensors and a step's dispatch. ``partition``
then plans with those, so that its predictions are the chief's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ddlctl.cluster.model import Cluster
from ddlctl.contract.errors import LaunchError
from ddlctl.modelparallel.planner import Device, Layer, Link


@dataclass(frozen=True)
class InPlace:
    """What the measuring chief found: layers, one device per stage task (speed relative to the
    chief, message cost, memory as described), the link with a step's dispatch."""

    layers: list[Layer]
    devices: list[Device]
    link: Link


def chief_python(cluster: Cluster) -> str:
    """The interpreter of the host a model job's chief goes to (``python=``, else this one for a
    local host, else ``python3``), as the plan would choose it for the built-in workload."""
    from ddlctl.planning.plan import LaunchRequest, layout

    chief = next(p for p in layout(cluster, LaunchRequest(strategy="model")) if p.role == "chief")
    return chief.host.python or (sys.executable if chief.host.is_local else "python3")


def read_measured(path: Path) -> InPlace:
    """The measuring chief's ``measured.json`` as layers, devices and link."""
    data = json.loads(path.read_text())
    layers = [Layer(**layer) for layer in data["layers"]]
    devices = [Device.from_dict(d) for d in data["devices"]]
    link = data["link"]
    return InPlace(layers, devices, Link(link["bandwidth_bps"] or float("inf"), link["latency_s"], link["dispatch_s"]))


def measure_on_cluster(cluster: Cluster, hosts: str | None, template: str | None, model: str, batch_size: int,
                       microbatches: int, err: Console) -> InPlace:
    """Launch the measuring job on the cluster (stage tasks as ``launch --strategy model`` starts
    them, the chief :mod:`ddlctl.modelparallel.measure`), wait for it and read what it measured.
    Its run folder is removed when it succeeded, kept (and named) when it failed. ``cluster`` is
    the one ``hosts`` / ``template`` describe (already loaded: the chief's interpreter comes from it)."""
    from ddlctl.commands.config import ClusterSource, LaunchConfig, OutputOptions, RequestOptions
    from ddlctl.commands.launch import finish, prepare, record_run, supervise
    from ddlctl.contract.rundir import TASK_LOG, TASKS_DIR
    from ddlctl.modelparallel.measure import MEASURED_FILE

    command = (chief_python(cluster), "-m", "ddlctl.modelparallel.measure", "--model", model,
               "--batch-size", str(batch_size), "--microbatches", str(microbatches))
    root = Path(tempfile.mkdtemp(prefix="ddlctl-partition-"))
    config = LaunchConfig(cluster=ClusterSource(hosts=hosts, template=template),
                          request=RequestOptions(strategy="model", telemetry=False, auto_steps=False, command=command),
                          output=OutputOptions(run_dir=str(root), quiet=True))
    plan, connected = prepare(config, err)
    record_run(plan, connected)  # (plan.json: ddlctl stop finds the measuring job as any other run)
    err.print(f"measuring in place (--in-place, run {plan.run_id} in {root}): the stage tasks, and a chief that "
              "profiles the model and measures them…", highlight=False)
    result = supervise(plan, connected, config, err, err)
    finish(plan, result, err, err, render=False)
    chief = Path(plan.run_dir) / TASKS_DIR / "chief-0"
    if not result.ok or not (chief / MEASURED_FILE).is_file():
        why = _why(result.failure) if result.failure else f": the measuring chief wrote no {MEASURED_FILE}"
        raise LaunchError(f"--in-place: the measuring job failed{why}",
                          f"see {chief / TASK_LOG} (run folder {plan.run_dir} kept)")
    measured = read_measured(chief / MEASURED_FILE)
    shutil.rmtree(root, ignore_errors=True)
    return measured


def _why(failure) -> str:  # noqa: ANN001 - a ddlctl.supervise.results.Failure
    """The task at fault and its exception's last line (else the supervisor's message)."""
    last = next((line.strip() for line in reversed(failure.traceback) if line.strip()), None)
    where = f" ({failure.task} on {failure.host})" if failure.task else ""
    return f"{where}: {last or failure.message}"


def with_measured(devices: list[Device], measured: InPlace) -> list[Device]:
    """``devices`` (partition's, one per slot or GPU: names and memory) with the speeds and message
    costs measured in place, stage task by stage task; refused when the counts differ."""
    if len(devices) != len(measured.devices):
        raise LaunchError(f"--in-place measured {len(measured.devices)} stage task(s) but the cluster has "
                          f"{len(devices)} device(s) to plan over",
                          "plan without --in-place (speed=, --speeds or --bench) for this cluster")
    return [dataclasses.replace(d, speed=m.speed, message_s=m.message_s)
            for d, m in zip(devices, measured.devices, strict=True)]
