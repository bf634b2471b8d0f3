"""``ddlctl launch --resume RUN_DIR``: a run that ended before its training did (Ctrl-C, a host
gone, a fault past ``--max-restarts``, a machine's shutdown) goes on in its own folder, as its next
attempt, with the options it was launched with; its tasks resume from their newest checkpoint (the
run folder's ``checkpoints/`` here, ``~/.ddlctl/runs/<run-id>/checkpoints`` on SSH hosts, which stay
there after a run). The previous attempt's records move to ``attempts/<n>/``
(:mod:`ddlctl.commands.attempts`), and the report covers every attempt.

A launch records what it was given in ``launch.json``: the subcommand, its options (an ``--env
KEY=VALUE`` kept as ``--env KEY``: the value is taken from ddlctl's environment again, and written
nowhere), the program's command line and the working folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlctl.commands.submit import hide_env_values
from ddlctl.contract import envvars
from ddlctl.contract.errors import ConfigError
from ddlctl.contract.runfolder import load_record, write_whole
from ddlctl.contract.strategies import facts_of
from ddlctl.planning.plan import Plan
from ddlctl.supervise.recovery.checkpoints import sync_folder
from ddlctl.transport.session import HostSession

#: What a launch was given (in its run folder; kept there across attempts).
LAUNCH_FILE = "launch.json"
#: Options that name the run's folder: a resumed launch gets its own.
_FOLDER_OPTIONS = ("--runs-dir", "--run-id")


def own_options(argv: Sequence[str], command: Sequence[str]) -> list[str]:
    """The options of ``ddlctl launch|profile ARGV`` (pure): the subcommand, the program's command
    (and the ``--`` before it) and the run folder's options left out, ``--env`` values hidden."""
    args = list(argv)
    if args and args[0] in ("launch", "profile"):
        args = args[1:]
    if command and args[len(args) - len(command):] == list(command):
        args = args[:len(args) - len(command)]
    if args and args[-1] == "--":
        args = args[:-1]
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _FOLDER_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _FOLDER_OPTIONS)):
            kept.append(arg)
    return list(hide_env_values(kept)[0])


def record_launch(run_dir: Path, subcommand: str, options: Sequence[str], command: Sequence[str]) -> None:
    """``launch.json`` in ``run_dir`` (what :func:`resume_argv` gives again)."""
    write_whole(run_dir / LAUNCH_FILE, json.dumps({"subcommand": subcommand, "options": list(options),
                                                   "command": list(command), "cwd": os.getcwd()}, indent=1) + "\n")


def resume_argv(run_dir: Path) -> tuple[list[str], str | None]:
    """The arguments that continue the run in ``run_dir`` (its recorded launch, with the folder's
    ``--runs-dir``/``--run-id`` and the hidden ``--resumed`` added), and the folder it was launched
    from (None: gone); ConfigError when the folder holds no launch's record."""
    record = load_record(run_dir / LAUNCH_FILE)
    if not record:
        raise ConfigError(f"{run_dir} holds no run ddlctl launched (no {LAUNCH_FILE})",
                          "give the folder of a run this ddlctl launched, e.g. runs/20261202-120000-mwms-abc123 "
                          "(a run from before ddlctl recorded its options cannot be resumed)")
    if (run_dir / "submit.json").is_file():
        raise ConfigError(f"{run_dir} is a Slurm batch job's run", "Slurm continues it (submit --requeue), or "
                          "submit it again")
    subcommand = "profile" if record.get("subcommand") == "profile" else "launch"
    options = [str(o) for o in record.get("options") or []]
    command = [str(c) for c in record.get("command") or []]
    cwd = record.get("cwd")
    argv = [subcommand, *options, "--runs-dir", str(run_dir.parent), "--run-id", run_dir.name, "--resumed",
            *(["--", *command] if command else [])]
    return argv, str(cwd) if isinstance(cwd, str) and Path(cwd).is_dir() else None


def share_checkpoint(plan: Plan, sessions: Mapping[str, HostSession], say: Callable[[str], None]) -> None:
    """Before a resumed run starts: every worker restores from its own host's checkpoint folder, so
    worker 0's is copied to the hosts that do not share it (as before a group restart). ConfigError
    when it cannot be (the workers would resume from different steps)."""
    leader = next((t for t in plan.tasks if t.name == "worker:0" and t.kind == "program"), None)
    if leader is None or not facts_of(plan.strategy).batch_split:
        return
    source = leader.env.get(envvars.CHECKPOINT_DIR, "")
    done = {(leader.host.label, source)}
    for spec in plan.tasks:
        target = spec.env.get(envvars.CHECKPOINT_DIR, "")
        if spec.role != "worker" or (spec.host.label, target) in done:
            continue
        done.add((spec.host.label, target))
        try:
            files, size = sync_folder(sessions[leader.host.label], source, sessions[spec.host.label], target)
        except (OSError, KeyError) as exc:
            raise ConfigError(f"cannot copy worker:0's checkpoint from {leader.host.label}:{source} to "
                              f"{spec.host.label}:{target} for the resumed run: {exc}",
                              "the hosts must be the run's (its checkpoints stay in ~/.ddlctl/runs/<run-id>/"
                              "checkpoints on each), and reachable") from None
        if files:
            say(f"copied worker:0's checkpoint to {spec.host.label} ({files} file(s), {size / 2**20:.1f} MiB): "
                f"it does not share {leader.host.label}'s file system")
