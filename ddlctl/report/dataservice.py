"""The report's tf.data service section (``--data-workers N``, hosts with ``roles=data``): per data
worker its CPU and restarts, per trainer the share of each step it waited for input and what it
read, and whether more data workers would help (pure functions of a run's plan, outcome and
figures).

Whether more would help: a trainer input-bound (:data:`~.diagnosis.INPUT_BOUND_FRACTION` of each
step waiting) with the data workers' hosts busy (:data:`HOST_BUSY` % CPU) needs more data hosts;
with data workers that each keep a core busy on hosts with CPU to spare, more data workers there
(``slots=``); with neither, the data workers are not the bound: the batches' way to the trainers
is (the network, or the trainer's own CPU taking them in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A data host this busy (mean CPU %) has no CPU left for more data workers.
HOST_BUSY = 85.0
#: A data worker using this much of a core (mean CPU %) keeps its pipeline busy.
WORKER_BUSY = 80.0


def data_service_section(plan: Mapping, outcome: Mapping, procs: Mapping[str, Sequence], tasks: Sequence[Any],
                         hosts: Sequence[Any], input_bound: float) -> dict | None:
    """``summary.json``'s ``data_service`` (None: no data service in the run). ``procs``: task ->
    its telemetry columns (CPU % first); ``tasks``/``hosts``: the summary's rows."""
    planned = [t for t in plan.get("tasks", []) if t.get("role") in ("dispatcher", "data")]
    if not planned:
        return None
    restarts = {str(t.get("name")): t.get("restarts", 0) for t in outcome.get("tasks", []) if isinstance(t, dict)}

    def cpu(name: str) -> float | None:
        column = procs.get(name, ((),))[0]
        return round(float(sum(column)) / len(column), 1) if len(column) else None

    workers = [{"task": t["name"], "host": t.get("host"), "cpu_mean": cpu(t["name"]),
                "restarts": restarts.get(t["name"], 0)} for t in planned]
    trainers = [{"task": t.name, "host": t.host, "input_fraction": t.input_fraction, "samples_per_s": t.samples_per_s}
                for t in tasks]
    data_hosts = {w["host"] for w in workers if w["task"].startswith("data:")}
    busy = {h.host: h.cpu_util_mean for h in hosts if h.host in data_hosts and h.cpu_util_mean is not None}
    return {"workers": workers, "trainers": trainers, "data_hosts_cpu": busy,
            "advice": advice(workers, trainers, busy, input_bound)}


def advice(workers: Sequence[Mapping], trainers: Sequence[Mapping], hosts_cpu: Mapping[str, float],
           input_bound: float) -> str | None:
    """Whether more data workers would help (None: the trainers do not wait for input)."""
    hungry = [t for t in trainers if (t.get("input_fraction") or 0.0) > input_bound]
    if not hungry:
        return None
    data = [w for w in workers if str(w["task"]).startswith("data:")]
    waits = ", ".join(f"{t['task']} {t['input_fraction']:.0%}" for t in hungry)
    if hosts_cpu and min(hosts_cpu.values()) >= HOST_BUSY:
        used = ", ".join(f"{h} {c:.0f}%" for h, c in sorted(hosts_cpu.items()))
        return (f"the trainers wait for input ({waits} of each step) and the data hosts are busy (CPU {used}): more "
                "data hosts (roles=data) would help")
    cores = [w["cpu_mean"] for w in data if w.get("cpu_mean") is not None]
    if cores and min(cores) >= WORKER_BUSY:
        return (f"the trainers wait for input ({waits} of each step) and each of the {len(data)} data worker(s) keeps "
                f"{min(cores) / 100:.1f}-{max(cores) / 100:.1f} cores busy, with CPU to spare on their hosts: more "
                "data workers (--data-workers N, or slots= on the data hosts) would help")
    return (f"the trainers wait for input ({waits} of each step) but the data workers are not busy"
            + (f" ({min(cores) / 100:.1f}-{max(cores) / 100:.1f} cores each)" if cores else "")
            + ": more would not help; the batches' way to the trainers is the bound (the network, or the trainers' "
              "own CPU taking them in)")


def service_rows(section: Mapping) -> list[tuple[str, str, str, str]]:
    """The section's table rows: (task, host, CPU cores or input share, restarts or samples/s)."""
    rows = []
    for w in section.get("workers", []):
        cores = "-" if w.get("cpu_mean") is None else f"{w['cpu_mean'] / 100:.2f} cores"
        rows.append((str(w["task"]), str(w.get("host") or "-"), cores, f"{w.get('restarts', 0)} restart(s)"))
    for t in section.get("trainers", []):
        share = "-" if t.get("input_fraction") is None else f"waits {t['input_fraction']:.0%} for input"
        rate = "-" if t.get("samples_per_s") is None else f"{t['samples_per_s']:,.0f} samples/s"
        rows.append((str(t["task"]), str(t.get("host") or "-"), share, rate))
    return rows


def render_data_service(section: Mapping | None, console) -> None:  # noqa: ANN001 - a rich Console
    """The section as a table, and its advice."""
    if not section:
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title="tf.data service (data workers, and the trainers they feed)", title_justify="left")
    for column in ("task", "host", "CPU / input wait", "restarts / read"):
        table.add_column(column, justify="left" if column in ("task", "host") else "right")
    for row in service_rows(section):
        table.add_row(*row)
    console.print(table)
    if section.get("advice"):
        console.print(Text(f"  {section['advice']}", style="dim"), soft_wrap=True)
