"""Real OpenSSH test hosts with default settings: many tasks per host over one session, and
dropped connections (the sshd processes serving ddlctl killed mid-run)."""

from __future__ import annotations

import collections
import json
import os
import pwd
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlctl.testing.faults import Job, step_count, wait_for
from ddlctl.testing.sshd import SshTestCluster, sshd_available
from tests.conftest import PROGRAMS, processes_of_run, run_ddlctl

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs root and openssh-server")
REMOTE_RUNS = Path(pwd.getpwuid(0).pw_dir) / ".ddlctl" / "runs"
PRINT_TASK = [sys.executable, "-c", "import os; print('hello from', os.environ['DDLCTL_TASK'])"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = SshTestCluster(tmp_path_factory.mktemp("sshf"), 3)
    yield hosts
    hosts.stop()


def test_twelve_tasks_on_one_host_with_default_max_sessions(cluster, tmp_path, runs):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(cluster.hosts[0].hosts_line(slots=12) + "\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--workers", "12", "--runs-dir", str(runs),
                      "--", *PRINT_TASK, env=cluster.env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    # (CI twice showed one task's line in two, "hello from" and " worker:6": print() is several
    # writes to an unbuffered pipe, and a task descheduled between them for over the 0.5 s a partial
    # line was then held had its start shown alone; held 2 s now. The console stays in the message.)
    missing = [i for i in range(12) if f"hello from worker:{i}" not in done.stdout]
    assert not missing, f"missing {missing}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    run_dir = next(runs.iterdir())
    recorded = json.loads((run_dir / "pids.json").read_text())
    assert all(isinstance(recorded[f"worker:{i}"]["task_pid"], int) for i in range(12)), "remote pids recorded"
    assert len({recorded[f"worker:{i}"]["agent_pid"] for i in range(12)}) == 1, "one agent, one session"


def test_sixteen_hosts(tmp_path, runs):
    many = SshTestCluster(tmp_path / "sixteen", 16)
    try:
        hosts = many.hosts_file(tmp_path / "hosts16.txt")
        done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--runs-dir", str(runs), "--", *PRINT_TASK,
                          env=many.env, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(int(line.rsplit("worker:", 1)[1]) for line in done.stdout.splitlines()
                      if "hello from" in line) == list(range(16))
    finally:
        many.stop()


def remote_steps(job: Job, task: str) -> int:
    return step_count(REMOTE_RUNS / job.run_dir.name / "tasks" / task / "steps.jsonl")


def start_idle(cluster, tmp_path, runs, *extra: str) -> Job:  # noqa: ANN001
    """An mwms job on every host whose tasks listen and step without TensorFlow, once worker:0 stepped
    30 times (what ddlctl does about a host, not what TensorFlow does about a peer)."""
    hosts = cluster.hosts_file(tmp_path / "hosts.txt")
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--no-telemetry", "--grace", "2", "--startup-timeout", "120",
              *extra, "--", sys.executable, str(PROGRAMS / "idle_server.py"), env=cluster.env)
    wait_for(lambda: remote_steps(job, "worker-0") >= 30 or job.proc.poll() is not None, 180, "training")
    assert job.proc.poll() is None, job.stderr()[-3000:]
    return job


def test_a_host_that_stays_down_fails_the_job_naming_it_when_too_few_workers_would_remain(cluster, tmp_path, runs):
    # connections dropped and sshd stopped: it does not come back within --host-timeout, and without
    # it 2 workers would remain of --min-workers 3: the job fails naming it (a restart remained)
    job = start_idle(cluster, tmp_path, runs, "--max-restarts", "2", "--host-timeout", "4", "--min-workers", "3")
    down = cluster.hosts[2]
    assert down.drop_connections(stop_listener=True) >= 1
    dropped = time.monotonic()
    try:
        code = job.wait(120)
        took = time.monotonic() - dropped
    finally:
        down.start()
    outcome = job.outcome()
    label = f"{down.address}:{down.port}"
    assert code == 255, job.stderr()[-3000:]
    assert took < 4 + 2 + 15, f"gave up {took:.0f}s after the drop"
    assert f"host {label} did not come back within --host-timeout 4s" in job.stderr()
    assert "left the job" not in job.stderr() and outcome["membership"] == []
    assert "connection refused" in job.stderr()
    # what its tasks may have left there cannot be ended now: said, with what does it later
    said = job.stderr().replace("\n", " ")
    assert f"could not reach {label} to end what this run may have left running there (" in said and \
        f"): ddlctl stop {job.run_dir}" in said, said[-3000:]
    report = job.stderr().split("ddlctl: job failed")[0] + (runs.parent / "ddlctl.out").read_text()
    assert "exit code 255" not in report, "a lost connection is not a program's exit code"
    assert "failed (connection to its host lost)" in report
    wait_for(lambda: not processes_of_run(job.run_dir.name), 20, "every process of the run to end")


IDS = re.compile(r"ddlctl-ids \[([\d\s]*)\]")
RESUMED = re.compile(r"resumed from checkpoint \S+ at step (\d+)")


#: what every elastic test here runs with: a host lost after 3 s, taken back 2 s after it answers
ELASTIC = ("--host-timeout", "3", "--rejoin-after", "2", "--no-telemetry", "--grace", "2", "--startup-timeout", "120")
#: The built-in workload's pace in these tests (milliseconds a step at least): their events come by
#: the clock (timeouts, a host answering again), and a machine training faster only ran more steps
#: through them. Paced, the steps each event takes are bounded on any machine, and so each run
#: need be no longer than its events (a third of the steps, and of their CPU, of the unpaced runs).
PACE_MS = "60"


def ids_workload(batch: int, steps: int) -> list[str]:
    """The built-in workload over one epoch of ``steps`` batches, printing the sample ids it reads,
    at :data:`PACE_MS`."""
    return [sys.executable, "-m", "ddlctl.workloads", "--epoch-size", str(batch * steps), "--batch-size", str(batch),
            "--record-ids", "--min-step-ms", PACE_MS]


def ids_by_attempt(log: str) -> list[tuple[int, list[int]]]:
    """(first step, ids read) of each attempt of a task: its output split where it resumed."""
    attempts: list[tuple[int, list[int]]] = [(0, [])]
    for line in log.splitlines():
        resumed = RESUMED.search(line)
        if resumed:
            attempts.append((int(resumed[1]), []))
        for found in IDS.findall(line):
            attempts[-1][1].extend(int(i) for i in found.split())
    return attempts


def ids_that_count(attempts: dict[str, list[tuple[int, list[int]]]], outcome: dict, batch: int,
                   steps: int) -> list[tuple[int, int, list[int]]]:
    """Per attempt of the job (the first start, then one per restart in ``outcome``, with the tasks
    it started minus those that left): the step it began at, how many workers read, and the ids they
    read for the steps that count, those before the next attempt began (later ones were read again)."""
    members = [sorted(attempts)] + [[t.replace(":", "-") for t in e["tasks"] if t not in e.get("left", [])]
                                    for e in outcome["restarts"]]
    reads: list[list[tuple[int, list[int]]]] = [[] for _ in members]
    for task, own in attempts.items():
        mine = [g for g, tasks in enumerate(members) if task in tasks]
        assert len(mine) == len(own), (task, mine, [first for first, _ in own])
        for g, attempt in zip(mine, own, strict=True):
            reads[g].append(attempt)
    firsts = [{first for first, _ in read} for read in reads]
    assert all(len(f) == 1 for f in firsts), firsts  # the workers of an attempt all resumed at one step
    begins = [f.pop() for f in firsts]
    return [(first, len(read), [i for _, ids in read for i in ids if first * batch <= i < end * batch])
            for first, end, read in zip(begins, [*begins[1:], steps], reads, strict=True)]


def test_min_workers_a_host_gone_for_good_leaves_mwms_trains_on_and_when_back_rejoins_each_sample_read_once(
        cluster, tmp_path, runs):
    # 48: split evenly over 3 workers and over 2 (and a step's CPU half of 96's). A checkpoint every
    # 40 steps; at most 16.7 steps a second, the host was taken back at step 168 on an idle machine (a
    # loaded one runs fewer steps through the same events): 280 leaves two checkpoints' worth after
    # the next one
    batch, steps, every = 48, 280, 40
    hosts = cluster.hosts_file(tmp_path / "hosts.txt")
    # (no checkpoint on SIGTERM: what a worker reads after its connection dropped is said on a stream
    # that is gone, and this test counts the ids the logs name; the steps trained between the periodic
    # checkpoints are read again)
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--max-restarts", "2", "--min-workers", "2",
              "-e", "DDLCTL_STOP_CHECKPOINTS=0", *ELASTIC, "--", *ids_workload(batch, steps), "--checkpoint-every",
              str(every), env=cluster.env)

    def trains_on(count: int, what: str) -> None:
        start = remote_steps(job, "worker-0")
        wait_for(lambda: remote_steps(job, "worker-0") >= start + count or job.proc.poll() is not None, 180, what)
        assert job.proc.poll() is None, job.stderr()[-3000:]

    wait_for(lambda: remote_steps(job, "worker-0") >= every + 10 or job.proc.poll() is not None, 180, "training")
    # 1. a connection dropped (sshd still up): reconnected at once, the group restarted
    dropped, down = cluster.hosts[1], cluster.hosts[2]
    dropped_label, label = f"{dropped.address}:{dropped.port}", f"{down.address}:{down.port}"
    assert dropped.drop_connections() >= 1
    wait_for(lambda: f"reconnected to {dropped_label}" in job.stderr() or job.proc.poll() is not None, 120,
             "the reconnection")
    trains_on(20, "the restarted group to train")
    # 2. another host gone for good (its sessions and sshd): its worker leaves, two train on
    try:
        assert down.drop_connections(stop_listener=True) >= 1
        wait_for(lambda: "started worker:0, worker:1 again" in job.stderr() or job.proc.poll() is not None, 120,
                 "the two that remain to start again")
        trains_on(20, "two workers to train")
    finally:
        down.start()  # 3. it answers again: taken back at the next checkpoint
    wait_for(lambda: job.stderr().count("started worker:0, worker:1, worker:2 again") == 2
             or job.proc.poll() is not None, 120, "the host to be taken back")
    assert job.wait(300) == 0, job.stderr()[-3000:]
    outcome = job.outcome()
    assert outcome["hosts_lost"][0]["host"] == dropped_label and f"connection to {dropped_label} lost" in job.stderr()
    assert [(e["task"], e["cause"], e["scope"]) for e in outcome["restarts"]] == [
        ("worker:1", "host-lost", "group"), ("worker:2", "host-lost", "group"), ("worker:2", "grow", "group")]
    left, joined = outcome["membership"]
    assert (left["workers"], left["left"], left["host"]) == (["worker:0", "worker:1"], ["worker:2"], label)
    assert (joined["workers"], joined["joined"], joined["cause"]) == (["worker:0", "worker:1", "worker:2"],
                                                                      ["worker:2"], "grow")
    assert f"worker:2 left the job (host {label} did not come back within --host-timeout 3s)" in job.stderr()
    assert "planned: no restart counted" in job.stderr()
    # every sample of the epoch read exactly once by the steps that count: each attempt's up to the
    # checkpoint the next resumed from (3 workers, 3 again after the reconnection, 2, then 3)
    logs = {w: (job.run_dir / "tasks" / w / "output.log").read_text() for w in ("worker-0", "worker-1", "worker-2")}
    counted = ids_that_count({w: ids_by_attempt(text) for w, text in logs.items()}, outcome, batch, steps)
    assert [readers for _, readers, _ in counted] == [3, 3, 2, 3], [first for first, _, _ in counted]
    assert all(first % every == 0 for first, _, _ in counted), "each attempt resumed from a checkpoint"
    assert sorted(i for _, _, ids in counted for i in ids) == list(range(batch * steps))
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["membership"] == [left, joined]
    phases = summary["membership_phases"]
    assert [len(p["workers"]) for p in phases] == [3, 2, 3] and all(p["steps"] > 0 for p in phases), phases
    assert all(p["samples_per_s"] > 0 and 0 < p["goodput"] <= 1 for p in phases), phases
    assert "membership (--min-workers)" in (runs.parent / "ddlctl.out").read_text() + job.stderr()
    assert any("worker:2 left the job" in line and "trained on with 2 worker(s)" in line
               for line in summary["diagnosis"])
    result = json.loads((job.run_dir / "tasks" / "worker-0" / "result.json").read_text())
    assert result["steps"] == steps and result["accuracy"] > 0.3
    wait_for(lambda: not processes_of_run(job.run_dir.name), 20, "every process of the run to end")


def test_min_workers_a_reclaimed_hosts_worker_checkpoints_with_its_group_and_leaves_no_step_lost(cluster, tmp_path,
                                                                                                  runs):
    """A spot host reclaimed: its host agent gets SIGTERM, then the host is gone. Under --min-workers
    the built-in workload checkpoints on SIGTERM: the worker there and its peers agree at their next
    block's end, all three save that step and stop; the two that remain go on from it (no step
    trained twice) and finish, without the third."""
    hosts = cluster.hosts_file(tmp_path / "hosts.txt")
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--max-restarts", "1", "--min-workers", "2", *ELASTIC,
              "--", sys.executable, "-m", "ddlctl.workloads", "--steps", "200", "--batch-size", "48", "--min-step-ms",
              PACE_MS, "--checkpoint-every", "1000", env=cluster.env)
    wait_for(lambda: remote_steps(job, "worker-0") >= 40 or job.proc.poll() is not None, 180, "training")
    assert job.proc.poll() is None, job.stderr()[-3000:]
    reclaimed = cluster.hosts[2]
    try:
        os.kill(json.loads((job.run_dir / "pids.json").read_text())["worker:2"]["agent_pid"], signal.SIGTERM)
        reclaimed.drop_connections(stop_listener=True)
        assert job.wait(300) == 0, job.stderr()[-3000:]
    finally:
        reclaimed.start()
    # (what worker:2 said after its agent's SIGTERM went with the connection; it saved too, or the
    # others' save, which is every worker's, would not have ended)
    logs = [(job.run_dir / "tasks" / t / "output.log").read_text() for t in ("worker-0", "worker-1")]
    saved = [re.findall(r"checkpoint at step (\d+) on SIGTERM: stopping", text) for text in logs]
    assert all(len(found) == 1 for found in saved) and len({found[0] for found in saved}) == 1, saved
    step = int(saved[0][0])
    assert step >= 40
    for text in logs:
        assert re.findall(r"resumed from checkpoint ckpt-(\d+) at step (\d+)", text) == [(str(step), str(step))]
    [left] = job.outcome()["membership"]
    assert (left["workers"], left["left"]) == (["worker:0", "worker:1"], ["worker:2"])
    assert json.loads((job.run_dir / "summary.json").read_text())["steps_lost"] == 0
    assert json.loads((job.run_dir / "tasks" / "worker-0" / "result.json").read_text())["steps"] == 200


def test_min_workers_a_ps_worker_host_gone_for_good_leaves_training_goes_on_and_it_rejoins_when_back(
        cluster, tmp_path, runs):
    # chief, ps and worker:0 on the first host; worker:1 and worker:2 on one host each
    # at most 16.7 steps a second: worker:2 rejoined at step 228 on an idle machine; batches of 16 (a
    # step's CPU a quarter of 64's)
    batch, steps = 16, 360
    hosts = cluster.hosts_file(tmp_path / "hosts.txt")
    # (with telemetry: the host's agent starts again with its worker)
    job = Job(runs, "--hosts", str(hosts), "-s", "ps", "--max-restarts", "1", "--min-workers", "2",
              *(a for a in ELASTIC if a != "--no-telemetry"), "--", *ids_workload(batch, steps),
              "--steps-per-call", "4", env=cluster.env)
    wait_for(lambda: remote_steps(job, "chief-0") >= 40 or job.proc.poll() is not None, 180, "training")
    assert job.proc.poll() is None, job.stderr()[-3000:]
    down = cluster.hosts[2]
    label = f"{down.address}:{down.port}"
    try:
        assert down.drop_connections(stop_listener=True) >= 1
        wait_for(lambda: "worker:2 left the job" in job.stderr() or job.proc.poll() is not None, 120,
                 "worker:2 to leave")
        seen = remote_steps(job, "chief-0")
        wait_for(lambda: remote_steps(job, "chief-0") >= seen + 40 or job.proc.poll() is not None, 180,
                 "two workers to train on")
        assert job.proc.poll() is None, job.stderr()[-3000:]
    finally:
        down.start()
    assert job.wait(300) == 0, job.stderr()[-3000:]
    left, joined = job.outcome()["membership"]
    assert (left["workers"], left["left"], left["host"]) == (["worker:0", "worker:1"], ["worker:2"], label)
    assert (joined["joined"], joined["cause"]) == (["worker:2"], "grow")
    assert "starting worker:2 again (3 worker(s)); it rejoins the chief" in job.stderr()
    # telemetry follows the host back: samples of it from after it rejoined
    samples = [json.loads(line) for line in (job.run_dir / "telemetry" / f"{label}.jsonl").read_text().splitlines()
               if '"sample"' in line]
    assert any(s["t"] > joined["time"] + 1 for s in samples), (joined["time"], [s["t"] for s in samples][-5:])
    assert f"telemetry agent on {label} started again with its host" in job.stderr()
    # every id read; twice only by closures the lost worker had begun (ps is at-least-once: TensorFlow's
    # coordinator runs them again elsewhere) or blocks the chief scheduled again, saying so
    chief = (job.run_dir / "tasks" / "chief-0" / "output.log").read_text()
    # (each way the chief says it: lost with its worker, came back without results, scheduled again)
    again = {int(n) - 1 for n in re.findall(r"block at step (\d+) (?:lost with its|came back without|scheduled again)",
                                            chief)}
    logs = {w: (job.run_dir / "tasks" / w / "output.log").read_text() for w in ("worker-0", "worker-1", "worker-2")}
    read = [i for text in logs.values() for i in ids_by_attempt(text)[0][1]]  # (servers: what their closures read)
    first_life = logs["worker-2"].split("listening at")[:2][-1]  # up to its second start
    lost_with_it = {i for i in ids_by_attempt(first_life)[0][1]}
    assert set(read) == set(range(batch * steps)), "every id read"
    twice = {i for i, times in collections.Counter(read).items() if times > 1}
    assert all(i in lost_with_it or any(first <= i // batch < first + 4 for first in again) for i in twice), \
        (sorted(again), len(twice))
    assert len(twice) <= 2 * 3 * 4 * batch, "no more than the closures in flight"
    work = {w["task"]: w["steps"] for w in json.loads((job.run_dir / "summary.json").read_text())["work"]}
    assert work["worker:2"] > 0 and work["worker:0"] > 0 and work["worker:1"] > 0, work
    wait_for(lambda: not processes_of_run(job.run_dir.name), 20, "every process of the run to end")


def epochs_begun(job: Job, task: str) -> list[tuple[int, int, int]]:
    """(epoch, restart, workers) of every ``EPOCH_BEGIN`` line of ``tests/programs/fit_backup.py``."""
    path = job.run_dir / "tasks" / task / "output.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return [tuple(int(v) for v in found)
            for found in re.findall(r"^EPOCH_BEGIN (\d+) restart=(\d+) workers=(\d+)", text, re.MULTILINE)]


def test_min_workers_model_fit_resumes_its_backup_on_fewer_workers_and_again_on_all_when_the_host_is_back(
        cluster, tmp_path, runs):
    """Keras's BackupAndRestore across a change of worker count: the interrupted epoch again on the
    worker that remains, then, once the host is back, both from the epoch after the last one the
    lone worker completed (growing back waits for BackupAndRestore's own checkpoint, a folder down)."""
    hosts = cluster.hosts_file(tmp_path / "hosts.txt", cluster.hosts[:2])
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--max-restarts", "1", "--min-workers", "1",
              *ELASTIC, "--env", "FIT_EPOCHS=9", "--", sys.executable, str(PROGRAMS / "fit_backup.py"), env=cluster.env)
    wait_for(lambda: any(e >= 1 for e, _, _ in epochs_begun(job, "worker-0")) or job.proc.poll() is not None, 180,
             "the second epoch")
    assert job.proc.poll() is None, job.stderr()[-3000:]
    down = cluster.hosts[1]
    try:
        assert down.drop_connections(stop_listener=True) >= 1
        wait_for(lambda: any(w == 1 for _, _, w in epochs_begun(job, "worker-0")) or job.proc.poll() is not None,
                 120, "one worker to train on")
        assert job.proc.poll() is None, job.stderr()[-3000:]
    finally:
        down.start()
    assert job.wait(300) == 0, job.stderr()[-3000:]
    begun = epochs_begun(job, "worker-0")
    lives = [[e for e, r, _ in begun if r == restart] for restart in (0, 1, 2)]
    workers = [{w for _, r, w in begun if r == restart} for restart in (0, 1, 2)]
    assert workers == [{2}, {1}, {2}], begun
    assert lives[1][0] == lives[0][-1], "the interrupted epoch again, from its start (BackupAndRestore)"
    # taken back after an epoch's end (BackupAndRestore saved it): both resume at the next epoch, the
    # one the lone worker had just begun (from its start) or, if the restart came first, after it
    assert lives[2][0] > lives[1][0] and lives[2][0] in (lives[1][-1], lives[1][-1] + 1), begun
    assert lives[2][-1] == 8 and "FIT_DONE" in (job.run_dir / "tasks" / "worker-0" / "output.log").read_text()
    left, joined = job.outcome()["membership"]
    assert (left["left"], joined["joined"], joined["cause"]) == (["worker:1"], ["worker:1"], "grow")
    assert [e for e, _, _ in epochs_begun(job, "worker-1")][-len(lives[2]):] == lives[2], "worker:1 trained them too"
    last = json.loads((job.run_dir / "tasks" / "worker-0" / "steps.jsonl").read_text().splitlines()[-1])
    assert last["step"] == last["total"] == 9 * 50, "a resumed fit's steps go on from the epoch it resumed at"
    wait_for(lambda: not processes_of_run(job.run_dir.name), 20, "every process of the run to end")


SLEEPER = [sys.executable, "-c", "import os, time; assert os.environ['API_TOKEN'].startswith('tok-'); "
           "print('up', flush=True); time.sleep(300)"]


def test_env_values_never_appear_on_any_command_line(cluster, tmp_path, runs):
    import base64

    import psutil

    secret = "tok-" + base64.b32encode(__import__("os").urandom(10)).decode()
    hosts = cluster.hosts_file(tmp_path / "hosts.txt", cluster.hosts[:2])
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--env", "API_TOKEN", "--no-telemetry", "--",
              *SLEEPER, env={**cluster.env, "API_TOKEN": secret})
    try:
        wait_for(lambda: job.run_dir.joinpath("tasks", "worker-1", "output.log").exists()
                 and b"up" in job.run_dir.joinpath("tasks", "worker-1", "output.log").read_bytes(), 60, "tasks up")
        forms = [secret.encode(), base64.b64encode(secret.encode()).rstrip(b"="),
                 base64.urlsafe_b64encode(secret.encode()).rstrip(b"=")]
        for proc in psutil.process_iter(["cmdline"]):
            line = "\0".join(proc.info["cmdline"] or ()).encode()
            assert not any(form in line for form in forms), proc.info["cmdline"]
        out = (job.run_dir / "tasks" / "worker-1" / "output.log").read_text()
        assert "up" in out
        plan = (job.run_dir / "plan.json").read_text()
        assert secret not in plan and '"API_TOKEN": "***"' in plan
    finally:
        job.proc.send_signal(__import__("signal").SIGINT)
        assert job.wait(60) == 130


@pytest.mark.parametrize("remote", [False, True])
def test_three_ctrl_c_exit_at_once_and_the_agents_still_remove_every_task(cluster, tmp_path, runs, remote):
    import signal

    hosts = tmp_path / "hosts.txt"
    if remote:
        cluster.hosts_file(hosts, cluster.hosts[:2])
    else:
        hosts.write_text("localhost slots=2\n")
    # tasks that ignore SIGTERM (like MWMS): only SIGKILL after the grace period ends them
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(300)"]
    job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--workers", "2", "--grace", "3", "--no-telemetry", "--",
              *stubborn, env=cluster.env)
    def up(task: str) -> bool:
        path = job.run_dir / "tasks" / task / "output.log"
        return path.exists() and b"up" in path.read_bytes()

    wait_for(lambda: up("worker-0") and up("worker-1"), 60, "tasks up")
    # Each Ctrl-C is sent once the one before was acknowledged: signals sent faster than a loaded
    # machine schedules ddlctl are merged by the kernel (a pending SIGINT absorbs the next).
    job.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping all tasks" in job.stderr(), 30, "the first Ctrl-C to be taken")
    # the host agents stopped: the KILL of the second Ctrl-C cannot end the job before the third
    records = json.loads((job.run_dir / "pids.json").read_text()).values()
    agents = {r["agent_pid"] for r in records if r.get("agent_pid")}
    for pid in agents:
        os.kill(pid, signal.SIGSTOP)
    try:
        job.proc.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping now: SIGKILL" in job.stderr(), 30, "the second Ctrl-C to be taken")
        job.proc.send_signal(signal.SIGINT)
        assert job.wait(30) == 130
        # the third Ctrl-C left at once: the run never got to its report (a second one waits for
        # its tasks and then writes outcome.json)
        assert not (job.run_dir / "outcome.json").exists(), "ddlctl went on to the report after the third Ctrl-C"
    finally:
        for pid in agents:
            os.kill(pid, signal.SIGCONT)
    # ddlctl is gone: each agent sees its input end and kills its tasks
    wait_for(lambda: not processes_of_run(job.run_dir.name), 3 + 10, "the agents to kill every task")


def test_a_group_restart_and_a_resumed_run_copy_the_checkpoint_to_hosts_that_do_not_share_it(tmp_path_factory,
                                                                                              tmp_path, runs):
    """mwms on two hosts with homes of their own: a killed worker's group restart copies worker:0's
    checkpoint to the other host first; then that host's agent gets SIGTERM (a spot host reclaimed)
    with no restart left, the run ends, and ``launch --resume`` copies the newer checkpoint there
    again before both workers go on from the same step to the end."""
    import signal

    apart = SshTestCluster(tmp_path_factory.mktemp("apart"), 2, separate_homes=True)
    try:
        hosts = apart.hosts_file(tmp_path / "hosts.txt")
        job = Job(runs, "--hosts", str(hosts), "-s", "mwms", "--max-restarts", "1", "--no-telemetry", "--grace", "2",
                  "--startup-timeout", "120", "--", sys.executable, "-m", "ddlctl.workloads", "--steps", "200",
                  "--min-step-ms", "30", "--checkpoint-every", "30", env=apart.env)
        steps = apart.host_home(apart.hosts[0]) / ".ddlctl" / "runs" / job.run_dir.name / "tasks" / "worker-0"
        wait_for(lambda: step_count(steps / "steps.jsonl") >= 40 or job.proc.poll() is not None, 180, "training")
        pids = json.loads((job.run_dir / "pids.json").read_text())
        os.kill(pids["worker:1"]["task_pid"], signal.SIGKILL)
        label = f"{apart.hosts[1].address}:{apart.hosts[1].port}"
        wait_for(lambda: f"copied worker:0's checkpoint to {label}" in job.stderr() or job.proc.poll() is not None,
                 120, "the group restart")
        wait_for(lambda: step_count(steps / "steps.jsonl") >= 110 or job.proc.poll() is not None, 180, "training on")
        os.kill(json.loads((job.run_dir / "pids.json").read_text())["worker:1"]["agent_pid"], signal.SIGTERM)
        assert job.wait(300) != 0, job.stderr()[-3000:]
        done = run_ddlctl("launch", "--resume", str(job.run_dir), env=apart.env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"copied worker:0's checkpoint to {label}" in done.stderr
        resumed = []
        for task in ("worker-0", "worker-1"):
            lines = [line for line in (job.run_dir / "tasks" / task / "output.log").read_text().splitlines()
                     if line.startswith("resumed from checkpoint")]
            assert len(lines) == 1, task
            resumed.append(lines[0].split(" (restart")[0])
            assert json.loads((job.run_dir / "tasks" / task / "result.json").read_text())["steps"] == 200
        assert resumed[0] == resumed[1], "both workers resumed from the same checkpoint"
        assert int(resumed[0].rsplit(" at step ", 1)[1]) >= 90, "from the newer checkpoint, past the restart's"
        assert not (apart.host_home(apart.hosts[1]) / ".ddlctl" / "runs" / job.run_dir.name / "checkpoints"
                    ).samefile(apart.host_home(apart.hosts[0]) / ".ddlctl" / "runs" / job.run_dir.name / "checkpoints")
        assert processes_of_run(job.run_dir.name) == []
    finally:
        apart.stop()


def test_a_daemon_left_on_a_host_whose_agent_was_killed_is_ended_there_with_the_job(cluster, tmp_path, runs):
    """A host agent SIGKILLed cannot end what its task started outside its process group. Once
    the job has ended, ddlctl ends what this launch left on that host (found by the run and the
    launch in its environment, over SSH) and names it; before, it ran on until ``ddlctl stop``.
    The task's folder comes back all the same (before, it stayed on the host: "connection closed")."""
    program = ("import subprocess, time, ddlctl\n"
               "daemon = subprocess.Popen(['sleep', '306'], start_new_session=True)\n"
               "print('daemon', daemon.pid, flush=True)\n"
               "for i in range(600):\n    with ddlctl.step():\n        time.sleep(0.05)\n")
    hosts = cluster.hosts_file(tmp_path / "hosts.txt", cluster.hosts[:1])
    job = Job(runs, "--hosts", str(hosts), "-s", "one_device", "--no-telemetry", "--grace", "1", "--max-restarts",
              "0", "--", sys.executable, "-c", program, env=cluster.env)
    wait_for(lambda: remote_steps(job, "worker-0") >= 5 or job.proc.poll() is not None, 120, "steps")
    daemon = int(wait_for(lambda: re.search(rb"daemon (\d+)", (runs.parent / "ddlctl.out").read_bytes()), 30,
                          "the daemon's pid").group(1))
    (agent,) = [p for p in processes_of_run(job.run_dir.name) if "ddlctl.host.agent" in " ".join(p.cmdline())]
    agent.kill()
    assert job.wait() != 0, job.stderr()[-3000:]
    said = job.stderr().replace("\n", " ")
    host = f"{cluster.hosts[0].address}:{cluster.hosts[0].port}"
    assert f"ended 1 process(es) of this run still running on {host} after its host agent was lost (started by " \
           f"a task outside its process group): {daemon} (sleep 306)" in said, said[-3000:]
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE
    assert processes_of_run(job.run_dir.name) == []
    # its task folder came back through a new agent there (its steps are in the report)
    assert "did not come back" not in said and job.steps("worker-0") >= 5, said[-3000:]
    assert not (REMOTE_RUNS / job.run_dir.name / "tasks").exists()
