"""Placement rules and per-task specs, checked on the pure planning functions."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ddlctl.cluster.hostfile import parse_hosts
from ddlctl.cluster.model import local_cluster
from ddlctl.cluster.template import load_template
from ddlctl.contract.errors import PlanError
from ddlctl.planning.plan import LaunchRequest, layout, make_plan, needs_port
from tests.conftest import ROOT


def request(strategy: str, **kw) -> LaunchRequest:
    return LaunchRequest(strategy=strategy, run_id="r1", run_dir="/runs/r1", local_python="/py",
                         default_workdir="/work", **kw)


def placed(cluster, req):
    return [(p.name, p.host.name) for p in layout(cluster, req)]


def fake_ports(cluster, req):
    return {p.name: 20000 + i for i, p in enumerate(layout(cluster, req)) if needs_port(p, req.strategy)}


FOUR = parse_hosts("a slots=2\nb slots=2\nc slots=1\nd slots=1\n", "h.txt")


def test_ps_chief_first_host_workers_fill_slots_ps_round_robin():
    assert placed(FOUR, request("ps", ps=2)) == [
        ("chief:0", "a"),
        ("worker:0", "a"), ("worker:1", "a"), ("worker:2", "b"), ("worker:3", "b"),
        ("worker:4", "c"), ("worker:5", "d"),
        ("ps:0", "a"), ("ps:1", "b"),
    ]


def test_ps_fewer_workers_fill_in_file_order():
    assert [n for n, h in placed(FOUR, request("ps", workers=3)) if n.startswith("worker")] == \
        ["worker:0", "worker:1", "worker:2"]
    assert placed(FOUR, request("ps", workers=3))[3] == ("worker:2", "b")


def test_roles_steer_chief_ps_and_evaluator():
    cluster = parse_hosts("w1 slots=2 roles=worker\nboss roles=chief\npsbox roles=ps\n"
                          "w2 roles=worker,evaluator\n", "h")
    names = dict(placed(cluster, request("ps", ps=2, evaluator=True)))
    assert names["chief:0"] == "boss"
    assert names["ps:0"] == names["ps:1"] == "psbox"
    assert names["evaluator:0"] == "w2"
    assert {names[f"worker:{i}"] for i in range(3)} == {"w1", "w2"}


def test_mwms_one_worker_per_host_by_default_then_layers():
    assert placed(FOUR, request("mwms")) == [("worker:0", "a"), ("worker:1", "b"),
                                             ("worker:2", "c"), ("worker:3", "d")]
    hosts = Counter(h for _, h in placed(FOUR, request("mwms", workers=6)))
    assert hosts == {"a": 2, "b": 2, "c": 1, "d": 1}
    # layered: the fifth worker goes to a second slot on a, not to c or d (ranks stay contiguous)
    assert Counter(h for _, h in placed(FOUR, request("mwms", workers=5))) == \
        {"a": 2, "b": 1, "c": 1, "d": 1}
    assert placed(FOUR, request("mwms", workers=5))[:2] == [("worker:0", "a"), ("worker:1", "a")]


def test_single_host_strategies_one_process():
    for strategy in ("mirrored", "central_storage", "one_device"):
        assert placed(local_cluster(), request(strategy)) == [("worker:0", "localhost")]


@pytest.mark.parametrize(
    ("cluster", "req", "fragments"),
    [
        (FOUR, request("ps", workers=7), ["7 workers requested", "6 worker slots", "a: 2, b: 2",
                                          "h.txt"]),
        (FOUR, request("mwms", workers=9), ["9 workers requested"]),
        (FOUR, request("ps", ps=0), ["at least one ps"]),
        (FOUR, request("mwms", ps=1), ["--ps 1 only applies to the ps strategy"]),
        (FOUR, request("mirrored"), ["runs on one host", "lists 4 hosts"]),
        (local_cluster(), request("one_device", workers=2), ["--workers 2 does not apply"]),
        (local_cluster(), request("mirrored", evaluator=True), ["--evaluator does not apply"]),
        (parse_hosts("a roles=worker\n", "h"), request("ps"), ["accepts the chief role"]),
        (parse_hosts("a roles=ps\n", "h"), request("mwms"), ["accepts the worker role"]),
        (FOUR, request("horovod"), ["unknown strategy"]),
        (FOUR, request("ps", workers=0), ["at least 1"]),
    ],
)
def test_impossible_requests_are_refused(cluster, req, fragments):
    with pytest.raises(PlanError) as info:
        layout(cluster, req)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_tf_config_is_one_cluster_seen_by_every_task():
    req = request("ps", ps=2, evaluator=True)
    plan = make_plan(FOUR, req, fake_ports(FOUR, req))
    clusters = {json.dumps(t.tf_config["cluster"], sort_keys=True) for t in plan.tasks}
    assert len(clusters) == 1
    cluster = json.loads(clusters.pop())
    assert set(cluster) == {"chief", "worker", "ps"}, "the evaluator is not in the cluster"
    assert len(cluster["worker"]) == 6 and len(cluster["ps"]) == 2
    for task in plan.tasks:
        assert task.tf_config["task"] == {"type": task.role, "index": task.index}
        assert json.loads(task.env["TF_CONFIG"]) == task.tf_config
        if task.role != "evaluator":
            assert cluster[task.role][task.index] == task.address
    assert plan.task("evaluator:0").port is None
    addresses = [t.address for t in plan.tasks if t.address]
    assert len(set(addresses)) == len(addresses)


def test_ps_strategy_runs_servers_and_the_program_on_the_chief():
    req = request("ps", command=("python", "train.py"))
    plan = make_plan(FOUR, req, fake_ports(FOUR, req))
    assert plan.task("chief:0").argv == ("python", "train.py")
    assert plan.task("worker:0").argv == ("python3", "-m", "ddlctl.task.server")
    assert plan.task("ps:0").kind == "server"
    assert [t.name for t in plan.program_tasks()] == ["chief:0"]


def test_builtin_workload_uses_the_hosts_python():
    cluster = parse_hosts("localhost slots=2\n", "h")
    req = request("mwms", workers=2, workload_args=("--steps", "5"))
    plan = make_plan(cluster, req, fake_ports(cluster, req))
    assert plan.task("worker:1").argv == ("/py", "-m", "ddlctl.workloads", "--steps", "5")
    remote = parse_hosts("node python=/opt/venv/bin/python\n", "h")
    plan = make_plan(remote, request("mwms"), {"worker:0": 0})
    assert plan.task("worker:0").argv[0] == "/opt/venv/bin/python"


def test_a_bare_python_in_the_command_is_the_hosts_own_where_it_has_one():
    from ddlctl.commands.request import own_environment
    from ddlctl.planning.plan import python_note

    cluster = parse_hosts("localhost slots=1\nnode python=/opt/venv/bin/python\nbare\n", "h")
    req = request("mwms", workers=3, command=("python", "train.py", "python"), command_python_here="/venv/bin/python")
    plan = make_plan(cluster, req, fake_ports(cluster, req))
    assert [t.argv for t in plan.tasks] == [("/venv/bin/python", "train.py", "python"),
                                            ("/opt/venv/bin/python", "train.py", "python"),
                                            ("python", "train.py", "python")], "a host without python=: PATH's"
    assert python_note(plan) == ("'python' in the command is run as /venv/bin/python on localhost (ddlctl's "
                                 "environment: no other is active); /opt/venv/bin/python on node (python= in the "
                                 "hosts file); give a path after -- to run another")
    # a path: as given; another environment active here: PATH's here, python= still on node
    plan = make_plan(cluster, request("mwms", workers=3, command=("/usr/bin/python3", "t.py"),
                                      command_python_here="/venv/bin/python"), fake_ports(cluster, req))
    assert {t.argv[0] for t in plan.tasks} == {"/usr/bin/python3"} and python_note(plan) is None
    plan = make_plan(cluster, request("mwms", workers=3, command=("python3", "t.py")), fake_ports(cluster, req))
    assert [t.argv[0] for t in plan.tasks] == ["python3", "/opt/venv/bin/python", "python3"]
    assert python_note(plan).startswith("'python3' in the command is run as /opt/venv/bin/python on node (python=")
    assert not own_environment({"VIRTUAL_ENV": "/other"}) and not own_environment({"CONDA_PREFIX": "/c"})


def test_legacy_keras_only_for_commands_under_ps_and_mwms():
    cmd = ("python", "fit.py")
    for strategy, expected in (("ps", "1"), ("mwms", "1"), ("mirrored", None)):
        cluster = local_cluster(2)
        req = request(strategy, command=cmd)
        plan = make_plan(cluster, req, fake_ports(cluster, req))
        assert {t.env.get("TF_USE_LEGACY_KERAS") for t in plan.program_tasks()} == {expected}
    req = request("mwms", command=cmd, legacy_keras=False, workers=2)
    plan = make_plan(local_cluster(2), req, fake_ports(local_cluster(2), req))
    assert all("TF_USE_LEGACY_KERAS" not in t.env for t in plan.tasks)
    req = request("mwms", workers=2)  # built-in workload is Keras 3
    assert all("TF_USE_LEGACY_KERAS" not in t.env
               for t in make_plan(local_cluster(2), req, fake_ports(local_cluster(2), req)).tasks)


def test_single_host_strategy_removes_tf_config_and_sets_no_port():
    plan = make_plan(local_cluster(), request("mirrored"), {})
    task = plan.tasks[0]
    assert task.unset_env == ("TF_CONFIG",) and "TF_CONFIG" not in task.env
    assert task.port is None and task.tf_config is None


def test_gpu_split_and_ps_without_gpus():
    cluster = parse_hosts("g4 gpus=4\ng2 gpus=2 slots=4\n", "h")
    req = request("ps")
    plan = make_plan(cluster, req, fake_ports(cluster, req))
    gpus = {t.name: t.env.get("CUDA_VISIBLE_DEVICES") for t in plan.tasks}
    assert [gpus[f"worker:{i}"] for i in range(4)] == ["0", "1", "2", "3"]
    assert [gpus[f"worker:{i}"] for i in range(4, 8)] == ["0", "1", "0", "1"]
    assert gpus["ps:0"] == ""
    mw = make_plan(cluster, request("mwms", workers=3, worker_per="host"), {})
    assert [t.env.get("CUDA_VISIBLE_DEVICES") for t in mw.tasks] == ["0,1", "2,3", "0,1"]


def growing(plan) -> set[str]:
    return {t.name for t in plan.tasks if t.env.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true"}


def test_tasks_that_may_share_a_gpu_grow_their_gpu_memory_and_tasks_with_their_own_gpus_do_not():
    # ps: the chief sees every GPU of g4, where each worker has its own; g2's four workers share
    # its two GPUs in pairs; the ps task (on a host without GPUs when there is one) sees none
    cluster = parse_hosts("g4 gpus=4\ng2 gpus=2 slots=4\ncpu roles=ps\n", "h")
    plan = make_plan(cluster, request("ps"), fake_ports(cluster, request("ps")))
    assert growing(plan) == {"chief:0", "worker:0", "worker:1", "worker:2", "worker:3",
                             "worker:4", "worker:5", "worker:6", "worker:7"}
    # mwms, one worker per host or per GPU: no GPU seen twice, nothing set
    same = parse_hosts("a gpus=2\nb gpus=2\n", "h")
    assert growing(make_plan(same, request("mwms"), {})) == set()
    assert growing(make_plan(same, request("mwms", worker_per="gpu"), {})) == set()
    # an evaluator sees every GPU of the host it shares with a worker
    assert growing(make_plan(same, request("mwms", evaluator=True), {})) == {"worker:1", "evaluator:0"}
    # GPUs not declared (this machine by default): every task but the ps may see the same GPUs
    local = make_plan(local_cluster(2), request("ps"), fake_ports(local_cluster(2), request("ps")))
    assert growing(local) == {"chief:0", "worker:0", "worker:1"}
    assert growing(make_plan(local_cluster(), request("one_device"), {})) == set()
    # what the user sets wins
    mine = make_plan(local_cluster(2), request("ps", env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"}),
                     fake_ports(local_cluster(2), request("ps")))
    assert growing(mine) == set()


def test_this_machines_gpus_are_counted_from_its_device_files_and_cuda_visible_devices(tmp_path):
    from ddlctl.cluster.source import local_gpus

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"):
        (dev / name).touch()
    assert local_gpus({}, str(dev)) == 3
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "1,2"}, str(dev)) == 2
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "GPU-4b2c,1"}, str(dev)) == 2
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, str(dev)) == 1  # (CUDA stops at -1)
    assert local_gpus({"CUDA_VISIBLE_DEVICES": ""}, str(dev)) == 0
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, str(tmp_path / "none")) == 0  # no device file: no GPU
    # this machine's implicit cluster with them: each worker its own, the chief's memory grows
    two = local_cluster(2, gpus=2)
    ps = make_plan(two, request("ps", workers=2), fake_ports(two, request("ps", workers=2)))
    assert {t.name: t.env.get("CUDA_VISIBLE_DEVICES") for t in ps.tasks} == \
        {"chief:0": None, "worker:0": "0", "worker:1": "1", "ps:0": ""}
    assert growing(ps) == {"chief:0", "worker:0", "worker:1"}
    eight = local_cluster(2, gpus=8)
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in make_plan(eight, request("mwms", workers=2), {}).tasks] == \
        ["0,1,2,3", "4,5,6,7"]


def cuda(plan):
    return [(t.name, t.host.name, t.env.get("CUDA_VISIBLE_DEVICES")) for t in plan.tasks if t.role == "worker"]


def test_mwms_unequal_gpu_counts_get_one_worker_per_gpu_by_default():
    cluster = parse_hosts("big gpus=4\nsmall gpus=2\n", "h")
    plan = make_plan(cluster, request("mwms"), {})
    assert cuda(plan) == [("worker:0", "big", "0"), ("worker:1", "big", "1"), ("worker:2", "big", "2"),
                          ("worker:3", "big", "3"), ("worker:4", "small", "0"), ("worker:5", "small", "1")]
    assert json.loads(plan.tasks[0].env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert plan.tasks[5].env["DDLCTL_NUM_WORKERS"] == "6"
    # fewer workers: spread one per host first, each still with one GPU
    assert cuda(make_plan(cluster, request("mwms", workers=3), {})) == [
        ("worker:0", "big", "0"), ("worker:1", "big", "1"), ("worker:2", "small", "0")]
    # equal counts: one worker per host keeps every GPU of its host
    same = parse_hosts("a gpus=2\nb gpus=2\n", "h")
    assert cuda(make_plan(same, request("mwms"), {})) == [("worker:0", "a", "0,1"), ("worker:1", "b", "0,1")]
    assert len(cuda(make_plan(same, request("mwms", worker_per="gpu"), {}))) == 4


def test_mwms_plans_that_cannot_give_every_worker_the_same_gpus_are_refused_with_the_reason():
    cluster = parse_hosts("big gpus=4\nsmall gpus=2\n", "h")
    with pytest.raises(PlanError) as err:
        layout(cluster, request("mwms", worker_per="host"))
    assert "worker:0 on big: 4, worker:1 on small: 2" in str(err.value) and "#47203" in str(err.value)
    assert "--worker-per gpu" in (err.value.hint or "")
    mixed = parse_hosts("g gpus=2\ncpu slots=2\n", "h")
    with pytest.raises(PlanError) as err:
        layout(mixed, request("mwms"))
    assert "worker:2 on cpu: 0" in str(err.value) and "roles=ps" in (err.value.hint or "")
    with pytest.raises(PlanError) as err:
        layout(cluster, request("mwms", workers=7))
    assert "7 workers requested but the cluster has 6 worker devices" in str(err.value)
    with pytest.raises(PlanError, match="no worker host declares gpus"):
        layout(FOUR, request("mwms", worker_per="gpu"))
    with pytest.raises(PlanError, match="does not apply to the mirrored strategy"):
        layout(parse_hosts("g gpus=2\n", "h"), request("mirrored", worker_per="gpu"))


def test_ps_tasks_go_to_cpu_only_hosts_and_gpu_workers_get_one_gpu_each():
    mixed = parse_hosts("g1 gpus=4\ng2 gpus=2\ncpu slots=1\n", "h")
    plan = make_plan(mixed, request("ps", ps=2, worker_per="gpu"), {})
    assert [(t.name, t.host.name) for t in plan.tasks if t.role == "ps"] == [("ps:0", "cpu"), ("ps:1", "cpu")]
    assert cuda(plan)[-3:] == [("worker:4", "g2", "0"), ("worker:5", "g2", "1"), ("worker:6", "cpu", None)]
    # an explicit roles=ps still wins over the CPU-only default
    chosen = parse_hosts("g1 gpus=2 roles=chief,worker,ps\ncpu slots=1\n", "h")
    assert {t.host.name for t in make_plan(chosen, request("ps"), {}).tasks if t.role == "ps"} == {"g1"}


def test_user_env_overrides_and_secrets_are_redacted_in_plan_json():
    req = request("mwms", env={"API_TOKEN": "s3cret", "PYTHONUNBUFFERED": "0", "DB_PASS": "pw1",
                               "DATABASE_URL": "postgres://u:pw2@db/x", "SENTRY_DSN": "https://k3@s/1"}, workers=1)
    plan = make_plan(local_cluster(), req, {"worker:0": 1234})
    assert plan.tasks[0].env["PYTHONUNBUFFERED"] == "0" and plan.tasks[0].env["DB_PASS"] == "pw1"
    text = json.dumps(plan.to_dict())
    for secret in ("s3cret", "pw1", "pw2", "k3@"):
        assert secret not in text, "every value the user gave is masked, whatever its name"
    written = plan.to_dict()["tasks"][0]["env"]
    assert written["API_TOKEN"] == written["SENTRY_DSN"] == written["PYTHONUNBUFFERED"] == "***"
    assert written["DDLCTL_TASK"] == "worker:0" and "TF_CONFIG" in written


def test_heterogeneous_template_layout():
    cluster = load_template(ROOT / "cluster_templates" / "heterogeneous.yaml").cluster
    names = placed(cluster, request("ps", ps=2))
    assert ("chief:0", "big-node") in names
    assert [h for n, h in names if n.startswith("ps")] == ["cpu-node", "cpu-node"]
    assert Counter(h for n, h in names if n.startswith("worker")) == \
        {"big-node": 4, "mid-node": 2, "small-node": 1}


# -- addresses every host can reach ----------------------------------------------------------------

def test_this_machine_gets_a_reachable_address_when_remote_hosts_must_reach_it(tmp_path):
    from ddlctl.cluster.addresses import with_reachable_addresses
    from ddlctl.cluster.hostfile import load_hosts

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2\nnode-b slots=2\n")
    cluster = with_reachable_addresses(load_hosts(str(hosts)), "10.1.2.3")
    plan = make_plan(cluster, LaunchRequest(strategy="mwms", workers=3), {"worker:0": 1111, "worker:1": 2222,
                                                                        "worker:2": 3333})
    spec = plan.tasks[0].tf_config["cluster"]["worker"]
    assert spec == ["10.1.2.3:1111", "10.1.2.3:2222", "node-b:3333"]
    assert all(t.tf_config["cluster"] == plan.tasks[0].tf_config["cluster"] for t in plan.tasks), "one spec for all"


def test_without_a_reachable_address_the_mix_is_refused_naming_the_entry(tmp_path):
    from ddlctl.cluster.addresses import with_reachable_addresses
    from ddlctl.cluster.hostfile import load_hosts
    from ddlctl.contract.errors import ConfigError

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node-b\nlocalhost\n")
    for address in (None, "127.0.0.1"):
        with pytest.raises(ConfigError) as caught:
            with_reachable_addresses(load_hosts(str(hosts)), address)
        assert f"{hosts}:2: 'localhost' runs tasks that the remote hosts must reach" in caught.value.message
        assert "instead of localhost" in caught.value.hint


def test_all_local_clusters_keep_localhost(tmp_path):
    from ddlctl.cluster.addresses import with_reachable_addresses
    from ddlctl.cluster.hostfile import load_hosts

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2\n")
    cluster = with_reachable_addresses(load_hosts(str(hosts)), None)
    plan = make_plan(cluster, LaunchRequest(strategy="mwms", workers=2), {"worker:0": 1, "worker:1": 2})
    assert plan.tasks[0].tf_config["cluster"]["worker"] == ["localhost:1", "localhost:2"]




def test_the_data_service_goes_to_data_hosts_or_with_data_workers_here_and_trainers_get_its_address():
    hosts = parse_hosts("a slots=2\nd1 roles=data\nd2 roles=data slots=2\n", "h.txt")
    req = request("mwms")
    assert placed(hosts, req) == [("worker:0", "a"), ("dispatcher:0", "d1"), ("data:0", "d1"), ("data:1", "d2"),
                                  ("data:2", "d1")]
    plan = make_plan(hosts, req, fake_ports(hosts, req))
    tasks = {t.name: t for t in plan.tasks}
    service = f"grpc://d1:{tasks['dispatcher:0'].port}"
    assert tasks["worker:0"].env["DDLCTL_DATA_SERVICE"] == service
    assert json.loads(tasks["worker:0"].env["TF_CONFIG"])["cluster"] == {"worker": [f"a:{tasks['worker:0'].port}"]}
    for name in ("dispatcher:0", "data:2"):  # (servers outside the cluster spec, on no GPU)
        task = tasks[name]
        assert task.kind == "server" and task.tf_config is None and "TF_CONFIG" in task.unset_env
        assert task.argv[1:] == ("-m", "ddlctl.task.dataservice") and task.env["CUDA_VISIBLE_DEVICES"] == ""
        assert task.env["DDLCTL_DATA_ADDRESS"] == f"d1:{task.port}"
    assert tasks["data:2"].env["DDLCTL_DATA_DISPATCHER"] == service.removeprefix("grpc://")
    # --data-workers N: that many; on this machine without a hosts file, under a one-host strategy too
    assert [n for n, _ in placed(hosts, request("mwms", data_workers=1))][-2:] == ["dispatcher:0", "data:0"]
    assert placed(local_cluster(), request("one_device", data_workers=2)) == [
        ("worker:0", "localhost"), ("dispatcher:0", "localhost"), ("data:0", "localhost"), ("data:1", "localhost")]
    assert placed(parse_hosts("a\nd roles=data\n", "h.txt"), request("one_device"))[0] == ("worker:0", "a")
    assert placed(hosts, request("mwms", data_workers=0)) == [("worker:0", "a")]
    with pytest.raises(PlanError, match="no host in h.txt takes data workers"):
        layout(parse_hosts("a roles=worker\n", "h.txt"), request("mwms", data_workers=2))
