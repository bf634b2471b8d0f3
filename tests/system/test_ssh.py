"""Launching over SSH against real OpenSSH servers on loopback addresses."""

from __future__ import annotations

import hashlib
import io
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from ddlctl.testing.sshd import SshTestCluster, _keygen, free_port, libfaketime, sshd_available
from tests.conftest import PROGRAMS, ddlctl_cmd, only_run_dir, processes_of_run, run_ddlctl
from tests.system.test_profile import steps_of

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs root and openssh-server")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = SshTestCluster(tmp_path_factory.mktemp("ssh"), 3)
    yield hosts
    hosts.stop()


@pytest.fixture
def hosts_file(cluster, tmp_path):
    return cluster.hosts_file(tmp_path / "hosts.txt")


def ssh_launch(cluster, *args, timeout=300, home=None):
    env = cluster.env
    if home is not None:
        env["HOME"] = str(home)
    return run_ddlctl("launch", *args, timeout=timeout, env=env)


def server_address(pid_json: Path) -> str:
    """``127.0.0.3 2222`` part of SSH_CONNECTION recorded by the task's host agent."""
    client_ip, client_port, server_ip, server_port = json.loads(pid_json.read_text())["ssh_connection"].split()
    return f"{server_ip}:{server_port}"


# asynchronous ps training with 3 workers needs more steps than synchronous mwms to learn reliably
STEPS_OVER_SSH = {"mwms": 30, "ps": 80}


def check_ssh_run(cluster, run_dir: Path, strategy: str, hosts=None) -> None:  # noqa: ANN001
    """Each task came in through the sshd of the host it was planned on (``hosts``: the cluster's,
    or these), trained, and its files came back; nothing is left running and the hosts keep only
    the run's checkpoints."""
    steps = STEPS_OVER_SSH[strategy]
    plan = json.loads((run_dir / "plan.json").read_text())
    expected = {h.address for h in hosts or cluster.hosts}
    seen = set()
    for task in plan["tasks"]:
        folder = run_dir / "tasks" / task["name"].replace(":", "-")
        assert server_address(folder / "pid.json") == task["host"]
        seen.add(task["host"].split(":")[0])
        assert (folder / "output.log").stat().st_size > 0
    assert seen == expected
    trainer = "chief-0" if strategy == "ps" else f"worker-{len(expected) - 1}"
    records = (run_dir / "tasks" / trainer / "steps.jsonl").read_text().splitlines()
    assert len(records) == steps, "step files come back from the remote host"
    assert json.loads((run_dir / "tasks" / trainer / "result.json").read_text())["accuracy"] > 0.2
    assert processes_of_run(run_dir.name) == []
    # the hosts' side of the run is removed once its files are back; its checkpoints (the model) stay
    remote = cluster.host_home(cluster.hosts[0]) / ".ddlctl" / "runs" / run_dir.name
    assert sorted(p.name for p in remote.iterdir()) == ["checkpoints"]
    assert list((remote / "checkpoints").glob("ckpt-*.index"))
    # and they stay the user's alone: no other user of the host may read the model
    kept = [remote, remote / "checkpoints", *(remote / "checkpoints").iterdir()]
    assert all(p.stat().st_mode & 0o077 == 0 for p in kept), {p.name: oct(p.stat().st_mode) for p in kept}


@pytest.mark.cluster
def test_ps_builtin_workload_across_three_ssh_hosts(cluster, hosts_file, runs):
    # --trace: the chief captures itself and, through the profiler ports planned on their hosts, every
    # server; the traces come back with its folder
    result = ssh_launch(cluster, "--hosts", str(hosts_file), "--strategy", "ps", "--steps", str(STEPS_OVER_SSH["ps"]),
                        "--trace", "30-40", "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    check_ssh_run(cluster, run_dir, "ps")
    plan = json.loads((run_dir / "plan.json").read_text())
    tasks = {t["name"]: t for t in plan["tasks"]}
    served = {name: int(t["env"]["DDLCTL_PROFILER_SERVE"]) for name, t in tasks.items() if name != "chief:0"}
    assert all(port != tasks[name]["port"] for name, port in served.items())  # (planned apart from TF's)
    cluster_spec = json.loads(tasks["chief:0"]["env"]["TF_CONFIG"])["cluster"]
    assert json.loads(tasks["chief:0"]["env"]["DDLCTL_PROFILER_ADDRESSES"]) == {  # (on each server's host)
        name: cluster_spec[name.split(":")[0]][int(name.split(":")[1])].rpartition(":")[0] + f":{port}"
        for name, port in served.items()}
    capture = json.loads((run_dir / "tasks" / "chief-0" / "capture.json").read_text())
    assert capture["steps"][0] >= 30 and capture["steps"][1] >= 40 and "servers_error" not in capture
    traced = sorted(p.name for p in (run_dir / "profile" / "plugins" / "profile" / "steps-30-40").iterdir())
    assert traced == sorted(f"{t['name'].replace(':', '-')}.xplane.pb" for t in plan["tasks"])
    traces = json.loads((run_dir / "summary.json").read_text())["traces"]["tasks"]
    assert all(t["parts"]["compute"] > 0 for t in traces if t["task"].startswith("worker:")), traces
    # which ps each worker's closures exchange tensors with, and whom the ps serves (the rendezvous keys)
    # (a worker that ran no closure while it was traced exchanged nothing)
    peers = {t["task"]: t["rpc_peers"] for t in traces}
    workers = [name for name in peers if name.startswith("worker:")]
    assert any(peers[name] for name in workers) and all(set(peers[name]) <= {"ps:0", "chief:0"} for name in workers)
    assert peers["ps:0"] and set(peers["ps:0"]) <= {"chief:0", *workers}, peers


def test_a_host_without_sftp_gets_the_code_and_gives_the_results_back(tmp_path, runs):
    from ddlctl.transport.remote import bundle_path, code_bundle

    bare = SshTestCluster(tmp_path / "nosftp", 2, separate_homes=True, sftp=False)
    try:
        hosts = bare.hosts_file(tmp_path / "hosts.txt")
        # the first host holds this very bundle cut short (an upload that died midway, by an older
        # ddlctl): it is not run but sent again
        _, bundle = code_bundle()
        planted = bare.host_home(bare.hosts[0]) / bundle_path().removeprefix("~/")
        planted.parent.mkdir(parents=True)
        planted.write_bytes(bundle[:len(bundle) // 2])
        # (what is copied, not TensorFlow: tasks that import ddlctl from the bundle, listen and step)
        result = ssh_launch(bare, "--hosts", str(hosts), "-s", "mwms", "--runs-dir", str(runs), "--",
                            sys.executable, str(PROGRAMS / "idle_server.py"), "16")
        assert result.returncode == 0, result.stderr[-3000:]
        run_dir = only_run_dir(runs)
        for i, host in enumerate(bare.hosts):
            records = (run_dir / "tasks" / f"worker-{i}" / "steps.jsonl").read_text().splitlines()
            assert [json.loads(r)["step"] for r in records] == list(range(1, 17))
            assert f"worker:{i} listening at" in (run_dir / "tasks" / f"worker-{i}" / "output.log").read_text()
            home = bare.host_home(host) / ".ddlctl"
            assert len(list((home / "code").glob("ddlctl-*.zip"))) == 1, "the code bundle, cached by content"
            [zipped] = (home / "code").glob("ddlctl-*.zip")
            sent = zipped.read_bytes()  # (the .pyc bytes differ from one interpreter's run to another's)
            assert len(sent) > len(bundle) // 2 and zipfile.ZipFile(io.BytesIO(sent)).testzip() is None, \
                "whole, the planted half replaced"
            assert (home / "code" / f"{zipped.name}.sha256").read_text().strip() == hashlib.sha256(sent).hexdigest()
            left = sorted(p.name for p in (home / "runs" / run_dir.name).iterdir()) \
                if (home / "runs" / run_dir.name).exists() else []
            assert left == [], (host.address, left)
        assert processes_of_run(run_dir.name) == []
    finally:
        bare.stop()


HOSTILE = ["two words", "it's", 'say "hi"', "$(touch {marker})", "`touch {marker}`",
           "; touch {marker}", "line1\nline2", "ünïcødé ✓", "", "$HOME", "*", "\\", "-", "--x=y"]


def test_hostile_arguments_arrive_byte_identical_and_nothing_runs(cluster, tmp_path, runs):
    marker = tmp_path / "pwned"
    args = [a.format(marker=marker) for a in HOSTILE]
    hosts = cluster.hosts_file(tmp_path / "one.txt", cluster.hosts[:1])
    program = "import json, os, sys; print('ARGS' + json.dumps([sys.argv[1:], os.environ['HOSTILE']]))"
    result = ssh_launch(cluster, "--hosts", str(hosts), "--strategy", "one_device", "--runs-dir", str(runs),
                        "--env", f"HOSTILE={args[3]} {args[6]} {args[1]}",
                        "--", sys.executable, "-c", program, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if "ARGS" in line)
    received, env_value = json.loads(line.split("ARGS", 1)[1])
    assert received == args
    assert env_value == f"{args[3]} {args[6]} {args[1]}"
    assert not marker.exists()


def _fails_fast(result, started, fragments, limit):
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < limit
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def home_with_key(cluster, tmp_path, key_name="id_ed25519"):
    """A fresh HOME whose ~/.ssh holds only the test user key (no known_hosts)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / key_name
    key.write_bytes(cluster.user_key.read_bytes())
    key.chmod(0o600)
    return home


def test_unknown_host_key_refused_then_accepted_and_recorded(cluster, tmp_path, runs):
    home = home_with_key(cluster, tmp_path)
    host = cluster.hosts[0]
    hosts = cluster.hosts_file(tmp_path / "one.txt", [host])
    started = time.monotonic()
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--", "true", home=home)
    _fails_fast(result, started, [f"{host.address}", "unknown", "--accept-new-host-keys"], 30)
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--accept-new-host-keys", "--", "true", home=home)
    assert result.returncode == 0, result.stderr
    recorded = (home / ".ssh" / "known_hosts").read_text()
    assert host.known_hosts_entry.rsplit(" ", 1)[1] in recorded
    assert f"[{host.address}]:{host.port}" in recorded
    # with HashKnownHosts yes (Debian's default), the name is recorded hashed, as OpenSSH does, and
    # the entry is found again: no flag needed the next time
    (home / ".ssh" / "known_hosts").unlink()
    (home / ".ssh" / "config").write_text("Host *\n  HashKnownHosts yes\n")
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--accept-new-host-keys", "--", "true", home=home)
    assert result.returncode == 0, result.stderr
    [line] = (home / ".ssh" / "known_hosts").read_text().splitlines()
    assert line.startswith("|1|") and host.address not in line, line
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--", "true", home=home)
    assert result.returncode == 0, result.stderr


def test_a_host_key_the_system_publishes_is_trusted_without_accepting_anything(cluster, tmp_path, runs):
    # the administrators' known-hosts file (/etc/ssh/ssh_known_hosts by default; here named by
    # GlobalKnownHostsFile) knows the host, the user's own file does not exist
    home = home_with_key(cluster, tmp_path)
    host = cluster.hosts[0]
    published = tmp_path / "ssh_known_hosts"
    published.write_text(host.known_hosts_entry + "\n")
    (home / ".ssh" / "config").write_text(f"Host *\n  GlobalKnownHostsFile {published}\n"
                                          f"  UserKnownHostsFile {home / '.ssh' / 'mine'}\n")
    hosts = cluster.hosts_file(tmp_path / "one.txt", [host])
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--", "true", home=home)
    assert result.returncode == 0, result.stderr
    assert not (home / ".ssh" / "mine").exists(), "nothing recorded: the key was known"
    published.write_text("")  # known nowhere: refused, as before
    started = time.monotonic()
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--", "true", home=home)
    _fails_fast(result, started, [f"{host.address}", "unknown", "--accept-new-host-keys"], 30)


def test_changed_host_key_is_always_refused(cluster, tmp_path, runs):
    home = home_with_key(cluster, tmp_path)
    other = _keygen(tmp_path / "impostor").split()
    host = cluster.hosts[0]
    (home / ".ssh" / "known_hosts").write_text(f"[{host.address}]:{host.port} {other[0]} {other[1]}\n")
    hosts = cluster.hosts_file(tmp_path / "one.txt", [host])
    started = time.monotonic()
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--accept-new-host-keys", "--", "true", home=home)
    _fails_fast(result, started, ["CHANGED", "ssh-keygen -R"], 30)


def test_wrong_user_key_names_user_and_keys(cluster, tmp_path, runs):
    wrong = tmp_path / "wrong_key"
    _keygen(wrong)
    hosts = cluster.hosts_file(tmp_path / "one.txt", cluster.hosts[:1])
    started = time.monotonic()
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                        "--ssh-key", str(wrong), "--", "true")
    _fails_fast(result, started, ["authentication failed for user 'root'", str(wrong)], 30)


def test_closed_port_silent_server_and_unknown_name_each_say_why(cluster, tmp_path, runs):
    closed = free_port("127.0.0.2")
    silent = socket.socket()
    silent.bind(("127.0.0.5", 0))
    silent.listen(8)  # accepts, never speaks SSH: the banner never comes
    accepted = []
    threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
    hosts = tmp_path / "bad.txt"
    hosts.write_text(f"127.0.0.2 port={closed}\n127.0.0.5 port={silent.getsockname()[1]}\n"
                     "no-such-host.invalid\n")
    started = time.monotonic()
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "mwms", "--connect-timeout", "3",
                        "--runs-dir", str(runs), "--", "true")
    _fails_fast(result, started, ["cannot reach 3 hosts", f"connection refused at root@127.0.0.2:{closed}",
                                  "timed out after 3s", "'no-such-host.invalid' could not be resolved",
                                  f"{hosts}:1", f"{hosts}:2", f"{hosts}:3"], 20)
    silent.close()


def start_endless_run(cluster, hosts_file, runs) -> subprocess.Popen:
    """An mwms run over the SSH hosts that will not end by itself, returned once the cluster is up
    (tasks that listen and step without TensorFlow: what is tested is what happens around them)."""
    proc = subprocess.Popen(
        ddlctl_cmd("launch", "--hosts", str(hosts_file), "--strategy", "mwms", "--runs-dir", str(runs), "--",
                   sys.executable, str(PROGRAMS / "idle_server.py")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    for line in proc.stdout:
        if "cluster up" in line:
            break
    return proc


@pytest.mark.cluster
def test_sigkill_to_ddlctl_leaves_nothing_on_any_host(cluster, hosts_file, runs):
    proc = start_endless_run(cluster, hosts_file, runs)
    try:
        run_id = only_run_dir(runs).name
        assert len(processes_of_run(run_id)) >= 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        while processes_of_run(run_id) and time.monotonic() - killed < 15:
            time.sleep(0.2)
        assert processes_of_run(run_id) == [], "tasks survived the controller's death"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.cluster
def test_two_mwms_runs_across_the_same_ssh_hosts_at_once_do_not_disturb_each_other(cluster, tmp_path):
    two = cluster.hosts_file(tmp_path / "two.txt", cluster.hosts[:2])
    # the first trains with TensorFlow; the second's tasks listen on their addresses and step without
    # it, beside the first, until it has ended (what two runs share is hosts, agents' folders and ports)
    ended = tmp_path / "first-ended"
    commands = (("--steps", str(STEPS_OVER_SSH["mwms"])),
                ("--", sys.executable, str(PROGRAMS / "idle_server.py"), "--until", str(ended)))
    procs = []
    for i, command in enumerate(commands):
        procs.append((tmp_path / f"r{i}", subprocess.Popen(
            ddlctl_cmd("launch", "--hosts", str(two), "--strategy", "mwms", "--runs-dir", str(tmp_path / f"r{i}"),
                       *command),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)))
    ports, spans = set(), []
    for i, (root, proc) in enumerate(procs):
        _, err = proc.communicate(timeout=300)
        ended.touch()
        assert proc.returncode == 0, err[-3000:]
        run_dir = only_run_dir(root)
        if i == 0:
            check_ssh_run(cluster, run_dir, "mwms", cluster.hosts[:2])
        records = [steps_of(run_dir, f"worker:{w}") for w in (0, 1)]
        assert all(records), "every worker of both runs stepped (the first's count: check_ssh_run)"
        spans.append((min(r[0]["start_us"] for r in records), max(r[-1]["start_us"] for r in records)))
        assert processes_of_run(run_dir.name) == []
        plan = json.loads((run_dir / "plan.json").read_text())
        ports |= {(t["host"], t["port"]) for t in plan["tasks"]}
    assert len(ports) == 4
    (trained_from, trained_to), (idle_from, idle_to) = spans
    assert idle_from < trained_to < idle_to, "the second stepped all through the first's training"


@pytest.mark.cluster
def test_a_data_host_over_ssh_feeds_a_trainer_on_another_every_id_once(cluster, tmp_path, runs):
    """The tf.data service on an SSH host of its own (roles=data: its dispatcher and data worker),
    the trainer on another: an epoch read exactly once, nothing left anywhere. (One trainer: mwms
    trainers reading from the service are the local tests'; here the hosts are the subject.)"""
    from tests.system.test_compare import IDS

    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{cluster.hosts[0].hosts_line()}\n{cluster.hosts[2].hosts_line(roles='data')}\n")
    result = ssh_launch(cluster, "--hosts", str(hosts), "--strategy", "one_device", "--runs-dir", str(runs), "--",
                        sys.executable, "-m", "ddlctl.workloads", "--epoch-size", "1024", "--batch-size", "64",
                        "--record-ids")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = only_run_dir(runs)
    plan = json.loads((run_dir / "plan.json").read_text())
    where = {t["name"]: t["host"].split(":")[0] for t in plan["tasks"]}
    assert where == {"worker:0": cluster.hosts[0].address, "dispatcher:0": cluster.hosts[2].address,
                     "data:0": cluster.hosts[2].address}
    for task in plan["tasks"]:  # each came in through the sshd of its host
        assert server_address(run_dir / "tasks" / task["name"].replace(":", "-") / "pid.json") == task["host"]
    trainer_env = next(t for t in plan["tasks"] if t["name"] == "worker:0")["env"]
    assert trainer_env["DDLCTL_DATA_SERVICE"].startswith(f"grpc://{cluster.hosts[2].address}:")
    ids = [int(i) for batch in IDS.findall((run_dir / "tasks" / "worker-0" / "output.log").read_text())
           for i in batch.split()]
    assert sorted(ids) == list(range(1024)), "every id of the epoch, once"
    assert "dispatches at" in (run_dir / "tasks" / "dispatcher-0" / "output.log").read_text()
    assert processes_of_run(run_dir.name) == []


def test_check_reports_every_host_and_fails_on_unusable_ones(cluster, tmp_path):
    system_python = Path("/usr/bin/python3")
    hosts = cluster.hosts_file(tmp_path / "hosts.txt", cluster.hosts[:1])
    closed = free_port("127.0.0.2")
    extra = [f"127.0.0.2 port={closed}", f"root@{cluster.hosts[1].address} port={cluster.hosts[1].port} "
             "python=/no/such/python"]
    hosts.write_text(hosts.read_text() + "localhost\n" + "\n".join(extra) + "\n")
    result = run_ddlctl("check", "--hosts", str(hosts), "--json", env=cluster.env, timeout=120)
    assert result.returncode == 1, result.stderr
    reports = {r["host"]: r for r in json.loads(result.stdout)}
    good = reports[f"{cluster.hosts[0].address}:{cluster.hosts[0].port}"]
    assert good["usable"] and good["tensorflow"] and good["python"].startswith("3."), good.get("problems") or good
    assert good["gpus"] == [] and "no NVIDIA GPU" in good["gpu_note"]
    assert good["ddlctl_installed"] == good["controller_ddlctl"]
    assert reports["localhost"]["usable"]
    assert "connection refused" in reports[f"127.0.0.2:{closed}"]["problems"][0]
    missing = reports[f"root@{cluster.hosts[1].address}:{cluster.hosts[1].port}"]
    assert "'/no/such/python' not found on the host" in missing["problems"][0]
    if system_python.exists() and subprocess.run([str(system_python), "-c", "import tensorflow"],
                                                 capture_output=True).returncode != 0:
        hosts.write_text(f"root@{cluster.hosts[2].address} port={cluster.hosts[2].port} python={system_python}\n")
        result = run_ddlctl("launch", "--hosts", str(hosts), "-s", "one_device", env=cluster.env, timeout=120)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"TensorFlow is not installed for {system_python}" in result.stderr


def test_a_missing_python_is_named_on_a_host_that_does_not_have_ddlctls_code_yet(tmp_path):
    # the upload checks what arrived with the host's Python: without one, it said "cannot copy
    # ddlctl's code ... the code bundle arrived damaged (... no hash: /no/such/python failed)" (and
    # the check above said either, by which host's upload came first into the shared home)
    cluster = SshTestCluster(tmp_path / "ssh", 1, separate_homes=True)
    try:
        host = cluster.hosts[0]
        hosts = tmp_path / "hosts.txt"
        hosts.write_text(f"{host.address} port={host.port} python=/no/such/python\n")
        result = run_ddlctl("check", "--hosts", str(hosts), "--json", env=cluster.env, timeout=120)
    finally:
        cluster.stop()
    assert result.returncode == 1, result.stderr
    [report] = json.loads(result.stdout)
    assert report["problems"][0].endswith("Python '/no/such/python' not found on the host"), report
    assert not list((cluster.host_home(cluster.hosts[0]) / ".ddlctl" / "code").glob("*.tmp"))


@pytest.mark.cluster
def test_stop_kills_a_run_whose_controller_is_frozen(cluster, hosts_file, runs):
    proc = start_endless_run(cluster, hosts_file, runs)
    try:
        run_dir = only_run_dir(runs)
        proc.send_signal(signal.SIGSTOP)  # connections stay open: the host agents keep their tasks
        time.sleep(1.0)
        assert len(processes_of_run(run_dir.name)) >= 3
        unrelated = subprocess.Popen(["sleep", "300"], env={"DDLCTL_RUN_ID": "some-other-run"})
        result = run_ddlctl("stop", str(run_dir), env=cluster.env, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("killed") == 3
        deadline = time.monotonic() + 10
        while processes_of_run(run_dir.name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of_run(run_dir.name) == []
        assert unrelated.poll() is None, "another run's process was touched"
        unrelated.kill()
    finally:
        proc.kill()
        proc.wait()


def test_ddlctl_stopped_past_the_silence_limit_keeps_its_ssh_hosts_and_their_tasks(cluster, hosts_file, runs):
    """Ctrl-Z then fg over SSH: ddlctl SIGSTOPped 20 s (the silence limit is 15 s, the hang
    threshold 6 s) while the three hosts' tasks step on; what their agents sent meanwhile comes
    through each SSH channel's thread after SIGCONT, and no host is lost, no task hung."""
    proc = subprocess.Popen(
        ddlctl_cmd("launch", "--hosts", str(hosts_file), "--strategy", "mwms", "--runs-dir", str(runs),
                   "--hang-timeout", "6", "--", sys.executable, str(PROGRAMS / "idle_server.py"), "300"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    try:
        for line in proc.stdout:
            if "cluster up" in line:
                break
        time.sleep(2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(20)
        proc.send_signal(signal.SIGCONT)
        said = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, said[-3000:]
    finally:
        proc.kill()
        proc.wait()
    assert re.search(r"this process did not run for (19|2\d)s", said), said[-3000:]
    outcome = json.loads((only_run_dir(runs) / "outcome.json").read_text())
    # (a loaded machine could add a pause of a few seconds of its own: only the 20 s one is counted)
    assert (outcome["hosts_lost"], outcome["hangs"]) == ([], [])
    assert [p for p in outcome["paused"] if p["seconds"] >= 19] and len(outcome["paused"]) <= 2, outcome["paused"]
    assert processes_of_run(only_run_dir(runs).name) == []


def test_a_command_that_ends_before_reading_its_input_still_says_why(cluster, hosts_file):
    """The upload of ddlctl's code to a host whose disk is full: the remote command fails and ends
    before it has read all it is sent. Sending then meets a closed channel ("Socket is closed",
    seen under load in CI), and the command's own words and exit status must still come back."""
    from ddlctl.cluster.hostfile import load_hosts
    from ddlctl.transport.options import SshOptions
    from ddlctl.transport.ssh import connect

    host = load_hosts(hosts_file).hosts[0]
    conn = connect(host, SshOptions(key_file=str(cluster.user_key),
                                    known_hosts=str(cluster.home / ".ssh" / "known_hosts")))
    try:  # 64 MiB: far more than the SSH channel's window, so the sender is still sending when it ends
        status, out, err = conn.run_bytes(["sh", "-c", "echo cannot take it >&2; exit 3"], data=b"x" * (64 << 20))
    finally:
        conn.close()
    assert (status, out, err.strip()) == (3, b"", "cannot take it")


@pytest.mark.cluster
def test_ssh_config_alias_hostname_port_user_identity_and_match_exec(cluster, tmp_path, runs):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text((cluster.home / ".ssh" / "known_hosts").read_text())
    key = tmp_path / "my_key"  # not a default key name: only IdentityFile can find it
    key.write_bytes(cluster.user_key.read_bytes())
    key.chmod(0o600)
    a, b = cluster.hosts[:2]
    (home / ".ssh" / "config").write_text(
        f"Host alpha\n  HostName {a.address}\n  Port {a.port}\n  User root\n  IdentityFile {key}\n"
        f"Host beta\n  Port {b.port}\n  User root\n  IdentityFile {key}\n"
        # `Match exec` runs a command through invoke, which ddlctl imports only for such a config
        f"Match host beta exec \"test -d {home}\"\n  HostName {b.address}\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"alpha python={sys.executable}\nbeta python={sys.executable}\n")
    result = ssh_launch(cluster, "--hosts", str(hosts), "-s", "mwms", "--runs-dir", str(runs), "--", sys.executable,
                        "-c", "import os; print('on', os.environ['DDLCTL_TASK'])", home=home)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads((only_run_dir(runs) / "plan.json").read_text())
    workers = plan["tasks"][0]["tf_config"]["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in workers] == [a.address, b.address], "TF_CONFIG uses HostName"
    assert [t["host"] for t in plan["tasks"]] == ["alpha", "beta"]
    assert "on worker:0" in result.stdout and "on worker:1" in result.stdout, "each host ran its task"


@pytest.mark.cluster
def test_check_bench_measures_every_host_and_link_and_the_profile_feeds_balance(tmp_path):
    """Every host and link measured over SSH, saved, and fed to a plan. (That a throttled host
    measures slower is a timing test: test_model_parallel.py's emulated slow stage.) Hosts of its
    own, each with its own home: what is left behind is looked for in those homes and among the
    processes those sessions started only (other tests bench this machine at the same time)."""
    import psutil

    from ddlctl.commands.bench import load_profile

    cluster = SshTestCluster(tmp_path / "own", 3, separate_homes=True)
    try:
        bench_through_ssh(cluster, tmp_path, psutil, load_profile)
    finally:
        cluster.stop()


def bench_processes(psutil, homes: set[str]) -> list:  # noqa: ANN001
    """Live ``ddlctl.task.devbench`` processes started by sessions of these hosts (their HOME
    is one of ``homes``: found even when no longer under an sshd)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "ddlctl.task.devbench" in (proc.info["cmdline"] or []) and proc.environ().get("HOME") in homes:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def bench_through_ssh(cluster: SshTestCluster, tmp_path: Path, psutil, load_profile) -> None:  # noqa: ANN001
    hosts = cluster.hosts_file(tmp_path / "hosts.txt")
    profile_path = tmp_path / "profile.json"
    result = run_ddlctl("check", "--hosts", str(hosts), "--bench", "--bench-seconds", "0.5",
                        "--save", str(profile_path), env=cluster.env, timeout=240)
    assert result.returncode == 0, result.stderr
    labels = [f"{h.address}:{h.port}" for h in cluster.hosts]
    assert all(label in result.stdout for label in labels) and "host-to-host links" in result.stdout
    profile = load_profile(profile_path)
    assert sorted(profile.hosts) == sorted(labels)
    speeds = {label: profile.hosts[label].speed for label in labels}
    print("measured GFLOP/s:", speeds)
    assert all(s > 0 for s in speeds.values())
    for label in labels:
        host = profile.hosts[label]
        assert host.devices[0]["kind"] == "cpu" and 0 < host.latency_s < 1
        assert host.to_host_bytes_per_s > 0 and host.from_host_bytes_per_s > 0
    assert {(link["from"], link["to"]) for link in profile.links} == {
        (labels[0], labels[1]), (labels[0], labels[2]), (labels[1], labels[2])}
    assert all(link["latency_s"] > 0 and link["bandwidth_bytes_per_s"] > 0 for link in profile.links)
    homes = {str(cluster.host_home(host)) for host in cluster.hosts}
    assert not bench_processes(psutil, homes), "a measurement outlived check --bench"
    for host in cluster.hosts:  # each host measured in a scratch folder of its home, gone now
        bench = cluster.host_home(host) / ".ddlctl" / "bench"
        assert bench.is_dir() and not list(bench.iterdir()), host
    # the saved profile round-trips into a launch plan: each worker gets its host's measured speed
    plan = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--balance", "speed", "--speeds",
                      str(profile_path), "--dry-run", "--json", env=cluster.env)
    assert plan.returncode == 0, plan.stderr
    envs = [t["env"] for t in json.loads(plan.stdout)["tasks"]]
    assert all(json.loads(e["DDLCTL_SPEEDS"]) == [speeds[label] for label in labels] for e in envs)
    assert all(e["DDLCTL_BALANCE"] == "speed" for e in envs)


def test_a_host_whose_disk_fills_warns_first_then_is_the_root_cause_and_its_files_come_back(tmp_path, runs):
    """The host's home (~/.ddlctl) is a real 2 MiB disk: room for ddlctl's code and little more. The
    task fills it: the launch warned of it, the root cause is the host's full disk, the output and
    the steps recorded before it filled come back, and nothing is left running."""
    small = SshTestCluster(tmp_path / "small", 1, separate_homes=True)
    home = small.host_home(small.hosts[0])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=700", "tmpfs", str(home)], check=True)
    try:
        hosts = small.hosts_file(tmp_path / "hosts.txt")
        result = ssh_launch(small, "--hosts", str(hosts), "-s", "one_device", "--no-telemetry", "--runs-dir", str(runs),
                            "--", sys.executable, str(PROGRAMS / "fill_disk.py"), "500")
        label = f"{small.hosts[0].address}:{small.hosts[0].port}"
        assert result.returncode == 1, result.stderr[-3000:]
        assert f"warning: {label}: only " in result.stderr and "KiB free on the disk of ~/.ddlctl" in result.stderr
        assert f"worker:0 on {label} failed: exit code 1: its disk is full (No space left on device); not retried" \
            in result.stderr
        shown = re.findall(rf"^\[worker:0@{label}\] line (\d+) ", result.stdout, re.M)
        assert [int(i) for i in shown] == [*range(1000, 1500), *range(4000, 4500)], "every line, in order"
        assert f"[worker:0@{label}] the end of the output" in result.stdout
        run_dir = only_run_dir(runs)
        records = (run_dir / "tasks" / "worker-0" / "steps.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in records][:3] == [1, 2, 3]
        assert processes_of_run(run_dir.name) == []
        # this machine's disk full too (a 192 KiB runs folder): the host's files cannot come back,
        # which is said, and they stay on the host, whole
        local = tmp_path / "local"
        local.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k,mode=700", "tmpfs", str(local)], check=True)
        try:
            both = ssh_launch(small, "--hosts", str(hosts), "-s", "one_device", "--no-telemetry", "--runs-dir",
                              str(local), "--", sys.executable, str(PROGRAMS / "fill_disk.py"), "1000")
            run_id = only_run_dir(local).name
        finally:
            subprocess.run(["umount", "-l", str(local)], check=False)
        assert both.returncode == 1 and "its disk is full (No space left on device)" in both.stderr, both.stderr
        assert f"[worker:0@{label}] the end of the output" in both.stdout
        said = " ".join(both.stderr.split())  # (a long line, folded at the terminal's width)
        assert f"the files of {label}'s task folders did not come back (cannot write " in said
        assert re.search(rf"No space left on device \([\d.]+ \S+ free on its disk\)\): they stay in "
                         rf"~/\.ddlctl/runs/{run_id} there", said), said
        kept = home / ".ddlctl" / "runs" / run_id / "tasks" / "worker-0" / "steps.jsonl"
        assert [json.loads(line)["step"] for line in kept.read_text().splitlines()][:3] == [1, 2, 3]
        # a host whose disk cannot even take ddlctl's code: said, naming the host and the file
        subprocess.run(["umount", "-l", str(home)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=700", "tmpfs", str(home)], check=True)
        refused = ssh_launch(small, "--hosts", str(hosts), "-s", "one_device", "--runs-dir", str(runs),
                             "--", sys.executable, "-c", "pass")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert f"{label}: cannot copy ddlctl's code to ~/.ddlctl/code/" in refused.stderr
        assert "No space left on device" in refused.stderr
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)
        small.stop()


def test_a_host_whose_clock_is_42s_ahead_is_said_and_its_times_are_put_on_this_machines_clock(tmp_path, runs):
    """A host without clock synchronisation (its sessions run under libfaketime, 42 s ahead): its
    agent's frames tell the offset, ddlctl says it once, keeps it in outcome.json, and the report
    reads its step times and samples on this machine's clock (the throughput window was 42 s too
    long, the throughput a fifth of the truth)."""
    lib = libfaketime()
    if lib is None:
        pytest.skip("needs the faketime package (libfaketime)")
    ahead = {"LD_PRELOAD": lib, "FAKETIME": "+42"}  # (its monotonic clock too: sleeps then work)
    cluster = SshTestCluster(tmp_path / "ssh", 2, host_env={1: ahead})
    try:
        hosts = cluster.hosts_file(tmp_path / "hosts.txt")
        checked = run_ddlctl("check", "--hosts", str(hosts), env=cluster.env)
        done = ssh_launch(cluster, "-s", "mwms", "--hosts", str(hosts), "--runs-dir", str(runs), "--",
                          sys.executable, str(PROGRAMS / "idle_server.py"), "60")
    finally:
        cluster.stop()
    # check says it first, for that host alone, with how sure it is (its probe's round trip)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    warned = re.findall(r"(\S+): its clock is ([\d.]+)s ahead of this machine's \(to ([\d.]+)s\)",
                        (checked.stdout + checked.stderr).replace("\n", " "))
    assert [(label.split(":")[0], 40 < float(s) < 45, float(pm) < 10) for label, s, pm in warned] == \
        [(cluster.hosts[1].address, True, True)], checked.stdout[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    skewed = cluster.hosts[1]
    said = re.findall(r"the clock of (\S+) is ([\d.]+)s ahead of this machine's", done.stderr)
    assert [(label.split(":")[0], 40 < float(s) < 45) for label, s in said] == [(skewed.address, True)], done.stderr
    run_dir = only_run_dir(runs)
    offsets = json.loads((run_dir / "outcome.json").read_text())["clock_offsets"]
    # (a bound from below: each frame's delay only lowers it; the clock is exactly 42 s ahead)
    assert [label.split(":")[0] for label in offsets] == [skewed.address] and 40 < next(iter(offsets.values())) < 42.5
    # the skewed worker's own records keep its clock: 42 s after the other's
    firsts = [json.loads((run_dir / "tasks" / t / "steps.jsonl").read_text().splitlines()[0])["start_us"] / 1e6
              for t in ("worker-0", "worker-1")]
    assert 38 < firsts[1] - firsts[0] < 46, firsts
    # the report puts them side by side: 2 workers x 10 steps/s, not 120 records over a 48 s window
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["throughput_samples_per_s"] > 8, summary["throughput_samples_per_s"]  # (2.3 uncorrected)
    assert processes_of_run(run_dir.name) == []
