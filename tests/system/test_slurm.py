"""Slurm: the allocation's parsing (pure), and launch/check/submit/stop against a real Slurm cluster
(one slurmctld, three slurmd on this machine; see ddlctl/testing/slurm.py). Faults are caused for real:
``kill -9`` of a task, ``scancel`` of the job, SIGINT to ddlctl."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlctl.cluster.slurm import (
    Node,
    allocation_cluster,
    allocation_from,
    expand_counts,
    expand_hostlist,
    parse_job_gpus,
    parse_node_addresses,
)
from ddlctl.commands.submit import (
    SubmitOptions,
    check_options,
    exit_code_of,
    hide_env_values,
    sbatch_script,
    strategy_of,
    submit,
)
from ddlctl.contract.errors import ConfigError
from ddlctl.testing.faults import step_count, wait_for
from ddlctl.testing.slurm import ADDRESSES, NODES, SlurmCluster, unavailable_reason
from ddlctl.transport.slurm import srun_argv
from tests.conftest import PROGRAMS, ROOT, ddlctl_cmd, processes_of_run

# One Slurm test cluster at a time (its nodes have fixed names and addresses, and proctrack/cgroup
# paths named by job ids that two clusters would share): `--dist loadfile` keeps this file on one
# pytest-xdist worker. (xdist_group / --dist loadgroup does not group under pytest 9: its node-id
# suffix is ignored, and two clusters ran at once.)

# -- pure ------------------------------------------------------------------------------------------


def test_host_lists_and_counts_expand_like_slurm():
    assert expand_hostlist("n[1-3]") == ["n1", "n2", "n3"]
    assert expand_hostlist("gpu[01-03,7],login") == ["gpu01", "gpu02", "gpu03", "gpu7", "login"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    with pytest.raises(ValueError):
        expand_hostlist("n[1-3")


JOB_D = """JobId=42 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=g[1-2],c1
   JOB_GRES=gpu:a100:6
     Nodes=g1 CPU_IDs=0-15 Mem=0 GRES=gpu:a100:4(IDX:0-3)
     Nodes=g2 CPU_IDs=0-7 Mem=0 GRES=gpu:a100:2(IDX:0-1)
     Nodes=c1 CPU_IDs=0-3 Mem=0 GRES=
"""
NODES_O = ("NodeName=g1 Arch=x86_64 NodeAddr=10.0.0.11 NodeHostName=g1 Port=0\n"
           "NodeName=g2 Arch=x86_64 NodeAddr=10.0.0.12 NodeHostName=g2 Port=0\n"
           "NodeName=c1 Arch=x86_64 NodeAddr=c1 NodeHostName=c1 Port=0\n")


def test_an_allocation_becomes_a_cluster_with_node_addresses_tasks_and_gpus():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "g[1-2],c1", "SLURM_TASKS_PER_NODE": "2(x2),1",
           "SLURM_JOB_CPUS_PER_NODE": "16,8,4"}
    assert parse_job_gpus(JOB_D) == {"g1": 4, "g2": 2}
    assert parse_node_addresses(NODES_O)["g2"] == "10.0.0.12"
    allocation = allocation_from(env, JOB_D, NODES_O)
    assert [(n.name, n.address, n.tasks, n.cpus, n.gpus) for n in allocation.nodes] == [
        ("g1", "10.0.0.11", 2, 16, 4), ("g2", "10.0.0.12", 2, 8, 2), ("c1", "c1", 1, 4, 0)]
    cluster = allocation_cluster(allocation, python="/opt/py/bin/python")
    assert [(h.name, h.address, h.slots, h.gpus, h.python) for h in cluster.hosts] == [
        ("g1", "10.0.0.11", 2, 4, "/opt/py/bin/python"), ("g2", "10.0.0.12", 2, 2, "/opt/py/bin/python"),
        ("c1", None, 1, 0, "/opt/py/bin/python")]
    assert "Slurm job 42" in cluster.hosts[0].source
    with pytest.raises(ConfigError, match="not inside a Slurm allocation"):
        allocation_from({}, "", "")


def test_the_agent_step_holds_the_whole_node_and_a_probe_step_one_cpu():
    node = Node(name="g1", address="10.0.0.11", tasks=2, cpus=16, gpus=4)
    agent = srun_argv("42", node, ["python3", "-m", "x"], run_id="r1")
    assert agent[:5] == ["srun", "--jobid=42", "--nodelist=g1", "--nodes=1", "--ntasks=1"]
    assert {"--overlap", "--cpus-per-task=16", "--cpu-bind=none", "--gres=gpu:4", "--job-name=ddlctl-r1"} <= set(agent)
    assert agent[-3:] == ["python3", "-m", "x"]
    probe = srun_argv("42", node, ["true"])
    assert "--cpus-per-task=1" in probe and not any(a.startswith("--gres") for a in probe)


def test_the_batch_script_runs_launch_slurm_with_the_given_options(tmp_path):
    opts = SubmitOptions(nodes=3, partition="gpu", time_limit="1:00:00", gpus_per_node=4,
                         sbatch_args=("--account=proj",), launch_args=("-s", "ps", "--", "python", "t.py", "a b"))
    script = sbatch_script(opts, tmp_path / "runs" / "r1", "r1", "/py/bin/python", "/work")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --nodes=3", "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --account=proj", "#SBATCH --chdir=/work",
                 f"#SBATCH --output={tmp_path}/runs/r1/slurm-%j.out"):
        assert line in lines
    assert lines[-1] == (f"exec /py/bin/python -m ddlctl launch --slurm --runs-dir {tmp_path}/runs --run-id r1 "
                         "-s ps -- python t.py 'a b'")
    assert strategy_of(["--strategy=ps"]) == "ps" and strategy_of(["--", "x", "-s", "ps"]) == "mwms"
    args, values = hide_env_values(["--env", "A=1=2", "--env=B=x y", "--env", "C", "-e", "E=5", "--", "prog",
                                    "--env", "D=4"])
    assert args == ("--env", "A", "--env=B", "--env", "C", "-e", "E", "--", "prog", "--env", "D=4")
    assert values == {"A": "1=2", "B": "x y", "E": "5"}, "the program's own arguments after -- are its business"
    # click's attached short form too (it once reached the script's command line, secret and all)
    args, values = hide_env_values(["-eAPI_TOKEN=hunter2", "-eKEY", "--", "prog"])
    assert args == ("--env=API_TOKEN", "-eKEY", "--", "prog") and values == {"API_TOKEN": "hunter2"}
    # a newline in a value would have written a line of the script of its own (`id > /tmp/pwned`)
    for opts in (SubmitOptions(job_name="x\nid > /tmp/pwned"), SubmitOptions(partition="gpu\r"),
                 SubmitOptions(sbatch_args=("--account=a\nid",))):
        with pytest.raises(ConfigError, match="holds a control character"):
            check_options(opts)
    # the runs folder is checked as launch checks it, before anything is written or submitted
    with pytest.raises(ConfigError, match="/tmp is writable by others"):
        submit(SubmitOptions(runs_dir="/tmp"), None, None, {})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--time"):
        check_options(SubmitOptions(time_limit="soon"))
    with pytest.raises(ConfigError, match="--hosts"):
        check_options(SubmitOptions(launch_args=("--hosts", "h.txt")))


def test_the_exit_code_is_ddlctls_own_else_slurms(tmp_path):
    assert exit_code_of(tmp_path, "FAILED", "3:0") == 3
    assert exit_code_of(tmp_path, "CANCELLED", "0:15") == 143
    assert exit_code_of(tmp_path, "CANCELLED", "0:0") == 1
    (tmp_path / "outcome.json").write_text(json.dumps({"exit_code": 7}))
    assert exit_code_of(tmp_path, "FAILED", "1:0") == 7


# -- a real Slurm cluster ----------------------------------------------------------------------------

WHY_NOT = unavailable_reason()
def needs_slurm(test):  # noqa: ANN001, ANN201
    """A test on the real Slurm cluster: slow (TensorFlow), skipped with the reason when none can start."""
    skip = pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm test cluster: {WHY_NOT}")
    return pytest.mark.cluster(skip(test))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def idle(slurm):
    yield slurm
    slurm.cancel_all()


def salloc(cluster: SlurmCluster, *args: str, nodes: int = 3, options: tuple[str, ...] = ()) -> list[str]:
    return ["salloc", f"-N{nodes}", "--ntasks-per-node=1", "--quiet", *options, *args]


def run_in_allocation(cluster: SlurmCluster, *args: str, nodes: int = 3, timeout: float = 240):
    env = {**cluster.env, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(salloc(cluster, *ddlctl_cmd(*args), nodes=nodes), capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def remote_steps(run_id: str, task: str) -> int:
    """Steps a task on a node recorded so far (nodes keep task files under ~/.ddlctl until the end)."""
    return step_count(Path.home() / ".ddlctl" / "runs" / run_id / "tasks" / task / "steps.jsonl")


def run_dir_of(runs: Path) -> Path:
    return wait_for(lambda: next((p for p in runs.iterdir() if (p / "plan.json").exists()), None), 120,
                    "the run directory")


#: tasks that listen and step without TensorFlow, for tests of what happens around a job
IDLE = ("--", sys.executable, str(PROGRAMS / "idle_server.py"))


def running_launch(cluster: SlurmCluster, runs: Path, *args: str, task: str = "worker-0", count: int = 3,
                   nodes: int = 3, shell_after: str | None = None,
                   options: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
    """``ddlctl launch --slurm ARGS`` inside a new allocation (``salloc OPTIONS``), once ``task``
    has recorded ``count`` steps; with ``shell_after``, run through bash followed by that shell text."""
    launch = ddlctl_cmd("launch", "--slurm", "--runs-dir", str(runs), *args)
    argv = ["bash", "-c", f"{' '.join(launch)}; {shell_after}"] if shell_after else launch
    proc = subprocess.Popen(salloc(cluster, *argv, nodes=nodes, options=options), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**cluster.env, "NO_COLOR": "1"}, cwd=ROOT)
    run_dir = run_dir_of(runs)
    wait_for(lambda: remote_steps(run_dir.name, task) >= count or proc.poll() is not None, 180, f"{task} steps")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    return proc, run_dir


@needs_slurm
def test_host_lists_expand_as_scontrol_does(slurm):
    for expression in ("n[1-3]", "a[01-03,7],b", "r[1-2]n[1-2]"):
        out = slurm.run("scontrol", "show", "hostnames", expression).stdout.split()
        assert expand_hostlist(expression) == out


@needs_slurm
def test_a_crashed_task_is_the_root_cause_with_its_own_exit_code(idle, runs):
    done = run_in_allocation(idle, "launch", "--slurm", "-s", "mwms", "--grace", "1", "--runs-dir", str(runs), "--",
                             sys.executable, str(PROGRAMS / "crash_program.py"))
    assert done.returncode == 7, done.stderr[-3000:]
    assert "worker:1 on n2" in done.stderr and "exit code 7" in done.stderr
    assert "disk full on purpose" in done.stderr + done.stdout
    run_dir = next(runs.iterdir())
    assert json.loads((run_dir / "outcome.json").read_text())["root_cause"]["task"] == "worker:1"
    assert not processes_of_run(run_dir.name)


@needs_slurm
def test_a_ps_worker_killed_then_its_nodes_agent_step_killed_are_each_restarted_through_a_step(idle, runs):
    # (paced, at least 40 ms a step, in batches of 16: 400 steps last 16 s or more on any machine, time
    # for both faults, at a quarter of an unpaced default batch's CPU)
    proc, run_dir = running_launch(idle, runs, "-s", "ps", "--max-restarts", "2", "--", sys.executable, "-m",
                                   "ddlctl.workloads", "--steps", "400", "--batch-size", "16", "--min-step-ms", "40",
                                   task="chief-0", count=20, nodes=2)
    plan = {t["name"]: t["host"] for t in json.loads((run_dir / "plan.json").read_text())["tasks"]}
    node = plan["worker:1"]
    assert [name for name, host in plan.items() if host == node] == ["worker:1"], plan
    pids = json.loads((run_dir / "pids.json").read_text())
    # 1. the task alone: restarted in place through its node's agent step
    os.kill(pids["worker:1"]["task_pid"], signal.SIGKILL)
    wait_for(lambda: json.loads((run_dir / "pids.json").read_text())["worker:1"].get("task_pid")
             not in (None, pids["worker:1"]["task_pid"]) or proc.poll() is not None, 120, "worker:1 restarted")
    count = remote_steps(run_dir.name, "chief-0")
    wait_for(lambda: remote_steps(run_dir.name, "chief-0") >= count + 10 or proc.poll() is not None, 120,
             "the chief to step on")
    # 2. the node's agent step (the agent and its task die): a new step takes the node back
    record = json.loads((run_dir / "slurm.json").read_text())
    listed = dict(line.split() for line in idle.run("squeue", "-h", "-s", "-j", record["job_id"], "-o",
                                                      "%i %N").stdout.splitlines())
    step = next(s for s in record["steps"] if listed.get(s) == node)
    assert idle.run("scancel", "--signal=KILL", step).returncode == 0
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert [h["host"] for h in outcome["hosts_lost"]] == [node]
    assert [r["task"] for r in outcome["restarts"]] == ["worker:1", "worker:1"]
    assert [r["cause"] for r in outcome["restarts"]] == ["signal", "host-lost"]
    restarted = {t["name"]: t["restarts"] for t in outcome["tasks"]}
    assert restarted.pop("worker:1") == 2 and set(restarted.values()) == {0}, "the others were reused"
    assert json.loads((run_dir / "pids.json").read_text())["worker:1"]["agent_pid"] != pids["worker:1"]["agent_pid"]
    assert f"reconnected to {node}" in err
    assert not processes_of_run(run_dir.name)


def _ddlctl_child(salloc_proc: subprocess.Popen) -> psutil.Process:
    def find():
        for child in psutil.Process(salloc_proc.pid).children(recursive=True):
            if "ddlctl" in " ".join(child.cmdline()) and "launch" in child.cmdline():
                return child
        return None

    return wait_for(find, 30, "ddlctl under salloc")


@needs_slurm
def test_scancel_of_the_job_fails_the_run_naming_it_and_leaves_no_process(idle, runs):
    proc, run_dir = running_launch(idle, runs, "-s", "mwms", *IDLE, nodes=2)
    job = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    started = time.monotonic()
    assert idle.run("scancel", job).returncode == 0
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - started < 60  # no waiting out --host-timeout: the job cannot come back
    assert proc.returncode not in (0, None), err[-3000:]
    assert f"Slurm job {job} is" in err and "CANCELLED" in err  # the job's state, or the step's end
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert "CANCELLED" in outcome["failure"]
    assert not processes_of_run(run_dir.name)


@needs_slurm
def test_ctrl_c_stops_every_task_and_leaves_the_allocation_to_its_owner(idle, runs, tmp_path):
    after = tmp_path / "after.txt"
    proc, run_dir = running_launch(idle, runs, "-s", "mwms", *IDLE, nodes=2, shell_after=(
        f'echo "rc=$?" > {after}; squeue -h -j $SLURM_JOB_ID -o %T >> {after}'))
    _ddlctl_child(proc).send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    rc, state = after.read_text().split()
    assert rc == "rc=130"
    assert state == "RUNNING"  # ddlctl cancelled its steps, not the owner's allocation
    assert not processes_of_run(run_dir.name)


@needs_slurm
def test_check_slurm_probes_every_node_through_srun(idle):
    env = {**idle.env, "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run(salloc(idle, *ddlctl_cmd("check", "--slurm", "--json")), capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = json.loads(done.stdout)
    assert [r["host"] for r in reports] == list(NODES)
    assert all(r["usable"] and r["tensorflow"] for r in reports)
    outside = subprocess.run(ddlctl_cmd("check", "--slurm"), capture_output=True, text=True, env=env, cwd=ROOT)
    assert outside.returncode == 2 and "not inside a Slurm allocation" in outside.stderr


@needs_slurm
def test_dry_run_shows_each_nodes_srun_command_and_starts_nothing(idle, runs):
    done = run_in_allocation(idle, "launch", "--slurm", "-s", "ps", "--dry-run", "--runs-dir", str(runs), nodes=2)
    assert done.returncode == 0, done.stderr[-2000:]
    for node in ("n1", "n2"):
        assert "srun --jobid=" in done.stdout and f"--nodelist={node} --nodes=1 --ntasks=1" in done.stdout
    assert "ddlctl.host.agent" in done.stdout
    assert not any(runs.iterdir())


@needs_slurm
def test_submit_follow_streams_the_job_and_ends_with_the_report(idle, runs):
    env = {**idle.env, "NO_COLOR": "1", "COLUMNS": "200"}
    # (one node, one task: launch --slurm across nodes is the other tests')
    done = subprocess.run(ddlctl_cmd("submit", "--nodes", "1", "--time", "10", "--runs-dir", str(runs), "--follow",
                                     "-s", "one_device", "--steps", "12", "--trace", "5-8", "--data-workers", "1",
                                     "--env", "DB_URL=postgres://u:pw@db/x"),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.split()[0]
    run_dir = next(runs.iterdir())
    assert f"submitted Slurm job {job}; run directory {run_dir}" in done.stderr
    assert "final loss" in done.stdout and "throughput" in done.stdout  # the streamed report
    script = run_dir / "submit.sbatch"
    assert script.read_text().startswith("#!/bin/bash") and (script.stat().st_mode & 0o777) == 0o600
    assert script.read_text().rstrip().endswith("--env DB_URL") and "pw@" not in script.read_text(), "names only"
    # launch inside the job found the value in its environment (a bare --env KEY without one fails)
    assert json.loads((run_dir / "plan.json").read_text())["request"]["env"] == {"DB_URL": "***"}
    assert "pw@" not in (run_dir / "plan.json").read_text()
    assert (run_dir / f"slurm-{job}.out").is_file()
    assert json.loads((run_dir / "outcome.json").read_text())["ok"]
    assert job not in idle.jobs()
    # --trace passed through the batch script: the task's capture, in the run's profile logdir
    assert (run_dir / "profile" / "plugins" / "profile" / "steps-5-8" / "worker-0.xplane.pb").stat().st_size > 0
    # --data-workers: the tf.data service on the allocation's node, started through its job steps
    plan = json.loads((run_dir / "plan.json").read_text())
    node = {t["name"]: t["host"] for t in plan["tasks"]}
    assert set(node) == {"worker:0", "dispatcher:0", "data:0"} and len(set(node.values())) == 1
    assert "ddlctl data service: data:0 serves input at " in (run_dir / "tasks" / "data-0" / "output.log").read_text()
    assert "DDLCTL_DATA_SERVICE" in next(t for t in plan["tasks"] if t["name"] == "worker:0")["env"]


@needs_slurm
def test_ctrl_c_of_submit_follow_leaves_the_job_running_and_stop_cancels_it(idle, runs):
    env = {**idle.env, "NO_COLOR": "1"}
    # (what Ctrl-C and stop do to a submitted job, not TensorFlow: its tasks listen and step without
    # it; unpaced TensorFlow workers trained on both nodes from their second step to the stop)
    proc = subprocess.Popen(ddlctl_cmd("submit", "--nodes", "2", "--runs-dir", str(runs), "--follow", "-s", "mwms",
                                       *IDLE), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    run_dir = wait_for(lambda: next(runs.iterdir(), None), 60, "the run directory")
    wait_for(lambda: (run_dir / "submit.json").exists(), 60, "the submission")
    job = json.loads((run_dir / "submit.json").read_text())["job_id"]
    wait_for(lambda: (run_dir / "plan.json").exists(), 120, "the job to start ddlctl")
    wait_for(lambda: remote_steps(run_dir.name, "worker-0") >= 2, 180, "worker steps")
    proc.send_signal(signal.SIGINT)  # no terminal to ask on: the job keeps running
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert f"job {job} keeps running" in err and f"ddlctl stop {run_dir}" in err
    assert job in idle.jobs()
    stopped = subprocess.run(ddlctl_cmd("stop", str(run_dir)), capture_output=True, text=True, env=env, cwd=ROOT)
    assert stopped.returncode == 0 and f"cancelled Slurm job: {job}" in stopped.stdout
    wait_for(lambda: job not in idle.jobs(), 60, "the job to end")
    wait_for(lambda: not processes_of_run(run_dir.name), 30, "every process of the run to end")


@needs_slurm
def test_a_missing_python_on_the_nodes_is_named_with_what_to_do(idle, runs):
    done = run_in_allocation(idle, "launch", "--slurm", "--python", "/nonexistent/bin/python", "--runs-dir",
                             str(runs), nodes=2)
    assert done.returncode == 1, done.stderr[-2000:]
    for node in ("n1", "n2"):
        assert f"Python '/nonexistent/bin/python' not found on node {node}" in done.stderr
    assert "--python PATH" in done.stderr and "Traceback" not in done.stderr
    with_hosts = run_in_allocation(idle, "launch", "--slurm", "--hosts", "hosts.txt", nodes=1)
    assert with_hosts.returncode == 2 and "drop --hosts" in with_hosts.stderr


@needs_slurm
def test_check_bench_measures_every_node_through_its_step(idle, tmp_path):
    env = {**idle.env, "NO_COLOR": "1", "COLUMNS": "200"}
    saved = tmp_path / "profile.json"
    done = subprocess.run(salloc(idle, *ddlctl_cmd("check", "--slurm", "--bench", "--bench-seconds", "0.2", "--save",
                                                   str(saved)), nodes=2),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    profile = json.loads(saved.read_text())
    assert sorted(profile["hosts"]) == ["n1", "n2"]
    assert all(h["speed"] > 0 for h in profile["hosts"].values())
    assert [(link["from"], link["to"]) for link in profile["links"]] == [("n1", "n2")]
    assert profile["links"][0]["bandwidth_bytes_per_s"] > 0
    assert not list((Path.home() / ".ddlctl" / "bench").glob("*/*"))  # nothing of it stays on the nodes


@needs_slurm
def test_stop_of_a_run_inside_an_allocation_cancels_its_steps_not_the_job(idle, runs, tmp_path):
    env = {**idle.env, "NO_COLOR": "1"}
    after = tmp_path / "after.txt"
    proc, run_dir = running_launch(idle, runs, "-s", "mwms", *IDLE, nodes=2, shell_after=(
        f'echo "rc=$?" > {after}; squeue -h -j $SLURM_JOB_ID -o %T >> {after}'))
    record = json.loads((run_dir / "slurm.json").read_text())
    stopped = subprocess.run(ddlctl_cmd("stop", str(run_dir)), capture_output=True, text=True, env=env, cwd=ROOT)
    assert stopped.returncode == 0, stopped.stderr
    assert all(step in stopped.stdout for step in record["steps"])
    proc.communicate(timeout=120)
    rc, state = after.read_text().split()
    assert rc != "rc=0" and state == "RUNNING"
    assert not processes_of_run(run_dir.name)


@needs_slurm
def test_compare_runs_every_strategy_in_the_allocation_single_host_ones_on_its_first_node(idle, runs):
    """Each strategy a launch inside the allocation: one_device on its first node; mwms in a job step
    per node, with the nodes' addresses, and nothing left of it."""
    done = run_in_allocation(idle, "compare", "--slurm", "--strategies", "one_device,mwms", "--steps", "8",
                             "--batch-size", "48", "--runs-dir", str(runs), "--json", nodes=3)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {r["strategy"]: r for r in result["rows"]}
    assert rows["one_device"]["error"] is None and rows["mwms"]["error"] is None
    assert rows["mwms"]["workers"] == 3
    assert "one_device runs on one node: n1" in done.stderr
    run_dirs = {json.loads(p.read_text())["strategy"]: p.parent
                for p in Path(result["compare_dir"]).glob("*/plan.json")}
    plans = {strategy: json.loads((folder / "plan.json").read_text()) for strategy, folder in run_dirs.items()}
    hosts = {s: sorted({t["host"] for t in p["tasks"] if t["role"] != "agent"}) for s, p in plans.items()}
    assert hosts == {"one_device": ["n1"], "mwms": list(NODES)}
    run_dir, workers = run_dirs["mwms"], [t for t in plans["mwms"]["tasks"] if t["role"] == "worker"]
    spec = json.loads(workers[0]["env"]["TF_CONFIG"])["cluster"]["worker"]
    # the cluster spec carries each node's NodeAddr, never its (unresolvable) name
    assert sorted(a.rsplit(":", 1)[0] for a in spec) == sorted(ADDRESSES.values())
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["ok"] and all(t["state"] == "succeeded" for t in outcome["tasks"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {t["name"]: t["steps"] for t in summary["tasks"]} == {f"worker:{i}": 8 for i in range(3)}
    assert sorted(p.name for p in (run_dir / "telemetry").glob("*.jsonl")) == [f"{n}.jsonl" for n in NODES]
    record = json.loads((run_dir / "slurm.json").read_text())
    assert len(record["steps"]) == 3 and all(s.startswith(record["job_id"] + ".") for s in record["steps"])
    assert not processes_of_run(run_dir.name)


@needs_slurm
def test_min_workers_a_node_taken_out_of_the_allocation_leaves_and_mwms_trains_on_inside_it(idle, runs):
    """The last test of the file: a node set DOWN leaves a ``--no-kill`` allocation for good (no step
    can start there again). Its worker leaves the job, the two others restart as a smaller cluster
    inside the allocation and finish; the node is never taken back (it is not the job's any more)."""
    # paced (at least 60 ms a step): the job cannot end in under 8 s, before the node is gone (as
    # 400 unpaced steps could not on a machine twice this one's speed; its peers then wait at the
    # next all-reduce until two restart), and the two that finish run 140 steps, not 400
    proc, run_dir = running_launch(idle, runs, "-s", "mwms", "--max-restarts", "1", "--min-workers", "2",
                                   "--host-timeout", "3", "--grace", "2", "--", sys.executable, "-m",
                                   "ddlctl.workloads", "--steps", "140", "--batch-size", "96", "--min-step-ms", "60",
                                   nodes=3, options=("--no-kill",))
    node = {t["name"]: t["host"] for t in json.loads((run_dir / "plan.json").read_text())["tasks"]}["worker:2"]
    try:
        assert idle.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=ddlctl-test").returncode == 0
        out, err = proc.communicate(timeout=300)
    finally:
        idle.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    assert proc.returncode == 0, err[-3000:]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    [left] = outcome["membership"]
    assert (left["workers"], left["left"], left["host"]) == (["worker:0", "worker:1"], ["worker:2"], node)
    assert f"worker:2 left the job (host {node} did not come back within --host-timeout 3s)" in err
    assert outcome["hosts_lost"][0]["reason"] == f"connection closed: srun: error: Node failure on {node}"
    assert json.loads((run_dir / "tasks" / "worker-0" / "result.json").read_text())["steps"] == 140
    assert not processes_of_run(run_dir.name)


def submit_requeue(idle: SlurmCluster, runs: Path, *args: str, steps: int,
                   follow: bool = False) -> tuple[str, Path, subprocess.Popen | None]:
    """``ddlctl submit --nodes 1 --requeue ARGS`` of the built-in workload on one device, paced at
    100 ms a step: the job id, its run folder and (``--follow``) the submit still following it."""
    proc = subprocess.Popen(ddlctl_cmd("submit", "--nodes", "1", "--requeue", *args, *(["--follow"] if follow else []),
                                       "--runs-dir", str(runs), "-s", "one_device", "--", sys.executable, "-m",
                                       "ddlctl.workloads", "--steps", str(steps), "--batch-size", "16",
                                       "--min-step-ms", "100", "--checkpoint-every", "40"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**idle.env, "NO_COLOR": "1"}, cwd=ROOT)
    assert proc.stdout is not None
    job = proc.stdout.readline().split()[0] if follow else proc.communicate(timeout=60)[0].split()[0]
    assert job.isdigit() and (follow or proc.returncode == 0), job
    return job, run_dir_of(runs), proc if follow else None


_HELD: dict[str, float] = {}


def release_requeued(idle: SlurmCluster, job: str) -> None:
    """Slurm holds a requeued batch job back (its begin time about 2 minutes on): let it start, 5 s
    after the hold was first seen (at once, the node may not have let the last attempt go: Slurm then
    kills the new one, "Job credential revoked")."""
    shown = idle.run("scontrol", "show", "job", job).stdout
    if "JobState=PENDING" not in shown or "Reason=BeginTime" not in shown:
        _HELD.pop(job, None)
    elif time.monotonic() - _HELD.setdefault(job, time.monotonic()) >= 5:
        idle.run("scontrol", "update", f"JobId={job}", "StartTime=now")


@needs_slurm
def test_a_job_longer_than_its_time_limit_completes_across_attempts_of_one_run(idle, runs):
    """submit --time 1 --requeue: 500 steps of 100 ms do not fit in a 1-minute job. Each attempt gets
    Slurm's real time-limit signal 40 s before its end (up to 30 s late: Slurm looks every 30 s), its
    task checkpoints and stops, ddlctl requeues the job, and the next attempt goes on from that step in
    the same run folder; once the job has trained 10 steps it is also preempted (`scontrol requeue`,
    what PreemptMode=REQUEUE does). The run completes (exit 0) in at least three attempts."""
    job, run_dir, _ = submit_requeue(idle, runs, "--time", "1", "--signal-before", "40", "--max-requeues", "20",
                                     steps=500)
    assert "#SBATCH --time=1\n" in (run_dir / "submit.sbatch").read_text()

    def trained(count: int) -> bool:  # (a signal may come before the first step: that attempt trains none)
        release_requeued(idle, job)
        return remote_steps(run_dir.name, "worker-0") >= count

    wait_for(lambda: trained(10), 300, "10 steps")
    assert idle.run("scontrol", "requeue", job).returncode == 0
    wait_for(lambda: trained(10 ** 9) or job not in idle.jobs(), 600, "the job to end")
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["ok"], outcome["exit_code"]) == (True, 0), outcome.get("failure")
    section = json.loads((run_dir / "summary.json").read_text())["attempts"]
    rows = section["attempts"]
    ended = [r["ended_by"] for r in rows]
    assert len(rows) >= 3 and ended[-1] == "completed" and ended.count("preempted (SIGTERM)") == 1, rows
    assert set(ended[:-1]) == {"preempted (SIGTERM)", "time limit"}, rows
    # every step trained, each attempt from the step after its predecessor's checkpoint: the
    # preempted one's (periodic, every 40 steps, or on the SIGTERM) or the time limit's (on the
    # signal); an attempt whose signal came before its first step, or after the last, trained none
    done = [r for r in rows if r["steps"]]
    assert done[0]["steps"][0] == 1 and done[-1]["steps"][1] == 500
    for before, after in zip(done, done[1:], strict=False):
        assert before["steps"][1] - 40 < after["steps"][0] <= before["steps"][1] + 1, rows
    after_preemption = rows[ended.index("preempted (SIGTERM)") + 1]
    assert all(r["redone"] in (0, None) for r in rows if r is not after_preemption), "saved on the signal"
    assert section["steps_redone"] < 40
    assert 0 < section["goodput"] < 1 and section["span_s"] > sum(r["wall_s"] for r in rows) - 1
    said = " ".join((run_dir / f"slurm-{job}.out").read_text().split())  # (every attempt's output, appended)
    assert re.search(rf"ddlctl: requeueing Slurm job {job} at its time limit \(1 of --max-requeues 20\): attempt "
                     r"\d+ goes on from the newest checkpoint", said), said[-3000:]
    assert json.loads((run_dir / "tasks" / "worker-0" / "result.json").read_text())["steps"] == 500
    assert processes_of_run(run_dir.name) == []


@needs_slurm
def test_max_requeues_time_limits_end_the_run_saying_where_its_checkpoint_is(idle, runs):
    """submit --requeue --max-requeues 1 --follow: the first time-limit signal (`scancel --signal=USR1
    --batch`: what --signal=B:USR1@S sends) requeues the job, the second ends the run there; --follow
    streams both attempts and exits with the run's code."""
    job, run_dir, following = submit_requeue(idle, runs, "--max-requeues", "1", "--signal-before", "60", steps=400,
                                             follow=True)
    assert following is not None
    script = (run_dir / "submit.sbatch").read_text()
    assert "#SBATCH --requeue\n" in script and "#SBATCH --signal=B:USR1@60\n" in script
    assert "export DDLCTL_MAX_REQUEUES=1\n" in script

    def steps_on(more: int) -> None:  # (the node keeps the task folders of attempts it could not send back)
        count = remote_steps(run_dir.name, "worker-0")
        wait_for(lambda: remote_steps(run_dir.name, "worker-0") >= count + more, 180, f"{more} more steps")

    steps_on(12)
    assert idle.run("scancel", "--signal=USR1", "--batch", job).returncode == 0
    wait_for(lambda: release_requeued(idle, job) or (run_dir / "attempts" / "1").is_dir(), 120, "attempt 2")
    steps_on(8)
    assert idle.run("scancel", "--signal=USR1", "--batch", job).returncode == 0
    wait_for(lambda: job not in idle.jobs(), 120, "the job to end")
    streamed, _ = following.communicate(timeout=60)
    assert following.returncode == 143 and streamed.count(f"ddlctl run {run_dir.name}: one_device") == 2, streamed
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["ok"], outcome["exit_code"], outcome["attempt"]) == (False, 143, 2)
    assert [(a["attempt"], a["exit_code"], a["reason"]) for a in outcome["attempts"]] == [(1, 143, "time-limit")]
    assert outcome["failure"].startswith("the time limit is near (Slurm's SIGUSR1): every task "
                                         "checkpoints and stops (SIGTERM; SIGKILL 30s later)")
    said = " ".join((run_dir / f"slurm-{job}.out").read_text().split())
    assert f"ddlctl: Slurm requeued job {job}: attempt 2 of run {run_dir.name} goes on in {run_dir}" in said
    assert f"ddlctl: the time limit ends run {run_dir.name} at attempt 2: --max-requeues 1 spent; its newest " \
           "checkpoint stays in " in said
    # attempt 2 resumed from the checkpoint attempt 1 wrote on the SIGTERM (past the periodic one at 40)
    [resumed] = [int(k) for k in re.findall(r"resumed from checkpoint \S+ at step (\d+)", said)]
    assert resumed >= 12 and "checkpoint at step" in said and "on SIGTERM: stopping" in said
    diagnosis = json.loads((run_dir / "summary.json").read_text())["diagnosis"]
    assert any(line.startswith("this run took 2 attempts over ") for line in diagnosis)
    assert job not in idle.jobs() and processes_of_run(run_dir.name) == []
