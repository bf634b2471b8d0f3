"""``ddlctl launch``: from options to a supervised job. The CLI parses; this module does."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from ddlctl.cluster.addresses import route_source_address, with_reachable_addresses
from ddlctl.cluster.model import Cluster, Host
from ddlctl.cluster.source import DEFAULT_LOCAL_WORKERS, load_cluster
from ddlctl.commands.attempts import at_time_limit, earlier_attempts, next_attempt, requeued
from ddlctl.commands.config import LaunchConfig
from ddlctl.commands.preflight import (
    HostReport,
    probe_transports,
    require_one_tensorflow,
    require_own_run_id,
    require_usable,
)
from ddlctl.commands.request import (
    build_request,
    check_min_workers,
    fit_batch_to_workers,
    resolve_strategy,
    tf_keras_available,
)
from ddlctl.commands.resume import record_launch, share_checkpoint
from ddlctl.console import closed_stdout as stdoutgone
from ddlctl.console.collapse import CollapsingWriter
from ddlctl.console.output import PrefixedWriter, QuietWriter
from ddlctl.contract import envvars
from ddlctl.contract.diskspace import LOW_SPACE_BYTES, free_bytes, size_words, write_failure
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.rundir import OUTCOME_FILE, PLAN_FILE, SUMMARY_FILE, TRACE_FILE
from ddlctl.contract.runfolder import make_dir, new_run_id, remove_unused, write_plan, write_whole
from ddlctl.contract.strategies import facts_of
from ddlctl.diagnose.tfnoise import is_startup_noise, noise_in
from ddlctl.planning.plan import (
    MULTI_HOST_STRATEGIES,
    PROFILER_PORT_SUFFIX,
    LaunchRequest,
    Plan,
    layout,
    make_plan,
    needs_port,
    profiler_tasks,
    python_note,
)
from ddlctl.supervise.results import outcome_record
from ddlctl.supervise.supervisor import JobResult, Supervisor
from ddlctl.transport.base import Transport
from ddlctl.transport.fleet import (
    Connected,
    collect_remote_files,
    connection_source_address,
    end_leftovers,
    end_remote_leftovers,
    make_transports,
    open_sessions,
    reconnector,
    reopen_lost,
    with_ssh_addresses,
)
from ddlctl.transport.local import LocalTransport

if TYPE_CHECKING:
    from ddlctl.cluster.slurm import Allocation
    from ddlctl.console.metrics import MetricsServer
    from ddlctl.transport.session import HostSession


def tasks_needing_ports(cluster: Cluster, request: LaunchRequest) -> dict[str, list[str]]:
    """Host label -> names of its tasks that listen on a port (members of the cluster spec)."""
    by_host: dict[str, list[str]] = {}
    placements = layout(cluster, request)
    for placement in placements:
        if needs_port(placement, request.strategy):
            by_host.setdefault(placement.host.label, []).append(placement.name)
    for placement in profiler_tasks(placements, request):  # (--trace: where their profilers serve)
        by_host.setdefault(placement.host.label, []).append(placement.name + PROFILER_PORT_SUFFIX)
    return by_host


def choose_ports(cluster: Cluster, request: LaunchRequest, transports: dict[str, Transport],
                 chosen: dict[str, list[int]] | None = None) -> dict[str, int]:
    """A free port on its host for every task that listens (distinct per host). ``chosen``:
    ports a host probe already picked there; other hosts are asked now."""
    ports: dict[str, int] = {}
    for label, names in tasks_needing_ports(cluster, request).items():
        free = (chosen or {}).get(label)
        if free is None and label in transports:
            free = transports[label].free_ports(len(names))
        if free is not None:
            ports.update(zip(names, free, strict=True))
    return ports


def measure_first(sessions: Mapping[str, HostSession], hosts: Sequence[Host], source: str, request: LaunchRequest,
                  console: Console) -> LaunchRequest:
    """``--bench``: measure the hosts that run tasks as ``ddlctl check --bench`` does, through the
    launch's own host agents and with its tasks' environment (the device measurement is forked from
    the zygote the tasks then use), save the profile in the run directory
    (``cluster-profile.json``; the measurement tasks' folders on this machine in ``bench/``) and use
    its speeds (``--balance speed``, ``--strategy model``)."""
    from ddlctl.commands.bench import ClusterProfile, Tasks, measure_through, save_profile
    from ddlctl.planning.plan import common_env, task_python

    console.print("measuring every host's devices and links (--bench)…", highlight=False)
    run_dir = make_dir(request.run_dir)
    like = Tasks(env=common_env(request), python=lambda host: task_python(host, request))
    measured = measure_through(sessions, hosts, request.run_id, run_dir / "bench", 1.0, like, keep=True)
    profile = ClusterProfile(hosts=measured.hosts, links=measured.links, source=source)
    save_profile(profile, run_dir / "cluster-profile.json")
    console.print("measured GFLOP/s per device: " + ", ".join(f"{label} {host.speed:,.1f}"
                                                           for label, host in profile.hosts.items())
                  + f" (saved in {run_dir / 'cluster-profile.json'})", highlight=False)
    if request.balance != "speed" and not facts_of(request.strategy).stages:
        return request
    return dataclasses.replace(request, speeds={label: host.speed for label, host in profile.hosts.items()})


def prepare(config: LaunchConfig, console: Console) -> tuple[Plan, Connected]:
    """Cluster, request, host agents, ports and plan: everything before tasks start. A dry run
    touches no host (and starts no agent)."""
    source, req, output = config.cluster, config.request, config.output
    allocation = None
    if source.slurm:
        from ddlctl.cluster.slurm import read_allocation

        allocation = read_allocation()
    cluster, defaults, implicit = load_cluster(source.hosts, source.template, req.workers or DEFAULT_LOCAL_WORKERS,
                                               allocation, source.python)
    strategy = resolve_strategy(req, defaults)
    if allocation is not None and strategy not in MULTI_HOST_STRATEGIES and len(cluster.hosts) > 1:
        cluster = dataclasses.replace(cluster, hosts=cluster.hosts[:1])
        console.print(f"note: {strategy} runs on one node: {cluster.hosts[0].label}, the allocation's first "
                      f"(the job's other {len(allocation.nodes) - 1} node(s) stay idle)", highlight=False)
    legacy = req.legacy_keras
    if req.command and strategy in MULTI_HOST_STRATEGIES and legacy and not tf_keras_available():
        legacy = False
        console.print(
            "note: tf-keras is not installed: a program that calls model.fit under "
            f"{strategy} will fail (Keras 3 does not support it, keras-team/keras#18624). "
            "Custom training loops are fine. To use model.fit: pip install 'ddlctl[keras]'.")
    run_id = output.run_id or new_run_id(strategy)
    request = build_request(req, config.workload, output.run_dir, defaults, implicit, legacy, run_id)
    placements = layout(cluster, request)  # refuse impossible requests before touching any host
    if source.private_network:
        from ddlctl.transport.netns import check_private_network

        check_private_network(cluster.hosts, source.slurm, output.metrics)
    workers = sum(p.role == "worker" for p in placements)
    check_min_workers(config.supervision.min_workers, strategy, workers, config.supervision.max_restarts)
    request = fit_batch_to_workers(config.workload.batch_size, request, workers, config.supervision.min_workers)
    if config.supervision.min_workers or os.environ.get(envvars.SIGNAL_BEFORE):  # (a worker leaving, a time limit)
        request = dataclasses.replace(request, env={envvars.STOP_CHECKPOINTS: "1", **request.env})
    stages = request.env.get(envvars.PARTITION)
    if stages and len(stages.split(",")) != sum(p.role == "worker" for p in placements):
        raise ConfigError(f"--partition {req.partition} has {len(stages.split(','))} stage(s) but the cluster has "
                          f"{sum(p.role == 'worker' for p in placements)} stage task(s)",
                          "plan for this cluster (ddlctl partition --hosts ...) or give --workers to match")
    if output.dry_run:  # touch no host: local ports are real, remote ones shown as "auto"
        if allocation is not None:
            return make_plan(cluster, request, {}), Connected({}, allocation=allocation)
        remote = next((h for h in cluster.hosts if not h.is_local), None)
        if remote is not None:
            cluster = with_reachable_addresses(cluster, route_source_address(remote.address or remote.name))
        local = {h.label: LocalTransport(h) for h in cluster.hosts if h.is_local}
        ports = choose_ports(cluster, request, local)
        return make_plan(cluster, request, ports), Connected(dict(local))
    if source.private_network:  # before any process starts: they all inherit the namespace
        from ddlctl.transport.netns import enter_private_network

        enter_private_network()
    make_dir(Path(output.run_dir).expanduser())  # a bad --runs-dir is refused before any host is touched
    if output.run_id and (Path(request.run_dir) / PLAN_FILE).exists():
        job = requeued(Path(request.run_dir), os.environ) if allocation is not None else None
        if job is None and not output.resumed:
            raise ConfigError(f"--run-id {output.run_id}: {request.run_dir} already holds a run",
                              "choose another name, leave --run-id out, or continue it: launch --resume RUN_DIR")
        attempt = next_attempt(Path(request.run_dir))  # (the last attempt's records to attempts/<n>/)
        console.print(f"ddlctl: {f'Slurm requeued job {job}' if job else 'resumed'}: attempt {attempt} of run "
                      f"{output.run_id} goes on in {request.run_dir}, its tasks from their newest checkpoint",
                      highlight=False)
    connected = Connected(make_transports(cluster, config.ssh, allocation), allocation=allocation)
    fresh = not Path(request.run_dir).exists()
    try:
        cluster = with_ssh_addresses(cluster, connected.transports)
        cluster = with_reachable_addresses(cluster, connection_source_address(connected.transports))
        # One host agent per host that runs tasks; its hello is the probe (Python, TensorFlow,
        # free ports): one SSH session and one process start per host.
        counts = {label: len(names) for label, names in tasks_needing_ports(cluster, request).items()}
        used = {p.host.label for p in placements}
        hosts = [h for h in cluster.hosts if h.label in used]
        connected.sessions = open_sessions(connected.transports, hosts, run_id,
                                           Path(request.run_dir) / "agents", counts)
        require_own_run_id(run_id, {h.label: connected.sessions[h.label].hello.get("run_elsewhere") or []
                                    for h in hosts})
        reports = [HostReport(h.label, h.source, facts=connected.sessions[h.label].hello.get("probe") or {})
                   for h in hosts if not h.is_local]
        # a local host's tasks use the controller's Python unless python= names another: probe that one
        reports += probe_transports(connected.transports, [h for h in hosts if h.is_local and h.python])
        require_usable(reports)
        require_one_tensorflow(hosts, reports)
        remote = {h.label for h in hosts if not h.is_local}
        for report in reports:
            for warning in report.warnings if report.host in remote else ():
                console.print(f"ddlctl: warning: {report.host}: {warning}", style="yellow", highlight=False)
        chosen = {label: list((connected.sessions[label].hello.get("probe") or {}).get("ports", []))
                  for label in counts}
        if req.bench:
            request = measure_first(connected.sessions, hosts, cluster.source, request, console)
        ports = choose_ports(cluster, request, connected.transports, chosen)
        plan = make_plan(cluster, request, ports)
        if output.resumed:  # (mwms workers on hosts apart each restore from their own host's folder)
            share_checkpoint(plan, connected.sessions, lambda said: console.print(f"ddlctl: {said}", highlight=False))
    except BaseException:
        connected.close()
        if fresh:  # refused before it began: no empty run folder is left behind
            remove_unused(request.run_dir)
        raise
    return plan, connected


def launch(config: LaunchConfig, out: Console, err: Console) -> int:
    """Run ``ddlctl launch``; returns the exit code."""
    output = config.output
    server = None
    if output.metrics:  # a bad --metrics-port, or one in use, is refused before anything starts
        from ddlctl.console.metrics import JobMetrics, MetricsServer, parse_metrics_address

        address = parse_metrics_address(output.metrics)
        if not output.dry_run:
            server = MetricsServer(JobMetrics(), *address)
    try:
        return _launch(config, out, err, server)
    finally:
        if server is not None:
            server.close()  # the metrics end with the job


def _launch(config: LaunchConfig, out: Console, err: Console, server: MetricsServer | None) -> int:
    output = config.output
    plan, connected = prepare(config, err)
    note = python_note(plan)
    if note is not None and not output.quiet:
        err.print(f"ddlctl: {note}", highlight=False)
    if output.dry_run:
        if output.json_out:
            stdoutgone.write(json.dumps(plan.to_dict(), indent=1) + "\n")
        else:
            from ddlctl.report.render import render_plan

            render_plan(plan, out)
            if connected.allocation is not None:
                render_srun_commands(plan, connected.allocation, out)
        return 0
    record_run(plan, connected)
    if not output.resumed:  # (what launch --resume gives again)
        record_launch(Path(plan.run_dir), "profile" if output.profile else "launch", output.options,
                      config.request.command)
    if not output.quiet:
        err.print(f"ddlctl run {plan.run_id}: {plan.strategy}, {len(plan.tasks)} task(s) "
                  f"→ {plan.run_dir}")
        free = free_bytes(plan.run_dir)
        if free is not None and free < LOW_SPACE_BYTES:
            err.print(f"ddlctl: only {size_words(free)} free on the disk of {plan.run_dir}: task output, telemetry "
                      "and the built-in workload's checkpoints go there", highlight=False)
    if output.json_out:  # stdout carries summary.json alone; people's output goes to stderr
        out = err
    result = supervise(plan, connected, config, out, err, server)
    finished = finish(plan, result, out, err, full_report=output.profile, render=not output.quiet)
    if output.tensorboard:
        from ddlctl.report.tensorboard import write_in_child

        said = write_in_child(Path(plan.run_dir))
        if not output.quiet:
            err.print(f"ddlctl: {said}", highlight=False)
    if output.json_out:
        stdoutgone.write(json.dumps(finished.summary, indent=1) + "\n")
    if result.failure is not None and result.failure.reason == "time-limit" and connected.allocation is not None:
        checkpoints = next((t.env.get(envvars.CHECKPOINT_DIR) for t in plan.tasks if t.kind == "program"), None)
        def say(said: str) -> None:
            err.print(f"ddlctl: {said}", highlight=False)
            err.file.flush()

        if at_time_limit(os.environ, plan.run_id, checkpoints, earlier_attempts(Path(plan.run_dir)), say):
            return 0
    return finished.exit_code(result)


def supervise(plan: Plan, connected: Connected, config: LaunchConfig, out: Console, err: Console,
              server: MetricsServer | None = None) -> JobResult:
    """Run the plan under one supervisor; the agents and connections are closed afterwards. Task
    output goes to the terminal (through the live view's console under ``profile``), or only to
    the logs (quiet)."""
    opts = config.output
    live = None
    if (opts.profile or out.is_terminal and not opts.json_out) and not opts.quiet:
        from ddlctl.console.live import LiveView  # (rich.live and rich.progress: not for plain output)

        # profile: progress and the live table (status lines when not on a terminal);
        # launch on a terminal: the progress bar
        live = LiveView(out) if opts.profile else LiveView(out, table=False, plain=False)
    on_terminal = live is not None and live.live is not None
    if opts.quiet:
        writer = PrefixedWriter(open(os.devnull, "wb"))  # noqa: SIM115 - closed with the process
    elif on_terminal:
        from ddlctl.console.live import ConsoleLineWriter

        writer = ConsoleLineWriter(out, task_colors=opts.task_colors, live=live)  # scrolls above the live region
    else:
        writer = PrefixedWriter(sys.stderr.buffer if opts.json_out else sys.stdout.buffer,
                                task_colors=opts.task_colors)
    # While a live region is up, everything goes through its console (another stream writing to
    # the terminal would leave copies of the region in the scrollback).
    say = live.print if on_terminal and live is not None else err.print
    notify = (lambda _msg: None) if opts.quiet else \
        (lambda msg: say(Text.assemble(("ddlctl:", "dim"), f" {msg}"), highlight=False))
    if not opts.verbose and not opts.quiet:
        # the same line from several tasks shown once ([worker:0-7@host]); --verbose shows each
        writer = QuietWriter(CollapsingWriter(writer, tasks=len(plan.tasks)), is_startup_noise, lambda: notify(
            f"TensorFlow's start-up notices are left out here (all output is in {plan.run_dir}/tasks/*/output.log; "
            "--verbose shows everything)"), in_block=noise_in)
    try:
        metrics = server.metrics if server is not None else None
        if server is not None:
            notify(f"Prometheus metrics at {server.url}")
        samples = [f for f in (live.on_sample if live else None, metrics.on_sample if metrics else None) if f]

        def on_sample(host: str, record: dict) -> None:
            for feed in samples:
                feed(host, record)

        def on_progress(figures: Mapping[str, tuple[int, int | None]],
                        activity: Mapping[str, tuple[int, str | None]]) -> None:
            causes = supervisor.time_by_cause()
            if live is not None:
                live.on_progress(figures, activity, causes)
            if metrics is not None:
                metrics.on_progress(figures, supervisor.status(), causes)

        supervisor = Supervisor(plan, connected.sessions, writer, config.supervision, notify=notify,  # type: ignore[arg-type]
                                on_sample=on_sample if samples else None,
                                on_progress=on_progress if live is not None or metrics is not None else None,
                                reconnect=reconnector(plan, connected.transports))
        unreached: dict[str, str] = {}
        try:
            with live if live is not None else contextlib.nullcontext():
                result = supervisor.run()
            unreached = reopen_lost(plan, connected.transports, supervisor.sessions)  # their files back
            for missing in collect_remote_files(plan, supervisor.sessions):
                notify(missing)
        finally:
            connected.sessions = supervisor.sessions  # reconnected hosts have new ones
            for session in connected.sessions.values():
                session.shutdown()
            lost = [event["host"] for event in supervisor.hosts.lost]
            for line in end_remote_leftovers(plan, connected.transports, lost, unreached):
                notify(line)
    finally:
        connected.close()  # (a local host agent has ended once this returns)
        ended = end_leftovers(plan)
        if ended:
            notify(ended)
    return result


def finish(plan: Plan, result: JobResult, out: Console, err: Console, full_report: bool = False,
           render: bool = True) -> Finished:
    """After the job: outcome.json, summary.json and trace.json; the summary (or full report)
    and, last, the root cause if it failed. A file the run's disk refuses (full, a spent quota) is
    said after the report, which is shown all the same (see :class:`Finished`)."""
    run_dir = Path(plan.run_dir)
    unwritten: list[str] = []

    def keep(path: Path, write: Callable[[Path], object]) -> None:
        try:
            write(path)
        except OSError as exc:
            path.unlink(missing_ok=True)  # (nothing half-written)
            unwritten.append(write_failure(path, exc))

    outcome = outcome_record(result)
    earlier = earlier_attempts(run_dir)  # (a Slurm job requeued: the attempts before this one)
    if earlier:
        outcome.update(attempt=len(earlier) + 1, attempts=earlier)
    keep(run_dir / OUTCOME_FILE, lambda p: write_whole(p, json.dumps(outcome, indent=1) + "\n"))
    # imported here, after the run: nothing of the report delays the tasks' start
    from ddlctl.report.render import render_failure, render_report, render_summary
    from ddlctl.report.summary import summarize
    from ddlctl.report.trace import write_trace

    summary = summarize(run_dir, outcome=outcome)  # (the record, whether or not the disk took it)
    record = summary.to_dict()
    keep(run_dir / SUMMARY_FILE, lambda p: write_whole(p, json.dumps(record, indent=1) + "\n"))
    keep(run_dir / TRACE_FILE, lambda p: write_trace(run_dir, p))
    finished = Finished(record, tuple(unwritten))
    if render:
        if full_report:
            render_report(summary, out)
        else:
            render_summary(summary, result, out)
        if result.failure is not None:  # last, so it is what the person sees
            render_failure(result.failure, err)
    for line in unwritten:
        err.print(Text.assemble(("error:", "red"), f" {line}"), highlight=False)
    if unwritten:
        err.print(f"  hint: the run's record in {run_dir} is incomplete (the report above is whole): free space "
                  "there, or give --runs-dir a disk with room", highlight=False)
    if render and not result.ok:
        err.print(Text.assemble(("ddlctl: job failed", "red"), f" (exit code {result.exit_code}); "
                                f"logs in {plan.run_dir}/tasks/"))
    note = stdoutgone.closing_note(f"what followed was not shown; the task logs and the report are in {run_dir} "
                                   f"(`ddlctl report {run_dir}` shows the report again)")
    if note:
        err.print(note, highlight=False, soft_wrap=True)
    return finished


@dataclass(frozen=True)
class Finished:
    """What :func:`finish` made: the run's summary (as summary.json holds it, or would) and a
    sentence for each file it could not write."""

    summary: dict
    unwritten: tuple[str, ...] = ()

    def exit_code(self, result: JobResult) -> int:
        """The job's exit code; 1 for a job that succeeded but whose record is incomplete."""
        return 1 if result.ok and self.unwritten else result.exit_code


def render_srun_commands(plan: Plan, allocation: Allocation, out: Console) -> None:
    """``--dry-run --slurm``: the srun command of each node's host agent step (tasks start inside it)."""
    import shlex

    from ddlctl.transport.remote import bundled_agent_argv
    from ddlctl.transport.slurm import srun_argv

    used = {t.host.label for t in plan.tasks}
    out.print(f"srun job steps (job {allocation.job_id}; one host agent per node, which starts that node's "
              "tasks inside its step):", highlight=False)
    for host in plan.hosts:
        if host.label in used:
            argv = srun_argv(allocation.job_id, allocation.node(host.name),
                             bundled_agent_argv(host.python or "python3", plan.run_id, None), plan.run_id)
            out.print(f"  {host.label}: {shlex.join(argv)}", highlight=False, soft_wrap=True)


def record_run(plan: Plan, connected: Connected) -> None:
    """The run's files before anything starts: ``plan.json`` and, inside a Slurm allocation,
    ``slurm.json`` (the steps ``ddlctl stop`` cancels); the connections closed if that fails."""
    try:
        write_plan(plan)
        if connected.allocation is not None:
            write_slurm_record(plan, connected)
    except BaseException:
        connected.close()
        raise


def write_slurm_record(plan: Plan, connected: Connected) -> None:
    """``slurm.json``: the job and the agents' steps of a ``--slurm`` run (``ddlctl stop`` cancels them)."""
    assert connected.allocation is not None
    steps = [(s.hello or {}).get("slurm_step") for s in connected.sessions.values()]
    (Path(plan.run_dir) / "slurm.json").write_text(json.dumps({
        "job_id": connected.allocation.job_id, "steps": [s for s in steps if s],
        "nodes": {n.name: n.address for n in connected.allocation.nodes}}, indent=1) + "\n")
