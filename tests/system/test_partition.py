"""The model-parallel partition planner on synthetic models and clusters (pure, no TensorFlow)."""

from __future__ import annotations

import pytest


@pytest.mark.cluster  # (the reference speed is measured, but every check is relative to it: load-proof)
def test_measured_speeds_and_link_of_a_profile_replace_the_declared_ones(tmp_path):
    import json

    from tests.conftest import run_ddlctl

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2 memory=24MiB\n127.0.0.1 slots=1 memory=24MiB\n")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "kind": "ddlctl-cluster-profile", "hosts": {"localhost": {"speed": 100.0}, "127.0.0.1": {"speed": 25.0}},
        "links": [{"from": "localhost", "to": "127.0.0.1", "latency_s": 0.0002, "bandwidth_bytes_per_s": 2e9}]}))
    done = run_ddlctl("partition", "--hosts", str(hosts), "--workload", "deep", "--speeds", str(profile),
                      "--algorithm", "greedy", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    # relative to this machine, measured with check --bench's kernel where the model is profiled
    reference = data["reference_gflops"]
    assert reference > 1.0
    assert [d["speed"] for d in data["devices"]] == pytest.approx([100 / reference, 100 / reference, 25 / reference])
    assert data["link"] == {"bandwidth_gbps": 2.0, "latency_ms": pytest.approx(0.2), "dispatch_ms": 0.0}
    assert data["measured_in_place"] is False and all(d["message_s"] == 0.0 for d in data["devices"])
    stages = next(p for p in data["plans"] if p["algorithm"] == "greedy")["stages"]
    assert stages[2]["layers"] < min(stages[0]["layers"], stages[1]["layers"])  # the measured-slow device
    # the model strategy's chief plans over the same measured speeds
    plan = run_ddlctl("launch", "-s", "model", "--hosts", str(hosts), "--speeds", str(profile), "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    chief = next(t for t in json.loads(plan.stdout)["tasks"] if t["name"] == "chief:0")
    described = json.loads(chief["env"]["DDLCTL_DEVICES"])
    assert [d["speed"] for d in described] == [1.0, 1.0, 0.25]
    assert [d["gflops"] for d in described] == [100.0, 100.0, 25.0]  # the chief divides by its own measurement


@pytest.mark.cluster
def test_partition_bench_measures_the_hosts_now_and_their_speeds_replace_the_declared_ones(tmp_path):
    """``partition --bench`` measures every host through its agent before planning (the same
    measurement as ``launch --bench``, whose throttled stage host gets fewer layers: the timing test
    in test_model_parallel.py). Declared speeds 100 and 0.001 are far outside anything this machine
    can measure relative to itself, loaded or not: the plan's devices carry the measured ones."""
    import json

    from tests.conftest import run_ddlctl

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 slots=1 speed=100\n::1 slots=1 speed=0.001\n")
    done = run_ddlctl("partition", "--hosts", str(hosts), "--bench", "--workload", "deep", "--algorithm", "greedy",
                      "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert [d["name"] for d in data["devices"]] == ["127.0.0.1/cpu:0", "::1/cpu:0"]
    assert all(0.02 < d["speed"] < 20 for d in data["devices"]), data["devices"]
    assert data["reference_gflops"] > 1.0
    stages = next(p for p in data["plans"] if p["algorithm"] == "greedy")["stages"]
    assert sum(s["layers"] for s in stages) == len(data["layers"])
    refused = run_ddlctl("partition", "--hosts", str(hosts), "--bench", "--speeds", str(tmp_path / "p.json"))
    assert refused.returncode == 2 and "give one of --speeds FILE, --bench and --in-place" in refused.stderr, \
        refused.stderr
