"""``ddlctl stop RUN_DIR`` trusts only a plan of the user's own: a plan.json that names a program
a hosts file could not, or that others may write, is refused before anything runs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import run_ddlctl


def write_plan(run_dir, run_id="20261125-120000-ps-abc123", **host) -> None:  # noqa: ANN001
    run_dir.mkdir(mode=0o700, exist_ok=True)
    fields = {"name": "localhost", "port": 22, **host}
    plan = {"run_id": run_id, "tasks": [{"name": "worker:0", "host": "localhost"}], "cluster": {"hosts": [fields]}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    (run_dir / "plan.json").chmod(0o600)


def test_a_plan_of_ones_own_is_followed(tmp_path):
    write_plan(tmp_path / "run")
    done = run_ddlctl("stop", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "localhost: killed 0 process(es)" in done.stdout


def test_a_plan_naming_what_a_hosts_file_could_not_is_refused(tmp_path):
    cases = [({"python": "-c"}, "python '-c' is not what a hosts file allows"),
             ({"python": "/usr/bin/python3\nrm"}, "python '/usr/bin/python3\\nrm' is not what"),
             ({"name": "local host"}, "name 'local host' is not what"),
             ({"port": "22; id"}, "port '22; id' is not a port"),
             ({"shell": "sh"}, "not a host ddlctl wrote")]
    for i, (fields, said) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        write_plan(run_dir, **fields)
        done = run_ddlctl("stop", str(run_dir))
        assert done.returncode == 2 and said in done.stderr and "host 1" in done.stderr, (fields, done.stderr)
        assert "Traceback" not in done.stderr
    for run_id in ("", "*", "-x", "../x"):
        write_plan(tmp_path / "bad-id", run_id=run_id)
        done = run_ddlctl("stop", str(tmp_path / "bad-id"))
        assert done.returncode == 2 and "is not a run id" in done.stderr, done.stderr
    (tmp_path / "bad-id" / "plan.json").write_text('{"tasks": []}')
    done = run_ddlctl("stop", str(tmp_path / "bad-id"))
    assert done.returncode == 2 and "not a plan ddlctl wrote" in done.stderr and "Traceback" not in done.stderr


def test_a_plan_others_may_write_is_refused(tmp_path):
    write_plan(tmp_path / "run")
    os.chmod(tmp_path / "run" / "plan.json", 0o666)
    done = run_ddlctl("stop", str(tmp_path / "run"))
    assert done.returncode == 2 and "plan.json is writable by others" in done.stderr, done.stderr
    os.chmod(tmp_path / "run" / "plan.json", 0o600)
    os.chmod(tmp_path / "run", 0o770)
    done = run_ddlctl("stop", str(tmp_path / "run"))
    assert done.returncode == 2 and "is writable by its group" in done.stderr, done.stderr


def test_the_remote_kill_runs_where_ddlctl_is_not_installed_and_ends_only_that_runs_processes(tmp_path):
    """``ddlctl stop`` runs killrun.py's text as ``python -c`` on each remote host: a Python that
    cannot import ddlctl (``-I -S``: no site-packages, no working directory) must run it whole."""
    import subprocess
    import sys
    from pathlib import Path

    from ddlctl.contract import envvars
    from ddlctl.host import killrun

    assert killrun.RUN_ID == envvars.RUN_ID
    source = (Path(killrun.__file__)).read_text()
    # each in a session of its own, as tasks are (the kill takes each process's group too)
    mine = subprocess.Popen(["sleep", "60"], env={**os.environ, envvars.RUN_ID: "run-a"}, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, envvars.RUN_ID: "run-b"}, start_new_session=True)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", source, "run-a"], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [mine.pid]
        assert mine.wait(timeout=10) == -9 and other.poll() is None
    finally:
        other.kill()
        mine.kill()


def test_the_remote_kill_of_a_launchs_leftovers_ends_that_launchs_processes_alone_and_spares_its_agents(tmp_path):
    """What launch runs on a host whose agent was lost (``killrun.py RUN_ID LAUNCH``): only that
    launch's processes (another launch given the same run id is not touched), named, and never a
    host agent of it that still runs (it ends its own)."""
    import subprocess
    import sys
    from pathlib import Path

    from ddlctl.contract import envvars
    from ddlctl.host import killrun

    assert killrun.LAUNCH == envvars.LAUNCH and killrun.AGENT == "ddlctl.host.agent"
    source = (Path(killrun.__file__)).read_text()
    ours = {**os.environ, envvars.RUN_ID: "run-a", envvars.LAUNCH: "k1"}
    leftover = subprocess.Popen(["sleep", "61"], env=ours, start_new_session=True)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", killrun.AGENT], env=ours,
                             start_new_session=True)
    other = subprocess.Popen(["sleep", "62"], env={**ours, envvars.LAUNCH: "k2"}, start_new_session=True)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", source, "run-a", "k1"], capture_output=True,
                              text=True, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [[leftover.pid, "sleep 61"]]
        assert leftover.wait(timeout=10) == -9 and other.poll() is None and agent.poll() is None
    finally:
        for proc in (leftover, agent, other):
            proc.kill()
            proc.wait()


FREEZER = Path("/sys/fs/cgroup/freezer")


@contextlib.contextmanager
def frozen_and_killed(env: dict[str, str]):  # noqa: ANN201 - a context manager of a Popen
    """A process of ``env`` SIGKILLed while frozen (cgroup v1 freezer): alive, a SIGKILL pending,
    its /proc readable - as a task is between its host agent's death and its next turn on a loaded
    machine's CPU - until it is thawed, 1 s after it was entered."""
    if not os.access(FREEZER, os.W_OK):
        pytest.skip("no writable cgroup v1 freezer here (root on a cgroup v1 host)")
    group = FREEZER / f"ddlctl-test-{os.getpid()}"
    group.mkdir()
    proc = subprocess.Popen(["sleep", "63"], env=env, start_new_session=True)
    try:
        (group / "cgroup.procs").write_text(str(proc.pid))
        (group / "freezer.state").write_text("FROZEN")
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            time.sleep(0.01)
        proc.kill()
        thaw = threading.Timer(1.0, (group / "freezer.state").write_text, ["THAWED"])
        thaw.start()
        yield proc
    finally:
        (group / "freezer.state").write_text("THAWED")
        proc.kill()
        proc.wait()
        thaw.join()
        group.rmdir()


def test_a_process_of_the_run_already_dying_is_waited_for_not_taken_for_a_leftover(tmp_path):
    """A task dying with its SIGKILLed host agent may not have run yet when ddlctl looks for what the
    launch left (CI saw it named as a daemon left by a task): ``killrun`` (remote hosts) and
    ``end_leftovers`` (this machine) wait for it and name only what lives on."""
    from ddlctl.contract import envvars
    from ddlctl.host import killrun
    from ddlctl.transport.fleet import end_leftovers

    ours = {**os.environ, envvars.RUN_ID: "run-d", envvars.LAUNCH: "k1",
            envvars.TASK_DIR: f"{tmp_path}/tasks/worker-0"}
    for end in ("killrun", "end_leftovers"):
        leftover = subprocess.Popen(["sleep", "61"], env=ours, start_new_session=True)
        try:
            with frozen_and_killed(ours) as task:
                assert killrun.dying(task.pid) and not killrun.dying(leftover.pid)
                started = time.monotonic()
                if end == "killrun":
                    done = subprocess.run([sys.executable, "-I", "-S", "-c", Path(killrun.__file__).read_text(),
                                           "run-d", "k1"], capture_output=True, text=True, timeout=60)
                    assert done.returncode == 0, done.stderr
                    assert json.loads(done.stdout) == [[leftover.pid, "sleep 61"]]
                else:
                    plan = SimpleNamespace(cluster=SimpleNamespace(hosts=[SimpleNamespace(is_local=True)]),
                                           run_dir=str(tmp_path), run_id="run-d")
                    said = end_leftovers(plan)  # type: ignore[arg-type]
                    assert said is not None and said.endswith(f": {leftover.pid} (sleep 61)"), said
                # (it waited for the thaw: the task died then)
                assert time.monotonic() - started > 0.5 and task.wait(timeout=10) == -9
            assert leftover.wait(timeout=10) == -9
        finally:
            leftover.kill()
            leftover.wait()


def test_a_submit_record_others_may_write_or_not_naming_a_job_is_refused_before_scancel_runs(tmp_path):
    # before: a 0777 folder holding {"job_id": "--user=alice"} made stop run `scancel --user=alice`
    # and return 0 (submit.json was read before any ownership check; the id was not checked)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "scancel-called"
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" >> {called}\n")
    (bin_dir / "scancel").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run_dir = tmp_path / "run"
    write_plan(run_dir)
    (run_dir / "submit.json").write_text(json.dumps({"job_id": "--user=alice"}))
    (run_dir / "submit.json").chmod(0o600)
    os.chmod(run_dir, 0o777)
    done = run_ddlctl("stop", str(run_dir), env=env)
    assert done.returncode == 2 and "is writable by others" in done.stderr, done.stderr
    os.chmod(run_dir, 0o700)
    for job_id in ("--user=alice", "1 2", 12.5, "12;id"):
        (run_dir / "submit.json").write_text(json.dumps({"job_id": job_id}))
        done = run_ddlctl("stop", str(run_dir), env=env)
        assert done.returncode == 2 and "is not a Slurm job id ddlctl wrote" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not called.exists()
    (run_dir / "submit.json").write_text(json.dumps({"job_id": "4242"}))  # what submit writes: cancelled
    done = run_ddlctl("stop", str(run_dir), env=env)
    assert done.returncode == 0 and called.read_text() == "4242\n", done.stderr


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_sealed_host_agent_of_a_plain_user_is_found_by_its_command_line_and_killed(tmp_path):
    """A host agent is sealed (not dumpable): another process of its user - a task - cannot read
    its environment, memory or descriptors. ``killrun`` (what ``stop`` and a launch's clean-up run
    on a host, as that user) finds it by its command line instead. As a plain user (root reads any
    environment): the agent from ddlctl's code bundle, as on a remote host."""
    import shutil
    import tempfile

    from ddlctl.host import killrun
    from ddlctl.transport.remote import code_bundle

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to run as another user")
    python = next((p for p in (sys.executable, "/usr/bin/python3")
                   if subprocess.run([*NOBODY, p, "-c", ""], capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no Python here that another user may run")
    shared = Path(tempfile.mkdtemp(prefix="ddlctl-sealed-"))  # (pytest's folders are root's alone)
    try:
        shared.chmod(0o755)
        bundle = shared / "ddlctl.zip"
        bundle.write_bytes(code_bundle()[1])
        bundle.chmod(0o644)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(bundle), "HOME": str(shared),
               "DDLCTL_RUN_ID": "run-sealed", "DDLCTL_LAUNCH": "k1"}
        agent = subprocess.Popen([*NOBODY, python, "-m", killrun.AGENT, "--run", "run-sealed", "--launch", "k1"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                 cwd=shared, start_new_session=True)
        try:
            assert agent.stdout.read(len(b"DDLCTL-HOSTAGENT")) == b"DDLCTL-HOSTAGENT", agent.stderr.read()
            # not dumpable: its /proc files are root's, not its user's, and its user cannot read them
            assert os.stat(f"/proc/{agent.pid}").st_uid == 65534
            assert os.stat(f"/proc/{agent.pid}/environ").st_uid == 0
            peek = subprocess.run([*NOBODY, python, "-c", f"open('/proc/{agent.pid}/environ', 'rb').read()"],
                                  capture_output=True, text=True, env=env, cwd=shared)
            assert "PermissionError" in peek.stderr, peek.stderr
            killed = subprocess.run([*NOBODY, python, "-I", "-S", "-c", killrun.script(), "run-sealed"],
                                    capture_output=True, text=True, cwd=shared, timeout=60)
            assert killed.returncode == 0, killed.stderr
            assert json.loads(killed.stdout) == [agent.pid]
            assert agent.wait(timeout=10) == -9
        finally:
            agent.kill()
            agent.wait()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
