"""The controller's helpers for a run directory (names in :mod:`ddlctl.contract.rundir`): its
folders, a new run id, a private runs folder, files written whole. Standard library only."""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Protocol

from ddlctl.contract.diskspace import write_failure
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.rundir import PLAN_FILE, TASK_LOG, TASKS_DIR, TELEMETRY_DIR


class PlanLike(Protocol):
    """What :func:`write_plan` needs of a plan (``ddlctl.planning.plan.Plan``)."""

    run_dir: Path

    def to_dict(self) -> dict: ...


#: The most of one record file a task or a telemetry agent appends to (steps, phases, samples) that
#: the report reads: its last part, from a line's start (10 million step records take about 1 GiB).
RECORDS_READ_MAX = 1 << 30


def read_last(path: Path, limit: int | None = None) -> tuple[bytes, int]:
    """The last ``limit`` (:data:`RECORDS_READ_MAX`) bytes at most of ``path``, from the start of a
    line, and how many bytes before them were not read (0: the whole file). A file never costs more
    memory than ``limit``, whatever a program wrote into it."""
    limit = RECORDS_READ_MAX if limit is None else limit
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size <= limit:
            data = handle.read(limit + 1)
            if len(data) <= limit:  # (unless it grew meanwhile)
                return data, 0
        handle.seek(max(0, size - limit))
        data = handle.read(limit)
    cut = data.find(b"\n") + 1
    return data[cut:], max(0, size - limit) + cut


#: The largest record ddlctl writes whole that it reads back (plan, outcome, summary, submit and
#: slurm records: a plan of thousands of tasks is a few MiB).
RECORD_MAX = 64 << 20


def read_record(path: Path, limit: int | None = None) -> str:
    """``path``'s text, refused (ConfigError) past ``limit`` (:data:`RECORD_MAX`): a record ddlctl
    wrote, never a file of any size put in its place."""
    limit = RECORD_MAX if limit is None else limit
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path}: larger than {limit >> 20} MiB: not a record ddlctl wrote")
    return data.decode("utf-8", "replace")


def load_record(path: Path) -> dict:
    """A JSON object ddlctl wrote (:func:`read_record`); {} when it is missing, unreadable, too
    large or not an object."""
    try:
        data = json.loads(read_record(path))
    except (OSError, ValueError, ConfigError):
        return {}
    return data if isinstance(data, dict) else {}


def task_dir(run_dir: str | Path, dir_name: str) -> Path:
    """``tasks/<role>-<i>``: a task's folder (``TaskSpec.dir_name``)."""
    return Path(run_dir) / TASKS_DIR / dir_name


def task_log(run_dir: str | Path, dir_name: str) -> Path:
    """A task's combined output, as it arrived."""
    return task_dir(run_dir, dir_name) / TASK_LOG


def telemetry_file(run_dir: str | Path, host_label: str) -> Path:
    """``telemetry/<host>.jsonl`` for a host label (``/`` cannot appear in a file name)."""
    return Path(run_dir) / TELEMETRY_DIR / f"{host_label.replace('/', '_')}.jsonl"


def new_run_id(strategy: str, now: float | None = None) -> str:
    """``20261122-103000-ps-3fa2``: sortable by time, unique across concurrent launches."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{strategy}-{secrets.token_hex(3)}"


def check_private(path: Path, option: str = "--runs-dir") -> None:
    """Refuse a folder someone else owns or others may write to: whoever can write there can
    replace plan.json or a log with a symlink, or read what the run leaves."""
    try:
        info = path.stat()
    except OSError:
        return
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"{option}: {path} belongs to another user (uid {info.st_uid})",
                          f"give {option} a folder of your own, e.g. ~/ddlctl-runs")
    if info.st_mode & 0o022:
        shared = info.st_mode & stat.S_ISVTX  # /tmp and the like: meant for everyone, never chmod them
        raise ConfigError(f"{option}: {path} is writable by {'others' if info.st_mode & 0o002 else 'its group'} "
                          f"(mode {stat.S_IMODE(info.st_mode):o}): anyone who may write there can replace the "
                          "run's files", f"give {option} a folder of your own inside it, e.g. {path / 'my-runs'}"
                          if shared else f"chmod go-w {path}, or give {option} a folder of your own")


def make_dir(path: str | Path, option: str = "--runs-dir") -> Path:
    """Create ``path`` (and parents); a file-system error is a clear message naming the path. A
    folder that another user owns or others may write to is refused (:func:`check_private`)."""
    path = Path(path)
    check_private(path, option)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".ddlctl-write-test-{secrets.token_hex(4)}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{option}: cannot use {path} as a folder: {exc.strerror or exc}",
                          f"give {option} a writable folder (it is created if missing)") from None
    return path


def write_plan(plan: PlanLike) -> Path:
    """Write ``plan.json`` (secrets redacted) before anything starts."""
    run_dir = make_dir(plan.run_dir)
    path = run_dir / PLAN_FILE
    try:
        write_whole(path, json.dumps(plan.to_dict(), indent=1) + "\n")
    except OSError as exc:
        raise ConfigError(f"--runs-dir: {write_failure(path, exc)}",
                          "free space there, or give --runs-dir a disk with room") from None
    return path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (``ddlctl stop``, a test, a user's script) sees
    the old file or the whole new one, never a half-written one: a temporary file, then a rename."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:  # (a full disk: no half-written file left behind either)
        partial.unlink(missing_ok=True)
        raise


def task_dirs(run_dir: str | Path) -> list[Path]:
    """``tasks/<role>-<i>`` folders of a run, sorted."""
    root = Path(run_dir) / TASKS_DIR
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def remove_unused(run_dir: str | Path) -> bool:
    """Remove a run folder a launch made but refused to use before its plan was written (a run id
    in use, a host without TensorFlow): only when all it holds is empty host agent logs, so a log
    that says something, and anything another launch put there, stays. Whether it was removed."""
    root = Path(run_dir)
    try:
        files = [p for p in root.rglob("*") if not p.is_dir()]
        if any(not (p.parent.name == "agents" and p.name.startswith("hostagent-") and p.stat().st_size == 0)
               for p in files):
            return False
        for path in files:
            path.unlink()
        for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            folder.rmdir()
        root.rmdir()
    except OSError:
        return False
    return True
