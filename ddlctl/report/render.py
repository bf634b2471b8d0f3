"""Rendering for people: the plan (``--dry-run``), the root cause of a failure, the summary."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddlctl.planning.plan import Plan, redact_env
from ddlctl.report.summary import RunSummary
from ddlctl.supervise.supervisor import Failure, JobResult, TaskState


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_plan(plan: Plan, console: Console) -> None:
    """A table of tasks and, per task, its TF_CONFIG and command."""
    title = f"plan {plan.run_id}: strategy {plan.strategy}, {len(plan.tasks)} task(s) on " \
            f"{len(plan.hosts)} host(s)"
    table = Table(title=title, title_justify="left")
    for column in ("task", "host", "port", "runs", "GPUs"):
        table.add_column(column)
    for task in plan.tasks:
        gpus = "-" if task.gpus is None else (",".join(map(str, task.gpus)) or "none")
        port = "-" if task.port is None else ("auto" if task.port == 0 else str(task.port))
        runs = "tf.distribute.Server" if task.kind == "server" else "program"
        table.add_row(task.name, task.host.label, port, runs, gpus)
    console.print(table)
    for task in plan.tasks:
        console.print(Text(f"{task.name}", style="bold"))
        if task.tf_config is not None:
            console.print(Text(f"  TF_CONFIG={json.dumps(task.tf_config, sort_keys=True)}"), soft_wrap=True)
        extra = {k: v for k, v in redact_env(task.env).items() if k != "TF_CONFIG"}
        console.print(Text("  env: " + " ".join(f"{k}={v}" for k, v in extra.items())), soft_wrap=True)
        console.print(Text(f"  cwd: {task.workdir}"))
        console.print(Text("  argv: " + json.dumps(list(task.argv))), soft_wrap=True)
    console.print(Text(f"run directory: {plan.run_dir}"))


def render_failure(failure: Failure, console: Console) -> None:
    """The root cause: which task, where, how it ended, and its traceback or last lines."""
    where = f"{failure.task} on {failure.host} failed: " if failure.task else ""
    head = f"✗ {where}{failure.message}"
    console.print(Text(head, style="bold red"))
    lines = failure.traceback or failure.tail
    if lines:
        label = "traceback" if failure.traceback else "last lines of its output"
        console.print(Text(f"  {label}:", style="red"))
        for line in lines:
            console.print(Text(f"    {line}"), soft_wrap=True)
    if failure.log:
        console.print(Text(f"  full log: {failure.log}"))


def render_summary(summary: RunSummary, result: JobResult, console: Console) -> None:
    """Short end-of-run table: tasks, steps, samples/s, loss, accuracy; then totals."""
    states = {t.name: t for t in result.tasks}
    table = Table(title=f"run {summary.run_id} ({summary.strategy})", title_justify="left")
    for column, justify in (("task", "left"), ("host", "left"), ("ended", "left"),
                            ("steps", "right"), ("samples/s", "right"), ("loss", "right"),
                            ("accuracy", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    summarized = {t.name: t for t in summary.tasks}
    for outcome in result.tasks:
        s = summarized.get(outcome.name)
        ended = outcome.state.value
        if outcome.status is not None and outcome.state in (TaskState.FAILED,):
            ended = f"failed ({outcome.status.describe()})"
        table.add_row(outcome.name, outcome.host, ended,
                      str(s.steps) if s else "-", _fmt(s.samples_per_s if s else None, ",.0f"),
                      _fmt(s.loss if s else None, ".4f"), _fmt(s.accuracy if s else None, ".4f"))
    del states
    console.print(table)
    rate = summary.throughput_samples_per_s
    line = f"wall time {result.wall_time_s:.1f}s · {len(result.tasks)} tasks · " \
           f"{summary.total_steps} steps recorded"
    if rate is not None:
        line += f" · {rate:,.0f} samples/s overall (first {summary.warmup_steps} steps of each " \
                f"task excluded as warm-up)"
    console.print(line)
    if summary.skipped_lines:
        console.print(f"{summary.skipped_lines} unreadable step line(s) skipped")
