"""The run summary: a pure function of the run directory (``ddlctl report`` on a copied run
directory gives the same answer as the live run).

Inputs: ``plan.json``, ``outcome.json``, ``tasks/*/steps.jsonl``, ``tasks/*/result.json``,
``telemetry/*.jsonl``. Output: :class:`RunSummary`, whose :meth:`RunSummary.to_dict` is
``summary.json`` (keys documented in docs/report.md, ``schema`` 1).

Rules, stated once:

* warm-up: the first ``warmup_steps`` records of each task are left out of every statistic;
* percentiles: linear interpolation between closest ranks (numpy's default);
* throughput: post-warm-up samples of all tasks / the post-warm-up time window (first kept start to
  last kept end over all tasks) -- never a mean of per-step rates;
* straggler: a task whose median step time is > 1.10 x the fleet median (median of the tasks'
  medians), or, in synchronous training where step times are coupled, whose median *arrival* at
  the synchronisation point (step start + ``sync_s``: gradients ready) is later than the earliest
  task's by more than 10% of the fleet median step time;
* telemetry gap: no sample from a host for more than 3 sampling intervals while the run went on.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ddlctl.contract.causes import hang_records, loss_times, stall_of, time_by_cause
from ddlctl.contract.rundir import (
    OUTCOME_FILE,
    PLAN_FILE,
    TASK_PHASES,
    TASK_RESULT,
    TASK_STEPS,
    TASKS_DIR,
)
from ddlctl.contract.runfolder import load_record, task_dirs
from ddlctl.contract.stats import mean, median_of, percentile
from ddlctl.contract.strategies import TABLE, facts_of, strategy
from ddlctl.report.arrivals import arrival_lateness, straggler_wait_of
from ddlctl.report.attempts import attempts_section
from ddlctl.report.balance import NOT_BALANCED, WorkerSteps, balance_section
from ddlctl.report.clocks import clock_offsets, shift_phases, shift_series, shift_steps
from ddlctl.report.dataservice import data_service_section
from ddlctl.report.diagnosis import INPUT_BOUND_FRACTION, diagnosis_lines
from ddlctl.report.faults import RestartSummary, goodput, redone_mask, summarize_restarts
from ddlctl.report.hosts import HostSeries, HostSummary, host_summary, read_telemetry
from ddlctl.report.membership import membership_phases
from ddlctl.report.mfu import mfu_rows
from ddlctl.report.nocuda import run_no_cuda_line
from ddlctl.report.stages import stage_plan_of, stage_rows
from ddlctl.report.stepfile import TaskSteps, kept_records, last_end_us, read_phases, read_steps, since
from ddlctl.report.traces import traces_section
from ddlctl.supervise.results import task_exit_code

DEFAULT_WARMUP_STEPS = 5
STRAGGLER_RATIO = 1.10
LATE_ARRIVAL_FRACTION = 0.10


@dataclass(frozen=True)
class TaskSummary:
    name: str
    host: str | None
    role: str | None
    state: str | None
    exit_code: int | None
    steps: int
    kept_steps: int
    steps_per_record: int
    step_time_p50_s: float | None
    step_time_p90_s: float | None
    step_time_p95_s: float | None
    step_time_p99_s: float | None
    samples_per_s: float | None
    input_fraction: float | None
    arrival_lateness_p50_s: float | None
    straggler: bool
    straggler_reason: str | None
    loss: float | None
    accuracy: float | None
    cpu_mean: float | None = None
    kernel_cpu_mean: float | None = None  # of cpu_mean, the kernel's (system CPU time)
    rss_peak_bytes: int | None = None
    steps_in_flight_mean: float | None = None  # summed step time / span: > 1 when steps overlap (ps)
    total_steps_declared: int | None = None
    last_step: int | None = None  # the highest step it recorded (of a block: its last)


@dataclass(frozen=True)
class WorkerWork:
    """What one ps worker did: the steps it ran (attributed by the coordinator's records), their
    share of the job, and how long it was busy running them; ``steps`` is None when the program's
    closures do not say which worker ran them (then only CPU is known)."""

    task: str
    host: str | None
    steps: int | None
    share: float | None
    busy_s: float | None
    busy_fraction: float | None  # busy_s / the job's training window
    cpu_mean: float | None
    kernel_cpu_mean: float | None = None  # of cpu_mean, the kernel's


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    strategy: str
    wall_time_s: float | None
    warmup_steps: int
    hosts_count: int
    gpus_count: int
    tasks_count: int
    global_batch: int | None
    throughput_samples_per_s: float | None
    throughput_steps_per_s: float | None
    total_steps: int
    skipped_lines: int
    tasks: tuple[TaskSummary, ...]
    hosts: tuple[HostSummary, ...]
    diagnosis: tuple[str, ...]
    restarts: tuple[RestartSummary, ...] = ()
    goodput: float | None = None
    steps_lost: int = 0
    degraded: tuple[dict, ...] = ()
    hosts_lost: tuple[dict, ...] = ()
    work: tuple[WorkerWork, ...] = ()
    work_note: str | None = None
    stages: tuple[dict, ...] = ()  # model strategy: per stage task, its layers and CPU
    balance: dict | None = None  # mwms: per-worker speed, share, compute and wait; predictions
    stage_plan: dict | None = None  # model strategy: the plan, its predicted and measured step time
    hangs: tuple[dict, ...] = ()  # each hang handled: culprit, why, threshold and rule, where each task stood
    time_by_cause: dict | None = None  # the job's wall time by cause (ddlctl.contract.causes)
    mfu: tuple[dict, ...] = ()  # per task with flops.json: model FLOPs per sample, achieved FLOP/s, MFU
    membership: tuple[dict, ...] = ()  # each change of the job's workers (--min-workers): who left, why, who trained on
    membership_phases: tuple[dict, ...] = ()  # per set of workers: when, why, steps, samples/s while training
    left_running: tuple[dict, ...] = ()  # tasks SIGKILL could not end (state D): task, host, pid, where
    unread_bytes: int = 0  # the starts of record files past RECORDS_READ_MAX each, not read
    traces: dict | None = None  # --trace: the profiler captures split by part (ddlctl.report.traces)
    data_service: dict | None = None  # the tf.data service: data workers, trainers' input wait, advice
    attempts: dict | None = None  # submit --requeue: each attempt of the run, and the whole run's time

    def to_dict(self) -> dict[str, object]:
        """``summary.json`` (``schema`` 14: 13 plus ``attempts``; docs/report.md lists its keys)."""
        data = {"schema": 14, **asdict(self)}
        for host in data["hosts"]:
            host["gaps"] = [{"start": a, "end": b} for a, b in host["gaps"]]
        return data


# -- telemetry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """A task's kept records: their time span (µs), sample and record counts."""

    first_us: float
    last_us: float
    samples: int
    records: int
    samples_known: bool


def _window(steps: TaskSteps, kept: slice) -> _Window | None:
    starts = np.asarray(steps.start_us)[kept]
    if not starts.size:
        return None
    counts = np.asarray(steps.samples)[kept]
    return _Window(int(starts.min()), _last_end_us(starts, np.asarray(steps.duration)[kept]), int(counts.sum()),
                   len(starts), bool(counts.min() >= 0))


def _last_end_us(starts: np.ndarray, durations: np.ndarray) -> float:
    """:func:`last_end_us` over columns (the same float operations, in C)."""
    return float((starts + durations * 1e6).max())


def _rates(windows: Sequence[_Window | None]) -> tuple[float | None, float | None]:
    """(samples/s, records/s) over the union time window of the given windows."""
    present = [w for w in windows if w is not None]
    if not present:
        return None, None
    span = (max(w.last_us for w in present) - min(w.first_us for w in present)) / 1e6
    if span <= 0:
        return None, None
    known = all(w.samples_known for w in present)
    return (sum(w.samples for w in present) / span if known else None), sum(w.records for w in present) / span


PARALLEL_BYTES = 32 * 2**20


def _read_task(folder: Path) -> TaskSteps:
    return read_steps(folder / TASK_STEPS, folder.name.replace("-", ":", 1))


def _parse_all(folders: list[Path], telemetry_files: list[Path]) -> tuple[list[TaskSteps], list[HostSeries]]:
    """Parse every steps and telemetry file; in worker processes when there is a lot to parse
    (JSON decoding is the cost: spread it over the cores)."""
    files = [f / TASK_STEPS for f in folders] + telemetry_files
    size = sum(p.stat().st_size for p in files if p.is_file())
    workers = min(os.cpu_count() or 1, 8)
    if size < PARALLEL_BYTES or workers < 2:
        return [_read_task(f) for f in folders], [read_telemetry(p) for p in telemetry_files]
    context = multiprocessing.get_context("fork") if hasattr(os, "fork") else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        telemetry = pool.map(read_telemetry, telemetry_files)
        steps = pool.map(_read_task, folders, chunksize=max(1, len(folders) // (4 * workers)))
        return list(steps), list(telemetry)


def summarize(run_dir: str | Path, warmup_steps: int = DEFAULT_WARMUP_STEPS, outcome: dict | None = None) -> RunSummary:
    """Summary of the run in ``run_dir`` (``outcome``: its outcome.json record, when the caller has
    it and the disk may not). Python's cycle collector is paused meanwhile: the records
    and columns hold no cycles, and its passes over millions of new objects were 40 % of a
    1,000,000-step report (benchmarks/report_scale.py)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _summarize(Path(run_dir), warmup_steps, outcome)
    finally:
        if paused:
            gc.enable()


def _summarize(run_dir: Path, warmup_steps: int, outcome: dict | None = None) -> RunSummary:
    plan = load_record(run_dir / PLAN_FILE)
    outcome = outcome if outcome is not None else load_record(run_dir / OUTCOME_FILE)
    planned = {t["name"]: t for t in plan.get("tasks", [])}
    ended = {t["name"]: t for t in outcome.get("tasks", [])}

    folders = task_dirs(run_dir)
    telemetry_files = sorted((run_dir / "telemetry").glob("*.jsonl"))
    parsed_steps, telemetry = _parse_all(folders, telemetry_files)
    offsets = clock_offsets(outcome)  # hosts whose clocks differ: their times on this machine's
    for steps in parsed_steps:
        shift_steps(steps, offsets.get(planned.get(steps.name, {}).get("host", ""), 0.0))
        if outcome.get("attempts") and outcome.get("started_at"):  # (a node kept an earlier attempt's: not this one's)
            since(steps, outcome["started_at"] * 1e6)
    for series in telemetry:
        shift_series(series, offsets.get(series.host, 0.0))
    all_steps: list[TaskSteps] = []
    results: dict[str, dict] = {}
    for folder, steps in zip(folders, parsed_steps, strict=True):
        result = load_record(folder / TASK_RESULT)
        if steps.step or result:
            all_steps.append(steps)
            results[steps.name] = result

    synchronous = not facts_of(plan.get("strategy")).asynchronous
    kept_of = {s.name: kept_records(s, warmup_steps) for s in all_steps}
    sorted_durations = {s.name: np.sort(np.asarray(s.duration)[kept_of[s.name]]) for s in all_steps}
    windows = {s.name: _window(s, kept_of[s.name]) for s in all_steps}
    medians = {name: percentile(d, 50) or 0.0 for name, d in sorted_durations.items() if len(d)}
    fleet = median_of(medians.values())
    lateness = arrival_lateness(all_steps, warmup_steps) if synchronous else {}
    procs = {task: figures for series in telemetry for task, figures in series.procs.items()}

    tasks = []
    for steps in all_steps:
        kept = kept_of[steps.name]
        durations = sorted_durations[steps.name]
        rate, _ = _rates([windows[steps.name]])
        reason = None
        median = medians.get(steps.name)
        if fleet and median is not None and len(medians) > 1 and median > STRAGGLER_RATIO * fleet:
            reason = f"median step {median * 1e3:.1f} ms vs fleet median {fleet * 1e3:.1f} ms"
        late = lateness.get(steps.name)
        if fleet and late is not None and late > LATE_ARRIVAL_FRACTION * fleet:
            reason = f"arrives {late * 1e3:.1f} ms after the first task at each synchronisation " \
                     f"(fleet median step {fleet * 1e3:.1f} ms)"
        inputs = np.asarray(steps.input_s)[kept]
        inputs = inputs[inputs >= 0]
        busy = float(np.asarray(steps.duration)[kept].sum())
        input_fraction = float(inputs.sum()) / busy if inputs.size and busy else None
        info = planned.get(steps.name, {})
        end = ended.get(steps.name, {})
        cpu, rss, kernel = procs.get(steps.name, ((), (), ()))
        tasks.append(TaskSummary(
            name=steps.name, host=info.get("host"), role=info.get("role"), state=end.get("state"),
            exit_code=task_exit_code(end),
            steps=len(steps.step), kept_steps=len(durations), steps_per_record=steps.block,
            step_time_p50_s=percentile(durations, 50), step_time_p90_s=percentile(durations, 90),
            step_time_p95_s=percentile(durations, 95), step_time_p99_s=percentile(durations, 99),
            samples_per_s=rate, input_fraction=input_fraction,
            arrival_lateness_p50_s=late, straggler=reason is not None, straggler_reason=reason,
            loss=results.get(steps.name, {}).get("loss"), accuracy=results.get(steps.name, {}).get("accuracy"),
            cpu_mean=mean(cpu), kernel_cpu_mean=mean(kernel),
            rss_peak_bytes=int(max(rss)) if len(rss) else None,
            steps_in_flight_mean=_in_flight(steps, kept), total_steps_declared=steps.total,
            last_step=max(steps.step) + steps.block - 1 if len(steps.step) else None))

    throughput, record_rate = _rates(list(windows.values()))
    step_rate = None
    if record_rate is not None and all_steps:
        # synchronous tasks record the same steps: count a global step once
        per_step_records = len(all_steps) if synchronous else 1
        step_rate = record_rate * max(s.block for s in all_steps) / per_step_records

    starts = [np.asarray(s.start_us).min() / 1e6 for s in all_steps if s.start_us]
    ends = [(w.last_us if (w := windows[s.name]) is not None else
             _last_end_us(np.asarray(s.start_us), np.asarray(s.duration))) / 1e6 for s in all_steps if s.start_us]
    run_start = float(min(starts)) if starts else None
    run_end = float(max(ends)) if ends else None
    hosts = tuple(host_summary(series, run_start, run_end) for series in telemetry)

    wall = outcome.get("wall_time_s")
    if wall is None and run_start is not None and run_end is not None:
        wall = run_end - run_start
    request = plan.get("request", {})
    batch = request.get("global_batch")
    used_hosts = {t.get("host") for t in planned.values()}
    gpus_count = sum(len(h.gpus) for h in hosts) or sum(
        h.get("gpus", 0) for h in plan.get("cluster", {}).get("hosts", [])
        if h.get("name") in {u.split("@")[-1].split(":")[0] for u in used_hosts if u})

    lead = _lead(all_steps, plan.get("strategy"))
    work, work_note = _worker_work(plan, lead, procs)
    chief = next((t for t in tasks if t.name == "chief:0"), None)
    chief_step_s = chief.step_time_p50_s if chief else None
    stages, stage_plan = (), None
    if facts_of(plan.get("strategy")).stages:  # what the chief recorded of its stages
        recorded_stages = load_record(run_dir / "tasks" / "chief-0" / "stages.json")
        stages = stage_rows(recorded_stages, procs, chief_step_s)
        stage_plan = stage_plan_of(recorded_stages, chief_step_s)
    split = plan.get("strategy") in TABLE and strategy(plan["strategy"]).batch_split
    balance = _balance(run_dir, plan, all_steps, kept_of) if split else None
    redone = redone_mask(lead.step) if lead is not None else []
    restarts = summarize_restarts(outcome.get("restarts", []), lead.step if lead else [],
                                  lead.start_us if lead else [],
                                  {s.name: s.start_us for s in all_steps if s.step})
    summary = RunSummary(
        run_id=str(plan.get("run_id", run_dir.name)), strategy=str(plan.get("strategy", "?")),
        wall_time_s=wall, warmup_steps=warmup_steps, hosts_count=len(used_hosts) or len(hosts),
        gpus_count=gpus_count, tasks_count=len(planned) or len(all_steps), global_batch=batch,
        throughput_samples_per_s=throughput, throughput_steps_per_s=step_rate,
        total_steps=sum(len(s.step) for s in all_steps),
        skipped_lines=sum(s.bad_lines for s in all_steps) + sum(t.bad_lines for t in telemetry),
        tasks=tuple(tasks), hosts=hosts, diagnosis=(), restarts=restarts,
        goodput=goodput(lead.start_us, lead.duration, redone) if lead is not None else None,
        steps_lost=sum(redone) * (lead.block if lead is not None else 1),
        degraded=tuple(outcome.get("degraded", [])), hosts_lost=tuple(outcome.get("hosts_lost", [])),
        work=work, work_note=work_note, stages=stages, balance=balance, stage_plan=stage_plan,
        hangs=tuple(outcome.get("hangs", [])),
        time_by_cause=_time_by_cause(run_dir, plan, outcome, lead, redone, restarts, all_steps, (run_start, run_end)),
        mfu=mfu_rows(run_dir, plan, tasks, hosts), membership=tuple(outcome.get("membership", [])),
        left_running=tuple(outcome.get("left_running", [])),
        unread_bytes=sum(s.unread_bytes for s in all_steps) + sum(t.unread_bytes for t in telemetry),
        traces=traces_section(run_dir, plan, outcome),
        data_service=data_service_section(plan, outcome, procs, tasks, hosts, INPUT_BOUND_FRACTION),
        membership_phases=membership_phases(outcome.get("membership", []), [
            t.get("name") for t in plan.get("tasks", []) if t.get("role") == "worker"], all_steps, run_start, run_end))
    summary = replace(summary, attempts=attempts_section(run_dir, outcome))
    summary = _with_diagnosis(summary, outcome, run_end)
    no_cuda = run_no_cuda_line(run_dir, plan, {h.host: len(h.gpus) for h in hosts})
    return replace(summary, diagnosis=(no_cuda, *summary.diagnosis)) if no_cuda else summary


def _host_of(plan: dict, task: str) -> str:
    """The host label ``plan.json`` gives ``task`` ("" when it names none)."""
    return next((str(t.get("host", "")) for t in plan.get("tasks", []) if t.get("name") == task), "")


def _time_by_cause(run_dir: Path, plan: dict, outcome: dict, lead: TaskSteps | None, redone: Sequence[bool],
                   restarts: Sequence[RestartSummary], all_steps: Sequence[TaskSteps],
                   stepped: tuple[float | None, float | None]) -> dict | None:
    """The job's wall time by cause, from ddlctl's start and end (``outcome.json``; the first and
    last step for runs recorded before ddlctl wrote them) and the lead task's records."""
    if lead is None:
        return None
    start, end = outcome.get("started_at") or stepped[0], outcome.get("ended_at") or stepped[1]
    if start is None or end is None or end <= start:
        return None
    spans = [(s / 1e6, s / 1e6 + d) for s, d in zip(lead.start_us, lead.duration, strict=True)]
    phases = shift_phases(read_phases(run_dir / TASKS_DIR / lead.name.replace(":", "-") / TASK_PHASES),
                          clock_offsets(outcome).get(_host_of(plan, lead.name), 0.0))
    downtime = [(r.time, r.time + r.downtime_s) for r in restarts if r.downtime_s is not None]
    since = loss_times(outcome.get("degraded", []))
    wait = None
    workers = [s for s in all_steps if s.name.startswith("worker:") and s.step]
    if plan.get("strategy") in TABLE and strategy(plan["strategy"]).batch_split and len(workers) > 1:
        wait = straggler_wait_of(lead, workers)
    stalls = [stall_of(found, idle, spans) for found, idle in hang_records(outcome.get("hangs", []))]
    result = time_by_cause((float(start), float(end)), [x for x, r in zip(spans, redone, strict=True) if not r],
                           [x for x, r in zip(spans, redone, strict=True) if r], phases, downtime, since, wait,
                           stalls)
    return {**result.to_dict(), "line": result.line()}


def _balance(run_dir: Path, plan: dict, all_steps: Sequence[TaskSteps], kept_of: Mapping[str, slice]) -> dict | None:
    """mwms: the balance section (:mod:`ddlctl.report.balance`) from the workers' kept records and
    the split they used (``balance.json`` of the built-in workload or ddlctl.task.balance)."""
    hosts = {t["name"]: t.get("host") for t in plan.get("tasks", [])}
    workers = sorted((s for s in all_steps if s.name.startswith("worker:") and s.step),
                     key=lambda s: int(s.name.split(":")[1]))
    rows = [WorkerSteps(s.name, hosts.get(s.name), np.asarray(s.start_us)[kept_of[s.name]],
                        np.asarray(s.sync_s)[kept_of[s.name]], np.asarray(s.samples)[kept_of[s.name]])
            for s in workers]
    recorded = load_record(run_dir / "tasks" / "worker-0" / "balance.json")
    source = recorded.get("source", "equal")
    split = "equal" if source == "equal" else f"speed ({source})"
    if source == "equal" and plan.get("request", {}).get("balance") == "speed":
        split = NOT_BALANCED
    return balance_section(rows, split, recorded.get("speeds") or ()) or (
        {"split": split, "workers": []} if split == NOT_BALANCED else None)


def _in_flight(steps: TaskSteps, kept: slice) -> float | None:
    """Mean number of this task's steps running at once over its kept records: the summed step
    time over the span. About 1 for a task that steps itself; under ps the coordinator's records
    overlap (closures run on several workers at once), and this is how stale gradients get."""
    starts, durations = np.asarray(steps.start_us)[kept], np.asarray(steps.duration)[kept]
    if len(starts) < 2:
        return None
    span = (_last_end_us(starts, durations) - starts.min()) / 1e6
    return float(durations.sum()) / span if span > 0 else None


def _worker_work(plan: dict, lead: TaskSteps | None, procs: dict) -> tuple[tuple[WorkerWork, ...], str | None]:
    """Under ps: per worker, steps run, share, busy time (from the coordinator's attributed
    records), and CPU; with a note when the records do not say who ran what."""
    if not facts_of(plan.get("strategy")).asynchronous:
        return (), None
    workers = [t for t in plan.get("tasks", []) if t.get("role") == "worker"]
    if not workers:
        return (), None
    cpu = {name: mean(figures[0]) for name, figures in procs.items()}
    kernel = {name: mean(figures[2]) for name, figures in procs.items()}
    if lead is None or not lead.worker:
        note = ("steps per worker are unknown: under ps the coordinator runs every step, and this program's "
                "closures do not say which worker ran them (ddlctl's built-in workload and model.fit do: see "
                "docs/report.md 'Work per worker'); CPU per worker is shown instead")
        return tuple(WorkerWork(w["name"], w.get("host"), None, None, None, None, cpu.get(w["name"]),
                                kernel.get(w["name"])) for w in workers), note
    counted: dict[str, int] = {}
    busy: dict[str, float] = {}
    for who, duration in zip(lead.worker, lead.duration, strict=True):
        if who:
            counted[who] = counted.get(who, 0) + lead.block
            busy[who] = busy.get(who, 0.0) + duration
    total = sum(counted.values())
    window = (last_end_us(lead.start_us, lead.duration) - min(lead.start_us)) / 1e6 if lead.start_us else 0.0
    rows = []
    for w in workers:
        name = w["name"]
        steps = counted.get(name, 0)
        rows.append(WorkerWork(name, w.get("host"), steps, steps / total if total else None,
                               busy.get(name, 0.0), busy.get(name, 0.0) / window if window > 0 else None,
                               cpu.get(name), kernel.get(name)))
    return tuple(rows), None


def _lead(all_steps: Sequence[TaskSteps], strategy: str | None) -> TaskSteps | None:
    """The task whose records stand for the job's progress: the ps chief, else the first worker."""
    named = {s.name: s for s in all_steps if s.step}
    for name in ("chief:0", "worker:0"):
        if name in named:
            return named[name]
    return max(named.values(), key=lambda s: len(s.step), default=None)


def _with_diagnosis(summary: RunSummary, outcome: dict, run_end: float | None = None) -> RunSummary:
    """``summary`` with the few lines a person can act on (``run_end``: when the last step ended)."""
    return dataclasses.replace(summary, diagnosis=diagnosis_lines(summary, outcome, run_end))
