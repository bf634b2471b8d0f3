"""``ddlctl compare``: the same workload under several strategies (and execution modes), side by side.

Each run gets its own run directory under ``<run-dir>/compare-<stamp>/``; a strategy that fails
does not stop the comparison: its row says why. The table and ``compare.json`` are computed from
the runs' ``summary.json`` files by :func:`rows_from_runs` (pure).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddlctl.commands.config import LaunchConfig
from ddlctl.commands.launch import finish, prepare, record_run, supervise
from ddlctl.contract.diskspace import write_failure
from ddlctl.contract.errors import ConfigError, UserError
from ddlctl.contract.runfolder import make_dir, write_whole
from ddlctl.contract.strategies import STRATEGIES
from ddlctl.report.render import fmt
from ddlctl.workloads import EXECUTIONS

BASELINE = "one_device"


@dataclass(frozen=True)
class CompareOptions:
    """What ``ddlctl compare`` was asked for; ``launch`` carries the shared launch options."""

    strategies: tuple[str, ...]
    executions: tuple[str, ...] = ("pipelined",)
    inputs: tuple[str, ...] = ("local",)  # --input: local, service (the tf.data service: --data-workers)
    data_workers: int = 1
    repeats: int = 1
    plot: str | None = None
    json_out: bool = False
    launch: LaunchConfig = field(default_factory=LaunchConfig)


@dataclass(frozen=True)
class RunRecord:
    """One run of the comparison: its strategy, mode, and what it produced (or why it failed)."""

    strategy: str
    execution: str
    run_dir: str | None
    exit_code: int
    error: str | None
    summary: dict | None
    workers: int | None = None


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or not names:
        raise ConfigError(f"--strategies {text!r}: unknown strategy {unknown[0]!r}" if unknown
                          else "--strategies needs at least one strategy",
                          "choose from: " + ",".join(STRATEGIES))
    return names


def parse_executions(text: str) -> tuple[str, ...]:
    """``"pipelined,linear"`` or ``"all"`` -> execution modes in the order given (no repeats)."""
    names = EXECUTIONS if text.strip() == "all" else tuple(dict.fromkeys(
        s.strip() for s in text.split(",") if s.strip()))
    unknown = [s for s in names if s not in EXECUTIONS]
    if unknown or not names:
        raise ConfigError(f"--execution {text!r}: " + (f"unknown mode {unknown[0]!r}" if unknown else "no mode"),
                          "choose from: " + ",".join(EXECUTIONS) + ", or all")
    return names


#: A run mode's suffix when the tf.data service makes its input (``--input service``).
SERVICE = "+service"
INPUTS = ("local", "service")


def parse_inputs(text: str) -> tuple[str, ...]:
    """``"local,service"`` -> the inputs to run, in the order given (no repeats)."""
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [s for s in names if s not in INPUTS]
    if unknown or not names:
        raise ConfigError(f"--input {text!r}: " + (f"unknown input {unknown[0]!r}" if unknown else "no input"),
                          "choose from: local, service (the tf.data service, with --data-workers N)")
    return names


def run_modes(executions: Sequence[str], inputs: Sequence[str]) -> tuple[str, ...]:
    """Each execution mode with each input: ``pipelined``, ``pipelined+service`` ..."""
    return tuple(m if i == "local" else f"{m}{SERVICE}" for m in executions for i in inputs)


def label(strategy: str, execution: str, several: bool) -> str:
    return f"{strategy} ({execution.replace(SERVICE, ', service input')})" if several else strategy


def _trainer_tasks(summary: dict) -> list[dict]:
    """Tasks that recorded steps (ps: the chief; otherwise every worker)."""
    return [t for t in summary.get("tasks", []) if t.get("steps")]


def _median(values: Sequence[float]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def rows_from_runs(runs: Sequence[RunRecord], several: bool) -> list[dict]:
    """One row per (strategy, mode): throughput median and spread over repeats, step time p50/p95,
    speedup over one_device (same mode), scaling efficiency (speedup / workers), GPU utilisation,
    final loss and accuracy; or the error of a strategy that failed."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.strategy, run.execution), []).append(run)
    rows = []
    for (strategy, execution), records in groups.items():
        good = [r for r in records if r.error is None and r.summary is not None]
        throughputs = [r.summary["throughput_samples_per_s"] for r in good
                       if r.summary.get("throughput_samples_per_s") is not None]
        tasks = [_trainer_tasks(r.summary) for r in good]
        workers = max((r.workers for r in good if r.workers), default=None)
        # a run's final accuracy in the order of the repeats (None: that run failed), so that the
        # repeats of two modes pair up (run k of each: interleaved, side by side in time)
        by_repeat = [_median([t.get("accuracy") for t in _trainer_tasks(r.summary)])
                     if r.error is None and r.summary is not None else None for r in records]
        gpu = [g["util_mean"] for r in good for h in r.summary.get("hosts", []) for g in h.get("gpus", [])
               if g.get("util_mean") is not None]
        rows.append({
            "label": label(strategy, execution, several), "strategy": strategy, "execution": execution,
            "tasks": max((r.summary.get("tasks_count", 0) for r in good), default=None),
            "workers": workers,
            "throughput_samples_per_s": _median(throughputs), "throughput_runs": throughputs,
            "throughput_min": min(throughputs, default=None), "throughput_max": max(throughputs, default=None),
            "step_time_p50_s": _median([t.get("step_time_p50_s") for ts in tasks for t in ts]),
            "step_time_p95_s": _median([t.get("step_time_p95_s") for ts in tasks for t in ts]),
            "gpu_util_mean": statistics.mean(gpu) if gpu else None,
            "loss": _median([t.get("loss") for ts in tasks for t in ts]),
            "accuracy": _median([t.get("accuracy") for ts in tasks for t in ts]),
            "accuracy_runs": [a for a in by_repeat if a is not None],
            "accuracy_by_repeat": by_repeat,
            "steps_in_flight": _median([t.get("steps_in_flight_mean") for ts in tasks for t in ts]),
            "input_fraction": _median([t.get("input_fraction") for ts in tasks for t in ts]),
            "error": None if good else "; ".join(dict.fromkeys(r.error or "no result" for r in records)),
            "run_dirs": [r.run_dir for r in records if r.run_dir],
        })
    baselines = {row["execution"]: row["throughput_samples_per_s"] for row in rows if row["strategy"] == BASELINE}
    baseline_runs = {row["execution"]: row["throughput_runs"] for row in rows if row["strategy"] == BASELINE}
    for row in rows:
        base = baselines.get(row["execution"])
        value = row["throughput_samples_per_s"]
        row["speedup_vs_one_device"] = value / base if base and value else None
        spread = speedup_range(row["throughput_runs"], baseline_runs.get(row["execution"], [])) \
            if row["strategy"] != BASELINE else None
        row["speedup_range"] = list(spread) if spread else None  # [lowest, highest, inside the noise]
        row["bound"] = bound(row["execution"], row["input_fraction"])
        row["scaling_efficiency"] = row["speedup_vs_one_device"] / row["workers"] \
            if row["speedup_vs_one_device"] and row["workers"] else None
    return rows


#: a pipelined step that still waits this share of its time for input is input-bound
INPUT_WAIT_BOUND = 0.30


def bound(execution: str, input_fraction: float | None) -> str | None:
    """Input-bound or compute-bound, from the run's own step records (the share of each step spent
    getting its batch). Without overlap (linear, python-feed) that share is the input pipeline
    alone and the rest the step alone: the larger decides. Pipelined, it is what overlap left: a
    step still waiting for input is input-bound, else the input is hidden behind compute."""
    if input_fraction is None:
        return None
    if execution.removesuffix(SERVICE) == "pipelined":
        return (f"input-bound (still waits {input_fraction:.0%} for input)" if input_fraction > INPUT_WAIT_BOUND
                else f"compute-bound (input hidden: {input_fraction:.0%} wait)")
    kind = "input" if input_fraction >= 0.5 else "compute"
    return f"{kind}-bound ({input_fraction:.0%} input, {1 - input_fraction:.0%} compute, one after the other)"


def overlap_ceiling(input_fraction: float) -> float:
    """The most that overlapping input with compute can gain over a step that does one after the
    other: (input + compute) / the larger of the two."""
    return 1.0 / max(input_fraction, 1.0 - input_fraction, 1e-9)


def overlap(one: Sequence[float], other: Sequence[float]) -> bool:
    """Whether two sets of repeated measurements overlap (their difference is inside the noise)."""
    return min(one) <= max(other) and min(other) <= max(one)


def speedup_range(fast: Sequence[float], slow: Sequence[float]) -> tuple[float, float, bool] | None:
    """The spread of ``median(fast) / median(slow)`` over repeats: (lowest, highest) ratio any run
    of one against any run of the other gives, and whether the difference is inside the noise (the
    two ranges of throughputs overlap). None with fewer than two runs of either."""
    if len(fast) < 2 or len(slow) < 2 or min(slow) <= 0:
        return None
    return min(fast) / max(slow), max(fast) / min(slow), overlap(fast, slow)


def _against_pipelined(rows: Sequence[dict], key: str) -> Iterator[tuple[str, str, object, object]]:
    """(strategy, mode, pipelined's ``key``, that mode's ``key``) for every other mode that ran."""
    by = {(r["strategy"], r["execution"]): r[key] for r in rows}
    for (strategy, mode), value in by.items():
        fast = by.get((strategy, "pipelined"))
        if mode != "pipelined" and SERVICE not in mode and fast and value:
            yield strategy, mode, fast, value


def execution_ranges(rows: Sequence[dict]) -> dict[str, dict[str, list]]:
    """Per strategy and mode, with repeats: [lowest, highest] of pipelined / that mode's throughput
    and whether the difference is inside the noise (see :func:`speedup_range`)."""
    ranges: dict[str, dict[str, list]] = {}
    for strategy, mode, fast, runs in _against_pipelined(rows, "throughput_runs"):
        spread = speedup_range(fast, runs)  # type: ignore[arg-type]
        if spread:
            ranges.setdefault(strategy, {})[mode] = list(spread)
    return ranges


#: pipelined's and linear's final accuracy "equal" when a repeat's two runs differ by at most this
ACCURACY_POINT = 0.01


def accuracy_note(fast: Sequence[float | None], slow: Sequence[float | None]) -> str | None:
    """Final accuracy of pipelined against linear over repeats (each in the order of the repeats,
    None for a run that failed): the medians, each with its range, whether the difference is
    inside the run-to-run spread (under ps, asynchronous updates make the final accuracy vary from
    run to run), and the difference within each repeat (its two runs ran side by side in time), in
    points, with how many of them are within one point; None with fewer than two runs of either."""
    one, other = [a for a in fast if a is not None], [a for a in slow if a is not None]
    if len(one) < 2 or len(other) < 2:
        return None
    note = (f"accuracy {statistics.median(one):.3f} [{min(one):.3f}-{max(one):.3f}] pipelined, "
            f"{statistics.median(other):.3f} [{min(other):.3f}-{max(other):.3f}] linear"
            f"{': inside the run-to-run spread' if overlap(one, other) else ''}")
    pairs = [a - b for a, b in zip(fast, slow, strict=False) if a is not None and b is not None]
    if pairs:
        close = sum(abs(d) <= ACCURACY_POINT + 1e-9 for d in pairs)
        note += (f" (pipelined - linear per repeat: {', '.join(f'{d * 100:+.1f}' for d in pairs)} points; "
                 f"{close} of {len(pairs)} within 1 point)")
    return note


def verdict(strategy: str, ratios: dict[str, float], ranges: dict[str, list], repeats: int,
            linear_input: float | None = None, accuracy: str | None = None) -> str:
    """The line that says how pipelined execution compared under ``strategy``, with the spread over
    ``repeats``, whether each difference is inside the noise, (``linear_input``: the input's share
    of a linear step) the most overlap could gain there, so whether it can help at all, and
    (``accuracy``: :func:`accuracy_note`) how the final accuracies compared."""
    parts = []
    for mode, ratio in ratios.items():
        text = f"{ratio:.2f}x {mode}'s throughput"
        spread = ranges.get(mode)
        if spread:
            low, high, noise = spread
            text += f" ({low:.2f}-{high:.2f}x over {repeats} repeats{': inside the noise' if noise else ''})"
        parts.append(text)
    line = f"pipelined under {strategy}: " + ", ".join(parts)
    if linear_input is not None and "linear" in ratios:
        ceiling = overlap_ceiling(linear_input)
        line += f"; input was {linear_input:.0%} of a linear step, so overlap can gain at most {ceiling:.2f}x here"
        if ratios["linear"] < 1.0:
            line += " (it lost instead: the input pipeline took cores the compute was using)"
    if accuracy:
        line += f"; {accuracy}"
    return line


def service_speedups(rows: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """Per strategy and execution mode that ran with both inputs: the tf.data service's throughput
    over local input's, and the share of each step spent waiting for input with each."""
    by = {(r["strategy"], r["execution"]): r for r in rows if not r["error"]}
    out: dict[str, dict[str, dict]] = {}
    for (strategy, mode), served in by.items():
        local = by.get((strategy, mode.removesuffix(SERVICE)))
        if SERVICE in mode and local and local["throughput_samples_per_s"] and served["throughput_samples_per_s"]:
            out.setdefault(strategy, {})[mode.removesuffix(SERVICE)] = {
                "ratio": served["throughput_samples_per_s"] / local["throughput_samples_per_s"],
                "input_local": local.get("input_fraction"), "input_service": served.get("input_fraction")}
    return out


def service_line(strategy: str, mode: str, figures: dict) -> str:
    """How the tf.data service compared with local input under ``strategy`` (``mode``: execution)."""
    line = f"the tf.data service under {strategy} ({mode}): {figures['ratio']:.2f}x local input's throughput"
    before, after = figures.get("input_local"), figures.get("input_service")
    if before is not None and after is not None:
        line += f"; each step waited {before:.0%} for input, {after:.0%} with the service"
    return line


def execution_speedups(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per strategy: pipelined throughput / each other mode's throughput (for the modes that ran),
    e.g. ``{"ps": {"linear": 1.2, "python-feed": 11.5}}``."""
    speedups: dict[str, dict[str, float]] = {}
    for strategy, mode, fast, value in _against_pipelined(rows, "throughput_samples_per_s"):
        speedups.setdefault(strategy, {})[mode] = fast / value  # type: ignore[operator]
    return speedups


def _one_run(opts: CompareOptions, strategy: str, execution: str, root: Path, err: Console) -> RunRecord:
    base = opts.launch
    served = execution.endswith(SERVICE)  # (the built-in workload's --input auto takes the service)
    launch_opts = dataclasses.replace(
        base, request=dataclasses.replace(base.request, strategy=strategy,
                                          data_workers=opts.data_workers if served else None),
        workload=dataclasses.replace(base.workload, execution=execution.removesuffix(SERVICE)),
        output=dataclasses.replace(base.output, run_dir=str(root), quiet=True, dry_run=False, json_out=False))
    try:
        plan, connected = prepare(launch_opts, err)
    except UserError as exc:
        return RunRecord(strategy, execution, None, exc.exit_code, exc.message, None)
    record_run(plan, connected)  # (inside an allocation its slurm.json too: ddlctl stop cancels its steps)
    result = supervise(plan, connected, launch_opts, err, err)
    summary = finish(plan, result, err, err, render=False).summary
    error = None if result.ok else (result.failure.message if result.failure else f"exit {result.exit_code}")
    if error and result.failure and result.failure.task:
        error = f"{result.failure.task} on {result.failure.host}: {error}"
    workers = sum(1 for t in plan.tasks if t.role == "worker")
    return RunRecord(strategy, execution, plan.run_dir, result.exit_code, error, summary, workers)


def run_order(strategies: Sequence[str], executions: Sequence[str], repeats: int) -> list[tuple[str, str, int]]:
    """(strategy, mode, repeat) in the order they run: interleaved (A, B, C, A, B, C ...), so that a
    drift of the machine during the comparison falls on every row alike instead of on the last."""
    return [(s, m, r) for r in range(repeats) for s in strategies for m in executions]


def compare(opts: CompareOptions, out: Console, err: Console) -> int:
    """Run every (strategy, mode, repeat); print the table and bar chart; write compare.json."""
    if opts.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib", "pip install 'ddlctl[plot]'") from None
    root = Path(opts.launch.output.run_dir).expanduser().resolve() / time.strftime("compare-%Y%m%d-%H%M%S")
    make_dir(root)
    modes = run_modes(opts.executions, opts.inputs)
    several = len(modes) > 1
    runs: list[RunRecord] = []
    plan = run_order(opts.strategies, modes, opts.repeats)
    for i, (strategy, execution, repeat) in enumerate(plan, start=1):
        name = label(strategy, execution, several) + (f" #{repeat + 1}" if opts.repeats > 1 else "")
        err.print(Text.assemble(("ddlctl compare:", "dim"), f" [{i}/{len(plan)}] {name} …"), highlight=False)
        run = _one_run(opts, strategy, execution, root, err)
        runs.append(run)
        rate = (run.summary or {}).get("throughput_samples_per_s")
        status = f"{rate:,.0f} samples/s" if run.error is None and rate else f"failed: {run.error}"
        err.print(Text.assemble(("ddlctl compare:", "dim"), f" [{i}/{len(plan)}] {name}: {status}"),
                  highlight=False)
        if run.exit_code in (130, 143):  # Ctrl-C / SIGTERM: stop comparing, report what ran
            break
    rows = rows_from_runs(runs, several)
    result = {"schema": 3, "compare_dir": str(root), "workload": opts.launch.workload.workload or "cnn",
              "steps": opts.launch.workload.steps, "repeats": opts.repeats, "executions": list(opts.executions),
              "rows": rows, "execution_speedups": execution_speedups(rows),
              "execution_speedup_ranges": execution_ranges(rows), "inputs": list(opts.inputs),
              "service_speedups": service_speedups(rows)}
    unwritten = None
    try:
        write_whole(root / "compare.json", json.dumps(result, indent=1) + "\n")
    except OSError as exc:  # (a full disk: said after the table, which is shown all the same)
        unwritten = write_failure(root / "compare.json", exc)
    if opts.json_out:
        out.print_json(data=result)
    else:
        render_compare(rows, result["execution_speedups"], out, result["execution_speedup_ranges"], opts.repeats)
        for strategy, by_mode in result["service_speedups"].items():
            for mode, figures in by_mode.items():
                out.print(service_line(strategy, mode, figures), highlight=False)
        out.print(f"compare.json and the run directories: {root}", highlight=False)
    if opts.plot:
        plot(rows, opts.plot)
        err.print(f"wrote {opts.plot}", highlight=False)
    if unwritten:
        err.print(Text.assemble(("error:", "red"), f" {unwritten}"), highlight=False)
    return 0 if all(r["error"] is None for r in rows) and not unwritten else 1


def render_compare(rows: Sequence[dict], speedups: dict[str, dict[str, float]], console: Console,
                   ranges: dict[str, dict[str, list]] | None = None, repeats: int = 1) -> None:
    table = Table(title="ddlctl compare", title_justify="left")
    for column in ("strategy", "workers", "samples/s (median)", "spread", "step ms p50 / p95", "speedup",
                   "efficiency", "GPU util %", "input %", "loss", "accuracy"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for r in rows:
        if r["error"]:
            table.add_row(r["label"], fmt(r["workers"], "d"), Text("failed (below)", style="red"), *[""] * 8)
            continue
        spread = f"{fmt(r['throughput_min'], ',.0f')}–{fmt(r['throughput_max'], ',.0f')}" \
            if len(r["throughput_runs"]) > 1 else "-"
        p50, p95 = r["step_time_p50_s"], r["step_time_p95_s"]
        times = f"{fmt(p50 and p50 * 1e3, '.1f')} / {fmt(p95 and p95 * 1e3, '.1f')}"
        speedup = fmt(r["speedup_vs_one_device"], ".2f") + ("x" if r["speedup_vs_one_device"] else "")
        if r.get("speedup_range"):
            low, high, noise = r["speedup_range"]
            speedup += f" ({low:.2f}-{high:.2f}{', noise' if noise else ''})"
        table.add_row(r["label"], fmt(r["workers"], "d"), fmt(r["throughput_samples_per_s"], ",.0f"), spread,
                      times, speedup,
                      fmt(r["scaling_efficiency"], ".0%"), fmt(r["gpu_util_mean"], ".0f"),
                      fmt(r["input_fraction"] and r["input_fraction"] * 100, ".0f"),
                      fmt(r["loss"], ".4f"), fmt(r["accuracy"], ".4f"))
    console.print(table)
    for r in rows:
        if r["error"]:
            console.print(Text.assemble((f"✗ {r['label']}:", "red"), f" {r['error']}"), highlight=False,
                          soft_wrap=True)
    if not any(r["strategy"] == BASELINE for r in rows):
        console.print(f"speedup and efficiency need {BASELINE} in --strategies")
    best = max((r["throughput_samples_per_s"] or 0 for r in rows), default=0)
    if best:
        console.print("throughput (samples/s)")
        width = max(len(r["label"]) for r in rows)
        for r in rows:
            value = r["throughput_samples_per_s"] or 0
            bar = "█" * round(40 * value / best)
            console.print(f"  {r['label']:<{width}} {bar} {value:,.0f}" if value else
                          f"  {r['label']:<{width}} (failed)", highlight=False)
    linear_input = {r["strategy"]: r.get("input_fraction") for r in rows if r["execution"] == "linear"}
    accuracies = {(r["strategy"], r["execution"]): r.get("accuracy_by_repeat") or [] for r in rows}
    for strategy, ratios in speedups.items():
        accuracy = accuracy_note(accuracies.get((strategy, "pipelined"), []), accuracies.get((strategy, "linear"), []))
        console.print(verdict(strategy, ratios, (ranges or {}).get(strategy, {}), repeats,
                              linear_input.get(strategy), accuracy), highlight=False)
    for r in rows:
        if r.get("bound"):
            console.print(f"{r['label']}: {r['bound']}", highlight=False)
    asynchronous = [r for r in rows if r.get("steps_in_flight") and r["steps_in_flight"] > 1.05]
    for r in asynchronous:
        console.print(f"{r['label']}: {r['steps_in_flight']:.2f} steps in flight on average (asynchronous "
                      "training: each step's gradients are computed on variables that many steps old, which "
                      "costs accuracy per step)", highlight=False)


def plot(rows: Sequence[dict], path: str) -> None:
    """The throughput bar chart as a picture (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    values = [r["throughput_samples_per_s"] or 0 for r in rows]
    errors = [[v - (r["throughput_min"] or v) for v, r in zip(values, rows, strict=True)],
              [(r["throughput_max"] or v) - v for v, r in zip(values, rows, strict=True)]]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    ax.bar(labels, values, yerr=errors, capsize=4, color="#4c72b0")
    ax.set_ylabel("samples/s (median of repeats)")
    ax.set_title("ddlctl compare: throughput by strategy")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
