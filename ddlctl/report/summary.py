"""The end-of-run summary, computed from the run directory alone.

Throughput is total post-warm-up samples over the post-warm-up time window (first kept step's
start to last step's end, over all tasks), never a mean of per-step rates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ddlctl.rundir import task_dirs

DEFAULT_WARMUP_STEPS = 5


@dataclass(frozen=True)
class StepRecord:
    task: str
    step: int
    start_us: int
    duration_s: float
    samples: int

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_s * 1e6


@dataclass(frozen=True)
class TaskSummary:
    name: str
    steps: int
    kept_steps: int
    samples_per_s: float | None
    loss: float | None
    accuracy: float | None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    strategy: str
    warmup_steps: int
    tasks: tuple[TaskSummary, ...]
    total_steps: int
    throughput_samples_per_s: float | None
    skipped_lines: int


def read_steps(path: Path) -> tuple[list[StepRecord], int]:
    """Step records of one file and the number of lines that could not be read."""
    records: list[StepRecord] = []
    bad = 0
    if not path.is_file():
        return records, bad
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                raw = json.loads(line)
                records.append(StepRecord(str(raw["task"]), int(raw["step"]), int(raw["start_us"]),
                                          float(raw["duration_s"]), int(raw["samples"])))
            except (ValueError, KeyError, TypeError):
                bad += 1  # e.g. the last line of a task killed mid-write
    return records, bad


def _window_rate(records: list[StepRecord]) -> float | None:
    if not records:
        return None
    start = min(r.start_us for r in records)
    end = max(r.end_us for r in records)
    span = (end - start) / 1e6
    return sum(r.samples for r in records) / span if span > 0 else None


def summarize(run_dir: str | Path, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> RunSummary:
    """Summary of the run in ``run_dir`` (steps.jsonl and result.json of every task)."""
    run_dir = Path(run_dir)
    plan = json.loads((run_dir / "plan.json").read_text()) if (run_dir / "plan.json").is_file() else {}
    kept_all: list[StepRecord] = []
    tasks: list[TaskSummary] = []
    skipped = 0
    total = 0
    for folder in task_dirs(run_dir):
        records, bad = read_steps(folder / "steps.jsonl")
        skipped += bad
        result_path = folder / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
        if not records and not result:
            continue
        records.sort(key=lambda r: r.step)
        kept = records[warmup_steps:] if len(records) > warmup_steps else records
        kept_all.extend(kept)
        total += len(records)
        name = records[0].task if records else str(result.get("task", folder.name))
        tasks.append(TaskSummary(name=name, steps=len(records), kept_steps=len(kept),
                                 samples_per_s=_window_rate(kept), loss=result.get("loss"),
                                 accuracy=result.get("accuracy")))
    return RunSummary(run_id=str(plan.get("run_id", run_dir.name)),
                      strategy=str(plan.get("strategy", "?")), warmup_steps=warmup_steps,
                      tasks=tuple(tasks), total_steps=total,
                      throughput_samples_per_s=_window_rate(kept_all), skipped_lines=skipped)
