"""``ddlctl report RUN_DIR``: the full report from a run directory alone."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from ddlctl.console import closed_stdout as stdoutgone
from ddlctl.console.safe import SafeConsole
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.rundir import PLAN_FILE
from ddlctl.report.export import write_csv
from ddlctl.report.render import render_report
from ddlctl.report.summary import summarize
from ddlctl.report.trace import write_trace


def report(run_dir: str, json_out: bool, csv_dir: str | None, trace: str | None, warmup_steps: int,
           console: Console) -> int:
    """Render (or print as JSON) the summary of ``run_dir``; optional CSV and trace files."""
    folder = Path(run_dir)
    if not (folder / PLAN_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no plan.json)",
                          "pass a folder like runs/<run-id>, or a run id of ./runs")
    summary = summarize(folder, warmup_steps=warmup_steps)
    if json_out:
        stdoutgone.write(json.dumps(summary.to_dict(), indent=1) + "\n")
    else:
        render_report(summary, console)
    err = SafeConsole(stderr=True, markup=False)
    if csv_dir:
        for path in write_csv(summary, csv_dir):
            err.print(f"wrote {path}", highlight=False)
    if trace:
        err.print(f"wrote {write_trace(folder, trace)}", highlight=False)
    return 0
