"""``ddlctl stop RUN_DIR``: kill whatever of a run is still alive, on every host of its plan."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from ddlctl.cluster.model import Host
from ddlctl.contract.errors import ConfigError, LaunchError
from ddlctl.contract.rundir import PLAN_FILE
from ddlctl.contract.runfolder import check_private, read_record
from ddlctl.host.killrun import kill_run, script

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_WORD = re.compile(r"^[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*$")  # one word: no space, control character or leading '-'
_PATH = re.compile(r"^[^\x00-\x1f\x7f-][^\x00-\x1f\x7f]*$")  # no control character, no leading '-'


def plan_hosts(run_dir: Path) -> tuple[str, list[Host]]:
    """Run id and the hosts that ran tasks, from ``plan.json``: checked as a hosts file is (it says
    which program runs on each host), and only from a folder and file of the user's own that
    nobody else may write."""
    path = run_dir / PLAN_FILE
    check_private(run_dir, "RUN_DIR")
    check_private(path, "RUN_DIR")
    try:
        plan = json.loads(read_record(path))
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a run directory (no plan.json)",
                          "pass a folder like runs/<run-id>, or a run id of ./runs") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    try:
        run_id, used, listed = plan["run_id"], {t["host"] for t in plan["tasks"]}, plan["cluster"]["hosts"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a plan ddlctl wrote (no {exc})") from None
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(f"{path}: run_id {run_id!r} is not a run id")
    hosts = []
    for i, fields in enumerate(listed, 1):
        where = f"{path}: host {i}"
        host = _plan_host(fields, where)
        if host.label in used:
            hosts.append(host)
    return run_id, hosts


def _plan_host(fields: object, where: str) -> Host:
    """A host of plan.json, refused with ``where`` when a field a command line takes is not what
    a hosts file allows."""
    if not isinstance(fields, dict):
        raise ConfigError(f"{where}: not a host")
    for key, shape in (("name", _WORD), ("user", _WORD), ("python", _PATH)):
        value = fields.get(key)
        if (value is not None or key == "name") and not (isinstance(value, str) and shape.match(value)):
            raise ConfigError(f"{where}: {key} {value!r} is not what a hosts file allows")
    port = fields.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError(f"{where}: port {port!r} is not a port")
    try:
        return Host(**{**fields, "roles": tuple(fields.get("roles", ()))})
    except TypeError as exc:
        raise ConfigError(f"{where}: not a host ddlctl wrote ({exc})") from None


_JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,12})?$")  # a job (an array task's too): what scancel is given
_STEP_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,12})?\.[0-9]{1,12}$")


def slurm_targets(run_dir: Path) -> tuple[list[str], str] | None:
    """What ``scancel`` must cancel for a Slurm run: the whole job when ``ddlctl submit`` created it
    (``submit.json``), else the steps of its host agents (``slurm.json``); None: not a Slurm run.
    Read only from a folder and file of the user's own that nobody else may write, and only ids
    of Slurm's shape (never an option: a ``{"job_id": "--user=alice"}`` cancelled every job of alice's)."""
    for name, key in (("submit.json", "job_id"), ("slurm.json", "steps")):
        path = run_dir / name
        if path.is_file():
            check_private(run_dir, "RUN_DIR")
            check_private(path, "RUN_DIR")
            try:
                record = json.loads(read_record(path))
                value = record[key]
                job = record["job_id"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}: not what ddlctl wrote ({exc})") from None
            targets = [str(value)] if name == "submit.json" else [str(v) for v in value] \
                if isinstance(value, list) else []
            shape = _JOB_ID if name == "submit.json" else _STEP_ID
            if not _JOB_ID.match(str(job)) or not targets or not all(shape.match(t) for t in targets):
                what = "job" if name == "submit.json" else "step"
                raise ConfigError(f"{path}: {key} {str(value)[:80]!r} is not a Slurm {what} id ddlctl wrote",
                                  "stop the job with scancel yourself if it is yours")
            return targets, ("job" if name == "submit.json" else "the host agents' job steps")
    return None


def run_steps(job_id: str, run_id: str) -> list[str]:
    """The live agent steps of run ``run_id`` in job ``job_id`` (by step name: steps that later
    reconnections started are found too)."""
    import subprocess

    from ddlctl.transport.slurm import step_name

    try:
        done = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in done.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1] == step_name(run_id)]


def stop_slurm(targets: list[str], what: str, console: Console) -> int:
    """``scancel`` the run's job or steps (Slurm kills every process in them)."""
    import subprocess

    try:
        done = subprocess.run(["scancel", *targets], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError("this run ran on Slurm, but scancel is not on PATH",
                          "run ddlctl stop where the Slurm client commands are") from None
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        console.print(f"scancel {' '.join(targets)} failed: {done.stderr.strip()}", highlight=False)
        return 1
    console.print(f"cancelled Slurm {what}: {', '.join(targets)}", highlight=False)
    return 0


def stop(run_dir: str, ssh: object | None, console: Console) -> int:
    """Kill the run's processes everywhere; 0 when every host was reached, else 1."""
    from ddlctl.transport.ssh import SshOptions, connect_each

    slurm = slurm_targets(Path(run_dir))
    if slurm is not None:
        targets, what = slurm
        if what != "job":  # steps: those recorded at launch and any a reconnection started since
            record = json.loads(read_record(Path(run_dir) / "slurm.json"))
            run_id = plan_hosts(Path(run_dir))[0]
            targets = sorted({*targets, *run_steps(str(record["job_id"]), run_id)})
        return stop_slurm(targets, what, console)
    run_id, hosts = plan_hosts(Path(run_dir))
    results: dict[str, str] = {}
    for host in (h for h in hosts if h.is_local):
        results[host.label] = f"killed {len(kill_run(run_id))} process(es)"
    remote = [h for h in hosts if not h.is_local]
    unreachable = 0
    if remote:
        source = script()
        connections = connect_each(remote, ssh if isinstance(ssh, SshOptions) else SshOptions())

        def kill_remote(host: Host) -> str:
            conn = connections[host.label]
            if isinstance(conn, LaunchError):
                return f"UNREACHABLE: {conn.message}"
            try:
                status, out, err = conn.run([host.python or "python3", "-c", source, run_id])
                if status != 0:
                    return f"FAILED: {err.strip()[-200:]}"
                return f"killed {len(json.loads(out))} process(es)"
            except Exception as exc:  # noqa: BLE001 - a connection that dies midway is a line, not a traceback
                return f"FAILED: {type(exc).__name__}: {exc}"
            finally:
                conn.close()

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(remote)))) as pool:
            for host, text in zip(remote, pool.map(kill_remote, remote), strict=True):
                results[host.label] = text
                unreachable += not text.startswith("killed")
    for label, text in results.items():
        console.print(f"{label}: {text}", highlight=False)
    return 1 if unreachable else 0
