"""A run that lived across several starts (Slurm's requeues, ``launch --resume``): each attempt's
span, what ended it, the steps it trained and how many it trained again, the time the run waited
between attempts (Slurm's queue and its hold on a requeued job), and goodput over the whole run.

Built from each attempt's records: ``attempts/<n>/`` (``outcome.json``, the lead task's
``steps.jsonl``) and the run folder's own for the last. The records of an attempt that Slurm ended
before ddlctl collected its tasks' folders are found in the next attempt's (its node kept them);
where none came back anywhere, that attempt's steps are unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ddlctl.contract.rundir import ATTEMPTS_DIR, OUTCOME_FILE, PLAN_FILE, TASK_STEPS, TASKS_DIR
from ddlctl.contract.runfolder import load_record
from ddlctl.report.faults import productive_time, redone_mask
from ddlctl.report.stepfile import read_steps


def _lead_name(plan: Mapping) -> str | None:
    """The task whose steps stand for the job's progress: the ps chief, else the first worker."""
    names = [str(t.get("name")) for t in plan.get("tasks", []) if isinstance(t, Mapping)]
    return next((n for n in ("chief:0", "worker:0") if n in names), names[0] if names else None)


def lead_records(folders: Sequence[Path]) -> list[tuple[int, int, float, int]]:
    """The lead task's step records found in any of ``folders`` (an attempt's folder may hold an
    earlier attempt's records: a node keeps a task folder its attempt could not send back, and the
    next appends to it), once each, by start: (start µs, step, duration s, steps per record)."""
    found: dict[tuple[int, int], tuple[int, int, float, int]] = {}
    for folder in folders:
        lead = _lead_name(load_record(folder / PLAN_FILE))
        if lead is None:
            continue
        steps = read_steps(folder / TASKS_DIR / lead.replace(":", "-") / TASK_STEPS, lead)
        for step, start, duration in zip(steps.step, steps.start_us, steps.duration, strict=True):
            found[(start, step)] = (start, step, duration, steps.block)
    return sorted(found.values())


def ended_by(outcome: Mapping) -> str:
    """What ended an attempt, in a few words (``outcome``: its outcome.json, or what
    :func:`ddlctl.commands.attempts.earlier_attempts` kept of it)."""
    failure = str(outcome.get("failure") or "")
    cause = outcome.get("root_cause") if isinstance(outcome.get("root_cause"), Mapping) else {}
    reason = outcome.get("reason") or cause.get("reason")
    if outcome.get("ok"):
        return "completed"
    if reason == "time-limit" or failure.startswith("the time limit is near"):
        return "time limit"
    if failure == "interrupted by SIGTERM":
        return "preempted (SIGTERM)"
    if failure:
        return failure[:80]
    return "no record" if outcome.get("exit_code") is None else f"exit code {outcome['exit_code']}"


def attempt_row(number: int, outcome: Mapping) -> dict:
    """One attempt's row, its steps filled in by :func:`whole_run`."""
    started = outcome.get("started_at")
    wall = outcome.get("wall_time_s")
    ended = outcome.get("ended_at") or (started + wall if isinstance(started, (int, float))
                                        and isinstance(wall, (int, float)) else None)
    return {"attempt": number, "started_at": started, "ended_at": ended, "wall_s": wall,
            "exit_code": outcome.get("exit_code"), "ended_by": ended_by(outcome)}


def has_records(folder: Path) -> bool:
    """Whether the lead task's step records of the attempt in ``folder`` came back (an attempt that
    trained no step, its predecessor having ended at the last, has an empty file)."""
    lead = _lead_name(load_record(folder / PLAN_FILE))
    return lead is not None and (folder / TASKS_DIR / lead.replace(":", "-") / TASK_STEPS).is_file()


def whole_run(rows: Sequence[dict], records: Sequence[tuple[int, int, float, int]]) -> dict:
    """The rows with the time each waited before it, the steps it trained (the lead's ``records``
    from its start to the next attempt's) and how many of them again; and the run's totals: its
    span (first start to last end), the time between attempts, productive step time (each step
    once) and goodput over the span."""
    previous_end, trained_to = None, 0  # (trained_to: the highest step trained so far)
    for i, row in enumerate(rows):
        start = row["started_at"] if isinstance(row["started_at"], (int, float)) else None
        until = rows[i + 1]["started_at"] if i + 1 < len(rows) else None
        mine = [r for r in records if start is not None and r[0] >= start * 1e6
                and (not isinstance(until, (int, float)) or r[0] < until * 1e6)]
        row["waited_s"] = round(start - previous_end, 3) if previous_end is not None and start is not None else None
        row["steps"] = [min(r[1] for r in mine), max(r[1] + r[3] - 1 for r in mine)] if mine else None
        row["startup_s"] = round(mine[0][0] / 1e6 - start, 3) if mine and start is not None else None
        known = mine or row.get("came_back")  # (records, or none where they came back: it trained no step)
        row["redone"] = (max(0, min(trained_to, row["steps"][1]) - row["steps"][0] + 1) if mine else 0) \
            if known and trained_to is not None else None
        trained_to = max(trained_to, row["steps"][1] if mine else 0) if known and trained_to is not None else None
        previous_end = row["ended_at"] if row["ended_at"] is not None else previous_end
    starts = [r["started_at"] for r in rows if isinstance(r["started_at"], (int, float))]
    ends = [r["ended_at"] for r in rows if isinstance(r["ended_at"], (int, float))]
    span = max(ends) - min(starts) if starts and ends and max(ends) > min(starts) else None
    productive = productive_time([r[0] for r in records], [r[2] for r in records],
                                 redone_mask([r[1] for r in records])) if records else None
    waited = [r["waited_s"] for r in rows[1:] if r["waited_s"] is not None]
    return {"attempts": list(rows), "span_s": span, "between_s": round(sum(waited), 3) if waited else 0.0,
            "productive_s": productive, "goodput": productive / span if productive is not None and span else None,
            "startup_s": round(sum(r["startup_s"] for r in rows if r["startup_s"] is not None), 3),
            "steps_redone": sum(r["redone"] for r in rows if r["redone"] is not None),
            "steps_unknown": [r["attempt"] for r in rows if r["steps"] is None and not r.get("came_back")]}


def attempts_section(run_dir: Path, outcome: Mapping) -> dict | None:
    """``summary.json``'s ``attempts`` (None: the run had one attempt). ``outcome`` is the last
    attempt's (the run folder's own, perhaps not on disk yet)."""
    if not outcome.get("attempts"):
        return None
    root = run_dir / ATTEMPTS_DIR
    rows, folders = [], []
    for earlier in outcome["attempts"]:
        number = int(earlier.get("attempt", len(rows) + 1))
        folders.append(root / str(number))
        rows.append(attempt_row(number, load_record(folders[-1] / OUTCOME_FILE) or dict(earlier)))
    rows.append(attempt_row(int(outcome.get("attempt") or len(rows) + 1), outcome))
    folders.append(run_dir)
    for row, folder in zip(rows, folders, strict=True):
        row["came_back"] = has_records(folder)
    return whole_run(rows, lead_records(folders))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def attempts_line(section: Mapping) -> str:
    """The diagnosis line of a run of several attempts."""
    rows = section["attempts"]
    parts = [f"this run took {len(rows)} attempts over {_duration(section.get('span_s'))}"]
    if section.get("productive_s") is not None:
        goodput = f" (goodput {section['goodput']:.0%} of the whole run)" if section.get("goodput") is not None else ""
        parts.append(f"{_duration(section['productive_s'])} training{goodput}")
    parts.append(f"{_duration(section.get('between_s'))} between attempts")
    parts.append(f"{_duration(section.get('startup_s'))} starting (to each attempt's first step)")
    redone = section.get("steps_redone") or 0
    parts.append(f"{redone} step{'s' if redone != 1 else ''} trained again")
    unknown = section.get("steps_unknown") or []
    line = ", ".join(parts)
    if unknown:
        line += (f" (attempt{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))}: no step records "
                 "anywhere: ended before its first step, or before ddlctl collected them)")
    return (f"{line}; the earlier attempts' records are in attempts/<n>/, the other figures here are attempt "
            f"{rows[-1]['attempt']}'s")


def attempt_cells(row: Mapping) -> tuple[str, ...]:
    """A row of the attempts table: attempt, waited before, ran, start-up, steps, trained again, ended by."""
    steps = row.get("steps")
    return (str(row["attempt"]), _duration(row.get("waited_s")) if row.get("waited_s") is not None else "-",
            _duration(row.get("wall_s")), _duration(row.get("startup_s")),
            f"{steps[0]}-{steps[1]}" if steps else "none" if row.get("came_back") else "no records",
            "-" if row.get("redone") is None else str(row["redone"]), str(row.get("ended_by", "-")))


def render_attempts(section: Mapping | None, console) -> None:  # noqa: ANN001 - a rich Console
    """The attempts as a table (a run of several attempts only)."""
    if not section:
        return
    from rich.table import Table

    table = Table(title="attempts (one run, started again: Slurm's requeue or launch --resume)", title_justify="left")
    for column in ("attempt", "waited before", "ran", "start-up", "steps", "trained again", "ended by"):
        table.add_column(column, justify="left" if column in ("ended by",) else "right")
    for row in section["attempts"]:
        table.add_row(*attempt_cells(row))
    console.print(table)
