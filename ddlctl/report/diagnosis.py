"""The summary's diagnosis lines: what stands out in a run (input-bound, idle GPUs, stragglers, a
saturated CPU, memory nearly full...), from its figures."""

from __future__ import annotations

from typing import Any

from ddlctl.contract.grouping import figure_range, named, task_range
from ddlctl.report.attempts import attempts_line
from ddlctl.report.balance import balance_note
from ddlctl.report.faults import event_lines
from ddlctl.report.hosts import MIN_WINDOW_SAMPLES

INPUT_BOUND_FRACTION = 0.30
GPU_IDLE_UTIL = 50.0
CPU_SATURATED = 90.0
#: How a CPU or GPU figure over the whole run (steps too short to sample) is told apart from one over the steps.
WHOLE_RUN = "over the whole run, start-up included (its steps took too little time to be sampled)"
#: Share of a host's memory in use, at its peak, above which the report warns of the OOM killer.
MEMORY_NEARLY_FULL = 0.9
#: A task whose CPU time is this much the kernel's (and that used at least KERNEL_HEAVY_MIN_CPU % of a
#: CPU): page faults of memory freed and taken again at every step, or system calls. Training on CPU
#: with glibc's default malloc: 30-47% (benchmarks/malloc_pad.py); with ddlctl's MALLOC_TOP_PAD_ 11-13%.
KERNEL_HEAVY_SHARE = 0.25
KERNEL_HEAVY_MIN_CPU = 20.0



def diagnosis_lines(summary: Any, outcome: dict, run_end: float | None = None) -> tuple[str, ...]:
    """The few lines a person can act on, of a ``RunSummary`` (``run_end``: when the last step ended)."""
    lines = []
    if not summary.total_steps and summary.tasks_count:
        failed = outcome.get("failure")
        lines.append("no task recorded a step; see outcome.json" + (f" ({failed})" if failed else "")
                     + " and tasks/*/output.log (a program of your own records steps with ddlctl.step, "
                       "or with model.fit through --auto-steps)")
    # what holds for many tasks or hosts is one line naming them all, with the range of figures
    input_bound = [t for t in summary.tasks if t.input_fraction is not None and t.input_fraction > INPUT_BOUND_FRACTION]
    for task in summary.tasks:
        if task.straggler:
            lines.append(f"straggler: {task.name} on {task.host}: {task.straggler_reason}")
    for capture in (getattr(summary, "traces", None) or {}).get("captures") or []:
        if capture.get("why") and capture.get("comparison"):  # (--trace auto: what its capture shows)
            lines.append(f"profiler capture {capture['session']} (trace auto): {capture['comparison']}")
    short = [t for t in summary.tasks if t.state == "succeeded" and t.total_steps_declared and t.last_step is not None
             and t.last_step < t.total_steps_declared]
    if short:  # a success that trained less than it meant to (model.fit whose input ran out, a loop cut short)
        alike: dict[tuple[int, int], list[str]] = {}
        for t in short:
            alike.setdefault((int(t.last_step or 0), int(t.total_steps_declared or 0)), []).append(t.name)
        who = "; ".join(f"{task_range(names)} after {last} of {total} steps" for (last, total), names in alike.items())
        lines.append(f"ended before the last step declared, with exit code 0: {who} (an early-stopping callback; or, "
                     "in model.fit, input that ran out before epochs x steps_per_epoch batches: Keras then says "
                     "'Your input ran out of data': repeat() the dataset, or ask for fewer steps)")
    if input_bound:
        where = named(sorted({str(t.host) for t in input_bound}), "hosts")
        who = f"{task_range(t.name for t in input_bound)} spend" if len(input_bound) > 1 else \
            f"{input_bound[0].name} spends"
        service = getattr(summary, "data_service", None) or {}
        if service.get("advice"):  # (through the tf.data service: whether more data workers would help)
            lines.append(f"input-bound through the tf.data service: {service['advice']}")
        else:
            lines.append(f"input-bound on {where}: {who} {figure_range([100 * t.input_fraction for t in input_bound])}"
                         " of each step waiting for input (parallel map, prefetch, more CPU for the input pipeline; "
                         "or the tf.data service making it on other CPUs: --data-workers N, or hosts with roles=data)")
    # (a mean of fewer than MIN_WINDOW_SAMPLES samples, a run of a second or two, is no finding)
    idle_gpus = [(host.host, gpu) for host in summary.hosts for gpu in host.gpus if host.samples >= MIN_WINDOW_SAMPLES
                 and gpu.util_mean is not None and gpu.util_mean < GPU_IDLE_UTIL]
    if idle_gpus:
        busy = [gpu.util_mean for _, gpu in idle_gpus]
        which = f"GPU {idle_gpus[0][1].index} on {idle_gpus[0][0]}" if len(idle_gpus) == 1 else \
            f"{len(idle_gpus)} GPUs ({', '.join(f'{h} GPU {g.index}' for h, g in idle_gpus)})"
        whole = any(host.whole_run for host in summary.hosts if host.host in {h for h, _ in idle_gpus})
        lines.append(f"{which} mostly idle: busy {figure_range(busy)} of the time "
                     f"(idle {figure_range([100 - b for b in busy])})" + (f" {WHOLE_RUN}" if whole else ""))
    # the tasks that record steps, and ps workers (which compute under ps, and record none)
    figures = [(t.name, t.cpu_mean, t.kernel_cpu_mean) for t in summary.tasks] + \
        [(w.task, w.cpu_mean, w.kernel_cpu_mean) for w in summary.work]
    heavy = [(name, cpu, kernel) for name, cpu, kernel in figures if cpu is not None and kernel is not None
             and cpu >= KERNEL_HEAVY_MIN_CPU and kernel > KERNEL_HEAVY_SHARE * cpu]
    if heavy:
        who = f"{task_range(n for n, _, _ in heavy)} spend" if len(heavy) > 1 else f"{heavy[0][0]} spends"
        lines.append(f"kernel-heavy: {who} {figure_range([100 * k / c for _, c, k in heavy])} "
                     f"of {'their' if len(heavy) > 1 else 'its'} CPU time in the kernel (page faults of memory "
                     "freed and allocated again each step, or system calls: `perf top -p PID` or "
                     "`strace -c -f -p PID` says which; ddlctl gives tasks MALLOC_TOP_PAD_ unless their "
                     "environment sets a malloc threshold of its own)")
    saturated = [h for h in summary.hosts if h.samples >= MIN_WINDOW_SAMPLES
                 and h.cpu_util_mean is not None and h.cpu_util_mean > CPU_SATURATED]
    if saturated:
        # with no step recorded (or steps too short to sample) the mean covers start-up: no cause to guess
        why = "over the whole run (no step recorded to tell its start-up from its work)" if not summary.total_steps \
            else WHOLE_RUN if any(h.whole_run for h in saturated) \
            else "(input pipeline, or too many tasks for its cores)"
        lines.append(f"CPU saturated on {named([h.host for h in saturated], 'hosts')}: mean "
                     f"{figure_range([h.cpu_util_mean for h in saturated])} {why}")
    full = [h for h in summary.hosts if h.mem_peak_bytes and h.mem_total_bytes
            and h.mem_peak_bytes > MEMORY_NEARLY_FULL * h.mem_total_bytes]
    if full:
        lines.append(f"memory nearly full on {named([h.host for h in full], 'hosts')}: peak "
                     f"{figure_range([100 * h.mem_peak_bytes / h.mem_total_bytes for h in full])} of "  # type: ignore[operator]
                     f"{'their' if len(full) > 1 else 'its'} memory (the kernel's OOM killer ends a task when it is "
                     "full: a smaller batch, fewer tasks on the host)")
    for host in summary.hosts:
        for gpu in host.gpus:
            lines.extend(gpu.diagnosis)  # kernels too small, power/thermal capped, memory nearly full
        for start, end in host.gaps:
            lines.append(f"telemetry gap on {host.host}: no samples for {end - start:.1f}s")
    for gap in outcome.get("telemetry_gaps", []):
        lines.append(gap)
    if summary.attempts:  # (a Slurm job requeued: the run's attempts, and the whole run's time)
        lines.append(attempts_line(summary.attempts))
    lines.extend(event_lines(outcome, summary.degraded, summary.hosts_lost, summary.membership, run_end,
                             summary.strategy))
    note = balance_note(summary.balance)
    if note:
        lines.append(note)
    return tuple(lines)
