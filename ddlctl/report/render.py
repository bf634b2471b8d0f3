"""Rendering for people: the plan (``--dry-run``), the root cause of a failure, the summary."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddlctl.contract.faults import Action
from ddlctl.contract.runfolder import RECORDS_READ_MAX
from ddlctl.contract.strategies import facts_of
from ddlctl.planning.plan import Plan, redact_env
from ddlctl.supervise.job import TaskState
from ddlctl.supervise.results import Failure, JobResult

if TYPE_CHECKING:  # (a dry run renders its plan without the summary's modules and NumPy: 0.53 -> 0.28 CPU-s)
    from ddlctl.report.summary import RunSummary


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` when missing."""
    return "-" if value is None else format(value, spec)


def render_plan(plan: Plan, console: Console) -> None:
    """A table of tasks and, per task, its TF_CONFIG and command."""
    title = f"plan {plan.run_id}: strategy {plan.strategy}, {len(plan.tasks)} task(s) on " \
            f"{len(plan.hosts)} host(s)"
    table = Table(title=title, title_justify="left")
    # the CPU limits of emulated machines (host keys cpus= and cpu_quota=), when a host has any
    limited = any(task.host.cpus or task.host.cpu_quota for task in plan.tasks)
    for column in ("task", "host", "port", "runs", "GPUs", *(("CPU limits",) if limited else ())):
        table.add_column(column)
    for task in plan.tasks:
        gpus = "-" if task.gpus is None else (",".join(map(str, task.gpus)) or "none")
        port = "-" if task.port is None else ("auto" if task.port == 0 else str(task.port))
        runs = {"dispatcher": "tf.data dispatcher", "data": "tf.data worker"}.get(task.role, "tf.distribute.Server") \
            if task.kind == "server" else "program"
        table.add_row(task.name, task.host.label, port, runs, gpus, *((cpu_limits(task.host),) if limited else ()))
    console.print(table)
    for note in plan_notes(plan):
        console.print(Text(note))
    for task in plan.tasks:
        console.print(Text(f"{task.name}", style="bold"))
        if task.tf_config is not None:
            console.print(Text(f"  TF_CONFIG={json.dumps(task.tf_config, sort_keys=True)}"), soft_wrap=True)
        extra = {k: v for k, v in redact_env(task.env, plan.request.env).items() if k != "TF_CONFIG"}
        console.print(Text("  env: " + " ".join(f"{k}={v}" for k, v in extra.items())), soft_wrap=True)
        console.print(Text(f"  cwd: {task.workdir}"))
        console.print(Text("  argv: " + json.dumps(list(task.argv))), soft_wrap=True)
    console.print(Text(f"run directory: {plan.run_dir}"))


def cpu_limits(host) -> str:  # noqa: ANN001 - a cluster Host
    """``CPUs 0-1, quota 0.5 CPU`` for a host's ``cpus=`` and ``cpu_quota=``; ``-`` for neither. Pure."""
    from ddlctl.host.cgroup import cpu_ranges

    parts = ([f"CPU{'s' if len(host.cpus) > 1 else ''} {cpu_ranges(host.cpus)}"] if host.cpus else []) + \
        ([f"quota {host.cpu_quota:g} CPU"] if host.cpu_quota else [])
    return ", ".join(parts) or "-"


def plan_notes(plan: Plan) -> list[str]:
    """How the workers were placed and the batch split, when that is not the plain default."""
    from ddlctl.planning.placement import worker_per_gpu

    notes = []
    request = plan.request
    worker_hosts = [h for h in plan.cluster.hosts if h.accepts("worker")]
    if facts_of(plan.strategy).elastic and worker_hosts and worker_per_gpu(worker_hosts, request):
        why = " (the hosts' GPU counts differ: " + ", ".join(f"{h.label} {h.gpus}" for h in worker_hosts) + ")" \
            if request.worker_per == "auto" else ""
        notes.append(f"workers: one per GPU, each with one GPU{why}")
    if request.balance == "speed":
        source = "the speeds in the profile" if request.speeds else "speeds measured at the start of the run"
        notes.append(f"batch: split over the workers in proportion to {source} (--balance speed)")
    return notes


def render_failure(failure: Failure, console: Console) -> None:
    """The root cause: which task, where, how it ended, and its traceback or last lines (shown
    safe by the console: :class:`~ddlctl.console.safe.SafeConsole`)."""
    where = f"{failure.task} on {failure.host} failed: " if failure.task else ""
    head = f"✗ {where}{failure.message}"
    console.print(Text(head, style="bold red"))
    lines = failure.traceback or failure.tail
    if lines:
        label = "traceback" if failure.traceback else "last lines of its output"
        if failure.reporter:  # not the task at fault's own words: whose they are
            label = f"{label} of {failure.reporter}, which reported it" if failure.traceback else \
                f"last lines of {failure.reporter}'s output, which reported it"
        console.print(Text(f"  {label}:", style="red"))
        for line in lines:
            console.print(Text(f"    {line}"), soft_wrap=True)
    if failure.log:
        console.print(Text(f"  full log: {failure.log}"))
    if failure.reporter_log:
        console.print(Text(f"  {failure.reporter}'s log: {failure.reporter_log}"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def _bytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f} GiB"


def _header(summary: RunSummary) -> str:
    parts = [f"strategy {summary.strategy}", f"{summary.hosts_count} host(s) x {summary.gpus_count} GPU(s)",
             f"{summary.tasks_count} task(s)"]
    if summary.global_batch:
        parts.append(f"global batch {summary.global_batch}")
    if summary.wall_time_s is not None:
        parts.append(f"wall {summary.wall_time_s:.1f}s")
    parts.append(f"first {summary.warmup_steps} steps of each task excluded as warm-up")
    return " · ".join(parts)


#: A cell longer than this, the same on every row, is said once under its table.
LONG_CELL = 12


def said_once(cells: list[str]) -> tuple[list[str], str | None]:
    """A column's cells with a long one that repeats on two rows or more made ``*`` (said once
    under the table: the returned note), or the cells as they are and None."""
    counts = {cell: cells.count(cell) for cell in cells if len(cell) > LONG_CELL}
    repeated = [cell for cell, count in counts.items() if count > 1]
    if len(repeated) != 1:
        return cells, None
    return ["*" if cell == repeated[0] else cell for cell in cells], repeated[0]


def _throughput_line(summary: RunSummary) -> str:
    line = f"{summary.total_steps} step records"
    if summary.throughput_samples_per_s is not None:
        line += f" · throughput {summary.throughput_samples_per_s:,.0f} samples/s"
    if summary.throughput_steps_per_s is not None:
        line += f" · {summary.throughput_steps_per_s:,.1f} steps/s"
    blocks = {t.steps_per_record for t in summary.tasks if t.steps_per_record > 1}
    if blocks:
        line += f" · steps recorded in blocks of {', '.join(map(str, sorted(blocks)))} (steps_per_execution)"
    if summary.skipped_lines:
        line += f" · {summary.skipped_lines} unreadable line(s) skipped"
    if summary.unread_bytes:
        line += (f" · {summary.unread_bytes / (1 << 20):,.0f} MiB at the start of record files not read "
                 f"(each read up to its last {RECORDS_READ_MAX >> 30} GiB)")
    return line


def render_summary(summary: RunSummary, result: JobResult, console: Console) -> None:
    """Short end-of-run table: tasks, steps, step time, samples/s, loss, accuracy; then totals."""
    table = Table(title=f"run {summary.run_id}: {_header(summary)}", title_justify="left")
    for column, justify in (("task", "left"), ("host", "left"), ("ended", "left"),
                            ("steps", "right"), ("p50 ms", "right"), ("samples/s", "right"), ("loss", "right"),
                            ("accuracy", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    summarized = {t.name: t for t in summary.tasks}
    work = {w.task: w for w in summary.work}
    for outcome in result.tasks:
        s = summarized.get(outcome.name)
        ended = outcome.state.value
        if outcome.status is not None and outcome.state is TaskState.FAILED:
            ended = f"failed ({outcome.status.describe()})"
        ran = work.get(outcome.name)
        table.add_row(outcome.name, outcome.host, ended,
                      str(s.steps) if s else (f"{ran.steps} ran" if ran and ran.steps is not None
                                              else "-"), _ms(s.step_time_p50_s if s else None),
                      fmt(s.samples_per_s if s else None, ",.0f"),
                      fmt(s.loss if s else None, ".4f"), fmt(s.accuracy if s else None, ".4f"))
    console.print(table)
    console.print(_throughput_line(summary))
    if summary.time_by_cause:
        console.print(f"time by cause: {summary.time_by_cause['line']}", highlight=False)
    if summary.mfu:
        console.print(mfu_line(summary.mfu), highlight=False)
    render_traces(summary, console)
    render_work(summary, console)
    render_balance(summary, console)
    from ddlctl.report.attempts import render_attempts  # (lazily: see TYPE_CHECKING above)
    from ddlctl.report.dataservice import render_data_service

    render_data_service(summary.data_service, console)
    render_stages(summary, console)
    render_faults(summary, console)
    render_attempts(summary.attempts, console)
    for line in summary.diagnosis:
        console.print(Text(f"• {line}", style="yellow"))


def _flops(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def mfu_line(rows: tuple[dict, ...]) -> str:
    """``model FLOPs 3.52 MFLOP/sample; achieved worker:0 1.20 GFLOP/s, ...; MFU worker:0 41.0%, ...``
    (one note for all when MFU cannot be given)."""
    per_sample = {r["train_flops_per_sample"] for r in rows}
    how = "declared by the program" if all(r.get("declared") for r in rows) else "3 x forward"
    head = (f"model FLOPs {_flops(next(iter(per_sample)), 'FLOP')}/sample ({how})" if len(per_sample) == 1
            else "model FLOPs per task")
    achieved = ", ".join(f"{r['task']} {_flops(r['achieved_flops_per_s'], 'FLOP/s')}" for r in rows)
    notes = {r["note"] for r in rows if r["mfu"] is None}
    if all(r["mfu"] is None for r in rows) and len(notes) == 1:
        mfu = f"MFU {next(iter(notes))}"
    else:
        mfu = "MFU " + ", ".join(f"{r['task']} " + (f"{r['mfu']:.1%}" if r["mfu"] is not None else r["note"])
                                 for r in rows)
    return f"{head}; achieved {achieved}; {mfu}"


def render_stages(summary: RunSummary, console: Console) -> None:
    """Model strategy: each stage task, its layers, whether its variables live there, its share
    of the step's matrix products, the cost model's time for it, its own work per step, its idle
    (bubble) share of the median step, and its CPU; then the plan's predicted step time against
    the measured one."""
    if not summary.stages:
        return
    table = Table(title="stages (model parallelism; predicted: the cost model's time for the stage per step, "
                        "transfers included; busy: the stage's own work per step, timed alone at the end; "
                        "idle: the rest of the median step, waiting on its neighbours)", title_justify="left")
    for column in ("stage task", "layers", "first … last", "variables there", "matmuls", "predicted ms",
                   "busy ms", "idle %", "CPU %"):
        table.add_column(column, justify="left" if column in ("stage task", "first … last") else "right")
    for stage in summary.stages:
        busy = stage.get("busy_s")
        idle = stage.get("idle_share")
        predicted = stage.get("predicted_s")
        table.add_row(stage["task"], str(stage["layers"]), f"{stage['first']} … {stage['last']}",
                      "yes" if stage["variables_on_stage"] else Text("no", style="red"), str(stage["matmuls"]),
                      fmt(predicted * 1e3 if predicted is not None else None, ".1f"),
                      fmt(busy * 1e3 if busy is not None else None, ".1f"),
                      fmt(idle * 100 if idle is not None else None, ".0f"), fmt(stage["cpu_mean"], ".0f"))
    console.print(table)
    plan = summary.stage_plan or {}
    if plan.get("predicted_step_s") and plan.get("measured_step_s"):
        link = plan.get("link") or {}
        bandwidth = link.get("bandwidth_bps")
        console.print(f"plan {plan['partition']} ({plan['how']}, {plan['microbatches']} micro-batch(es)): "
                      f"predicted step {plan['predicted_step_s'] * 1e3:.1f} ms, measured median "
                      f"{plan['measured_step_s'] * 1e3:.1f} ms ({plan['error']:+.0%}); link between stages as "
                      f"TensorFlow moved tensors: {link.get('latency_s', 0) * 1e3:.2f} ms per message"
                      + (f", {bandwidth / 1e9:.2f} GB/s" if bandwidth else "")
                      + f", {(plan.get('dispatch_s') or 0) * 1e3:.1f} ms to dispatch a step"
                      + (", a message costs each stage " + ", ".join(f"{c * 1e3:.2f}" for c in plan["message_s"])
                         + " ms" if plan.get("message_s") else ""))


def render_work(summary: RunSummary, console: Console) -> None:
    """ps: what each worker did (steps it ran, share, busy time, CPU), or why that is unknown."""
    if not summary.work:
        return
    table = Table(title="work per worker (ps: the coordinator hands steps to whichever worker is free)",
                  title_justify="left")
    for column in ("worker", "host", "steps run", "share", "busy s", "busy %", "CPU %"):
        table.add_column(column, justify="left" if column in ("worker", "host") else "right")
    for w in summary.work:
        table.add_row(w.task, w.host or "-", fmt(w.steps, "d"), fmt(w.share, ".0%"), fmt(w.busy_s, ".1f"),
                      fmt(None if w.busy_fraction is None else 100 * w.busy_fraction, ".0f"), fmt(w.cpu_mean, ".0f"))
    console.print(table)
    if summary.work_note:
        console.print(Text(f"  {summary.work_note}", style="dim"), soft_wrap=True)


def render_balance(summary: RunSummary, console: Console) -> None:
    """mwms: each worker's share of the batch, measured speed, compute and wait per step, and what
    the equal and the speed-proportional split give (predicted from the measured speeds)."""
    section = summary.balance
    if not section or not section.get("workers"):
        return
    final = f"; the final split's last {section['final_split_steps']} steps" if section.get("final_split_steps") else ""
    table = Table(title=f"balance (mwms, {section['split']} split{final}: a step lasts as long as its slowest "
                  "worker)", title_justify="left")
    for column in ("worker", "host", "batch", "share", "speed samples/s", "compute ms", "wait + all-reduce ms"):
        table.add_column(column, justify="left" if column in ("worker", "host") else "right")
    for w in section["workers"]:
        table.add_row(w["task"], w["host"] or "-", str(w["batch"]), fmt(w["share"], ".0%"), fmt(w["speed"], ",.0f"),
                      _ms(w["compute_s"]), _ms(w["wait_s"]))
    console.print(table)
    equal, balanced = section["predicted_equal_samples_per_s"], section["predicted_balanced_samples_per_s"]
    console.print(Text(
        f"  median step {section['step_s'] * 1e3:.1f} ms = {section['measured_samples_per_s']:,.0f} samples/s "
        f"(all-reduce about {section['comm_s'] * 1e3:.1f} ms); predicted from these speeds: equal split "
        f"{equal:,.0f}, split by speed {balanced:,.0f} ({balanced / equal:.2f}x), ideal (sum of speeds) "
        f"{section['ideal_samples_per_s']:,.0f}", style="dim"), soft_wrap=True)


def render_faults(summary: RunSummary, console: Console) -> None:
    """Restarts (one timeline line each, and a table), goodput and lost steps: what faults cost."""
    if not summary.restarts and not summary.degraded and not summary.hosts_lost:
        render_membership(summary, console)
        return
    first = min([r.time for r in summary.restarts] + [d.get("time", 0.0) for d in summary.degraded]
                + [h.get("time") or 0.0 for h in summary.hosts_lost])
    table = Table(title="faults and restarts", title_justify="left")
    for column in ("at", "task", "host", "cause", "what ddlctl did", "back after", "steps lost"):
        table.add_column(column, justify="right" if column in ("at", "back after", "steps lost") else "left")
    for r in summary.restarts:
        did = f"restarted {', '.join(r.tasks)} ({r.scope})" if r.action == Action.RESTART else r.action
        table.add_row(f"+{r.time - first:.1f}s", r.task, r.host or "-", r.cause, did,
                      "-" if r.downtime_s is None else f"{r.downtime_s:.1f}s",
                      "-" if r.steps_lost is None else str(r.steps_lost))
    for d in summary.degraded:
        table.add_row(f"+{d.get('time', first) - first:.1f}s", str(d.get("task")), str(d.get("host") or "-"),
                      str(d.get("cause")), "went on degraded (not replaced)", "-", "-")
    console.print(table)
    for r in summary.restarts:
        console.print(Text(f"  +{r.time - first:.1f}s {r.task}: {r.detail}", style="dim"), soft_wrap=True)
    console.print(f"goodput {fmt(summary.goodput, '.2f')} (productive step time / training window) · "
                  f"{summary.steps_lost} step(s) redone after resuming")
    render_membership(summary, console)


def render_membership(summary: RunSummary, console: Console) -> None:
    """The job's workers over time (``--min-workers``): each set, why it began, what it did."""
    phases = summary.membership_phases
    if not phases:
        return
    first = phases[0]["start"]
    table = Table(title="membership (--min-workers)", title_justify="left")
    for column in ("from", "to", "workers", "why", "steps", "samples/s while training", "goodput"):
        table.add_column(column, justify="left" if column in ("workers", "why") else "right", overflow="fold")
    for phase in phases:
        table.add_row(f"+{phase['start'] - first:.1f}s", f"+{phase['end'] - first:.1f}s",
                      f"{len(phase['workers'])}: {', '.join(phase['workers'])}", str(phase["why"]),
                      str(phase["steps"]), fmt(phase["samples_per_s"], ",.0f"),
                      "-" if phase.get("goodput") is None else f"{100 * phase['goodput']:.0f}%")
    console.print(table)


def render_hangs(summary: RunSummary, console: Console) -> None:
    """Each hang: whom ddlctl blamed and why, the threshold that applied, where every task stood;
    then the tasks SIGKILL could not end."""
    for number, hang in enumerate(summary.hangs, 1):
        what = "stuck in its exit, ended by ddlctl" if hang.get("kind") == "exit" else "blamed"
        table = Table(title=f"hang {number}: {hang.get('culprit')} {what} ({hang.get('why')})", title_justify="left")
        tasks = hang.get("tasks", [])
        # what each task's process and GPUs did over the stall (telemetry), where any task has it
        cpu, gpu = any(t.get("cpu") for t in tasks), any(t.get("gpu") for t in tasks)
        columns = ("task", "state", "last step", "idle s", *(("cpu %",) if cpu else ()),
                   *(("GPU busy %",) if gpu else ()), "where it stood")
        for column in columns:
            table.add_column(column, justify="right" if column in ("last step", "idle s", "cpu %", "GPU busy %")
                             else "left", overflow="fold")
        for task in tasks:
            style = "red" if task.get("task") == hang.get("culprit") else ""
            figures = []
            if cpu:
                figures.append(f"{task['cpu']['cpu_mean']:.0f}" if task.get("cpu") else "-")
            if gpu:
                figures.append(f"{task['gpu']['util_mean']:.0f} ({task['gpu']['state']})" if task.get("gpu") else "-")
            table.add_row(Text(str(task.get("task")), style=style), str(task.get("state")),
                          "-" if task.get("last_step") is None else str(task["last_step"]),
                          "-" if task.get("idle_s") is None else f"{task['idle_s']:.0f}", *figures,
                          str(task.get("where")))
        console.print(table)
        threshold = f"threshold {hang['threshold_s']:.0f}s: " if hang.get("threshold_s") else ""
        console.print(Text(f"  noticed after {hang.get('idle_s', 0):.0f}s without progress ({threshold}"
                           f"{hang.get('rule')}); stacks in {hang.get('stacks')}", style="dim"), soft_wrap=True)
        named = {str(t.get("task")) for t in tasks} | {str(hang.get("culprit"))}
        for capture in (summary.traces or {}).get("captures") or []:  # --trace auto: a capture before it
            if capture.get("reason") == "near-hang" and capture.get("task") in named:
                console.print(f"  the profiler before it (trace auto: {capture['why']}):", highlight=False)
                _trace_lines([t for t in summary.traces["tasks"] if t.get("session") == capture["session"]], console)
    for left in summary.left_running:
        console.print(Text(f"left running: {left.get('task')} on {left.get('host')} (pid {left.get('pid')}): SIGKILL "
                           f"could not end it ({left.get('where')})", style="red"), soft_wrap=True)


def render_traces(summary: RunSummary, console: Console) -> None:
    """``--trace``: each task's captured steps split by part, the slowest against a typical peer."""
    traces = summary.traces
    if not traces:
        return
    for note in traces.get("notes") or ([traces["note"]] if traces.get("note") else []):
        console.print(Text(f"• {note}", style="yellow"))
    tasks = traces.get("tasks") or []
    captures = traces.get("captures") or [{"session": "", "comparison": traces.get("comparison")}]
    for capture in captures:
        mine = [t for t in tasks if t.get("session", "") == capture["session"]]
        if not mine:
            continue
        asked = "-".join(str(s) for s in mine[0].get("asked") or mine[0]["steps"])
        why = f", asked by trace auto: {capture['why']}" if capture.get("why") else ""
        console.print(f"profiler capture, steps {asked}{why} (open: xprof --logdir {traces['logdir']}):",
                      highlight=False)
        _trace_lines(mine, console)
        if capture.get("comparison"):
            console.print(Text(f"• {capture['comparison']}", style="yellow"))


def _trace_lines(tasks: list[dict], console: Console) -> None:
    for task in tasks:
        wall = task["wall_s"] or 1e-9
        parts = " · ".join(f"{name.replace('_', ' ')} {seconds / wall:.0%}" for name, seconds in task["parts"].items()
                           if seconds / wall >= 0.005)
        compute = task["parts"].get("compute") or 1e-9
        top = ", ".join(f"{op} {seconds / compute:.0%}" for op, seconds in task["top_ops"][:3])
        covered = "" if task["steps"] == (task.get("asked") or task["steps"]) else \
            " (no step ended while it ran)" if task["steps"][1] < task["steps"][0] else \
            " (steps {}-{}: those begun after the start)".format(*task["steps"])
        peers = ", ".join(f"{peer} {seconds * 1000:.0f} ms" for peer, seconds in list(
            (task.get("rpc_peers") or {}).items())[:4])  # (ps: which ps a worker's closures wait on)
        console.print(f"  {task['task']} {wall * 1000:.0f} ms{covered}: {parts}" + (f" (ops: {top})" if top else "")
                      + (f" (tensors sent/received: {peers})" if peers else ""), highlight=False)


def _triple(a: float | None, b: float | None, c: float | None) -> str:
    return " / ".join(_ms(v) for v in (a, b, c))


def render_report(summary: RunSummary, console: Console) -> None:
    """The full report: header, per-task step statistics, per-host and per-GPU figures, diagnosis."""
    console.print(Text(f"run {summary.run_id}", style="bold"))
    console.print(_header(summary))
    console.print(_throughput_line(summary))
    if summary.time_by_cause:
        console.print(f"time by cause: {summary.time_by_cause['line']}", highlight=False)
    if summary.mfu:
        console.print(mfu_line(summary.mfu), highlight=False)
    render_traces(summary, console)
    tasks = Table(title="tasks", title_justify="left")
    for column in ("task", "host", "steps", "step ms p50 / p90 / p99", "samples/s", "input %", "late ms",
                   "CPU %", "RSS", "straggler"):
        tasks.add_column(column, justify="left" if column in ("task", "host", "straggler") else "right")
    for t in summary.tasks:
        tasks.add_row(t.name, t.host or "-", str(t.steps),
                      _triple(t.step_time_p50_s, t.step_time_p90_s, t.step_time_p99_s),
                      fmt(t.samples_per_s, ",.0f"),
                      fmt(None if t.input_fraction is None else t.input_fraction * 100, ".0f"),
                      _ms(t.arrival_lateness_p50_s), fmt(t.cpu_mean, ".0f"), _bytes(t.rss_peak_bytes),
                      Text("yes", style="red") if t.straggler else "no")
    console.print(tasks)
    hosts = Table(title="hosts", title_justify="left")
    for column in ("host", "CPU % mean", "memory peak / total", "net MB/s out / in", "samples", "GPUs"):
        hosts.add_column(column, justify="left" if column in ("host", "GPUs") else "right", overflow="fold")
    gpu_cells, gpu_note = said_once([str(len(h.gpus)) if h.gpus else (h.gpu_note or "no GPU") for h in summary.hosts])
    for h, gpu_cell in zip(summary.hosts, gpu_cells, strict=True):
        net = "-" if h.net_sent_bytes_per_s is None else \
            f"{h.net_sent_bytes_per_s / 1e6:.1f} / {h.net_recv_bytes_per_s / 1e6:.1f}"
        gaps = f" ({len(h.gaps)} gap(s))" if h.gaps else ""
        hosts.add_row(h.host, fmt(h.cpu_util_mean, ".0f"), f"{_bytes(h.mem_peak_bytes)} / {_bytes(h.mem_total_bytes)}",
                      net, f"{h.samples}{gaps}", gpu_cell)
    console.print(hosts)
    if gpu_note:
        console.print(f"GPUs (*): {gpu_note}", highlight=False)
    if any(h.gpus for h in summary.hosts):
        gpus = Table(title="GPUs", title_justify="left")
        for column in ("host", "GPU", "util % mean / p5", "SM active %", "memory peak / total",
                       "power W mean / peak / limit", "SM MHz busy / max", "capped (power / thermal)"):
            gpus.add_column(column, justify="left" if column in ("host", "GPU") else "right")
        for h in summary.hosts:
            for g in h.gpus:
                gpus.add_row(h.host, f"{g.index} {g.name or ''}".strip(),
                             f"{fmt(g.util_mean, '.0f')} / {fmt(g.util_p5, '.0f')}", fmt(g.sm_active_mean, ".1f"),
                             f"{_bytes(g.mem_peak_bytes)} / {_bytes(g.mem_total_bytes)}",
                             f"{fmt(g.power_mean_w, '.0f')} / {fmt(g.power_peak_w, '.0f')} / "
                             f"{fmt(g.power_limit_w, '.0f')}",
                             f"{fmt(g.sm_clock_busy_mean_mhz, '.0f')} / {fmt(g.sm_clock_max_mhz, '.0f')}",
                             f"{fmt(g.power_capped_share, '.0%')} / {fmt(g.thermal_capped_share, '.0%')}")
        console.print(gpus)
    render_work(summary, console)
    render_balance(summary, console)
    from ddlctl.report.attempts import render_attempts  # (lazily: see TYPE_CHECKING above)
    from ddlctl.report.dataservice import render_data_service

    render_data_service(summary.data_service, console)
    render_stages(summary, console)
    render_faults(summary, console)
    render_attempts(summary.attempts, console)
    render_hangs(summary, console)
    if summary.diagnosis:
        console.print(Text("diagnosis", style="bold"))
        for line in summary.diagnosis:
            console.print(Text(f"• {line}", style="yellow"))
    else:
        console.print("diagnosis: nothing stands out")
