"""CSV export of a summary: tasks.csv, hosts.csv, gpus.csv (text cells through
:func:`~ddlctl.contract.shown.csv_cell`: a remote string is never a spreadsheet formula)."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from pathlib import Path

from ddlctl.contract.shown import csv_cell
from ddlctl.report.hosts import GpuSummary, HostSummary
from ddlctl.report.summary import RunSummary, TaskSummary


def write_csv(summary: RunSummary, folder: str | Path) -> list[Path]:
    """Write the three tables; the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []

    def table(name: str, columns: list[str], rows: list[dict]) -> None:
        path = folder / name
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
        written.append(path)

    table("tasks.csv", [f.name for f in fields(TaskSummary)], [asdict(t) for t in summary.tasks])
    host_columns = [f.name for f in fields(HostSummary) if f.name not in ("gpus", "gaps")]
    table("hosts.csv", [*host_columns, "gaps"],
          [{**{c: getattr(h, c) for c in host_columns}, "gaps": len(h.gaps)} for h in summary.hosts])
    table("gpus.csv", ["host", *[f.name for f in fields(GpuSummary)]],
          [{"host": h.host, **asdict(g)} for h in summary.hosts for g in h.gpus])
    return written
