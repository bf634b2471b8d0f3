"""Heterogeneous machines emulated for real: a cgroup CPU quota per task (host key ``cpu_quota=``),
and mwms with ``--balance speed`` on two workers, one of them throttled."""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

import pytest

from ddlctl.host import cgroup, prefork
from ddlctl.report.balance import final_split_steps
from ddlctl.workloads.synthetic import READ_AHEAD_BOUND
from tests.conftest import only_run_dir, processes_of_run, run_ddlctl

BUSY = ("import time; t0 = time.time(); c0 = time.process_time()\n"
        "while time.time() - t0 < 2.0: pass\n"
        "print('cpu-ratio', round((time.process_time() - c0) / (time.time() - t0), 3))\n"
        "import os; print('intra-op', os.environ.get('TF_NUM_INTRAOP_THREADS', 'unset'))")


def can_throttle() -> bool:
    try:
        path = cgroup.create(f"probe-{os.getpid()}", 0.5)
    except OSError:
        return False
    cgroup.remove(path)
    return True


needs_cgroup = pytest.mark.skipif(not can_throttle(), reason="no writable cgroup cpu controller (run as root)")


def cpu_ratio(tmp_path: Path, runs: Path, host_line: str) -> tuple[float, Path]:
    hosts = tmp_path / f"hosts-{len(list(tmp_path.iterdir()))}.txt"
    hosts.write_text(host_line + "\n")
    done = run_ddlctl("launch", "-s", "one_device", "--hosts", str(hosts), "--no-telemetry", "--runs-dir", str(runs),
                      "--", sys.executable, "-c", BUSY, timeout=120)
    assert done.returncode == 0, done.stderr
    run_dir = sorted(p for p in runs.iterdir() if p.is_dir())[-1]
    (ratio,) = re.findall(r"cpu-ratio ([0-9.]+)", (run_dir / "tasks" / "worker-0" / "output.log").read_text())
    return float(ratio), run_dir


@pytest.mark.timing  # speeds or times: run alone (not beside other tests)
@needs_cgroup
def test_cpu_quota_slows_the_task_down_to_its_share_of_a_cpu_and_leaves_no_group(tmp_path, runs):
    throttled, run_dir = cpu_ratio(tmp_path, runs, "127.0.0.1 cpu_quota=0.25")
    free, _ = cpu_ratio(tmp_path, runs, "127.0.0.1")
    print(f"CPU time per second of wall time: {throttled} with cpu_quota=0.25, {free} without")
    assert 0.15 < throttled < 0.33
    assert free > 0.6
    # TensorFlow's op threads as wide as the quota (one thread for a quarter of a CPU), and left
    # alone without a quota
    assert "intra-op 1" in (run_dir / "tasks" / "worker-0" / "output.log").read_text()
    assert "intra-op unset" in (only_free_run(runs, run_dir) / "tasks" / "worker-0" / "output.log").read_text()
    left = list(Path(cgroup.V1_ROOT, "ddlctl").glob(f"{run_dir.name}-*")) if os.path.isdir(cgroup.V1_ROOT) else []
    assert not left, left


def only_free_run(runs: Path, throttled: Path) -> Path:
    return next(p for p in sorted(runs.iterdir()) if p.is_dir() and p != throttled)


AFFINITY = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"


def test_cpus_pin_every_task_of_the_host_and_a_cpu_it_lacks_is_refused_naming_the_host(tmp_path, runs):
    last = max(os.sched_getaffinity(0))
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"localhost cpus={last}\n127.0.0.1\n")
    done = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--no-telemetry", "--runs-dir", str(runs),
                      "--", sys.executable, "-c", AFFINITY, timeout=120)
    assert done.returncode == 0, done.stderr
    run_dir = only_run_dir(runs)
    logs = [(run_dir / "tasks" / f"worker-{i}" / "output.log").read_text() for i in range(2)]
    assert f"cpus [{last}]" in logs[0]
    assert f"cpus {sorted(os.sched_getaffinity(0))}" in logs[1]  # the other host's tasks are not pinned
    hosts.write_text("localhost\n127.0.0.1 cpus=4096\n")
    done = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--no-telemetry", "--runs-dir", str(runs),
                      "--", sys.executable, "-c", AFFINITY, timeout=120)
    assert done.returncode != 0
    assert "worker:1" in done.stderr and "cpus=4096 on this host: CPUs 4096 are not available here" in done.stderr
    assert not processes_of_run(sorted(p for p in runs.iterdir() if p.is_dir())[-1].name)


def test_a_bad_quota_is_refused_naming_the_line(tmp_path, runs):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n127.0.0.1 cpu_quota=fast\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "--dry-run")
    assert done.returncode == 2
    assert f"{hosts}:2: cpu_quota='fast' is not valid" in done.stderr


def test_balance_is_refused_where_it_does_not_apply(runs):
    done = run_ddlctl("launch", "-s", "ps", "--balance", "speed", "--dry-run")
    assert done.returncode == 2 and "balances itself" in done.stderr
    done = run_ddlctl("launch", "-s", "mwms", "--speeds", "x.json", "--dry-run")
    assert done.returncode == 2 and "--speeds applies with --balance speed" in done.stderr


def mwms(tmp_path: Path, runs: Path, balance: str) -> tuple[dict, Path]:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n127.0.0.1 cpu_quota=0.5\n")
    folder = runs / balance
    folder.mkdir()
    done = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--balance", balance, "--steps", "32",
                      "--batch-size", "512", "--no-telemetry", "--runs-dir", str(folder), "--json", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(folder)
    assert not processes_of_run(run_dir.name)
    return json.loads(done.stdout), run_dir


def loss_curve(run_dir: Path) -> dict[int, float]:
    """Step -> loss from the built-in workload's progress lines (the global loss, same on every worker)."""
    text = (run_dir / "tasks" / "worker-0" / "output.log").read_text()
    return {int(step): float(loss) for step, loss in re.findall(r"step (\d+)/\d+ loss ([0-9.]+)", text)}


@pytest.mark.timing  # speeds or times: run alone (not beside other tests)
@needs_cgroup
def test_balance_speed_gives_the_throttled_worker_a_smaller_share_same_training_more_throughput(tmp_path, runs):
    equal, _ = mwms(tmp_path, runs, "off")
    balanced, run_dir = mwms(tmp_path, runs, "speed")
    split = json.loads((run_dir / "tasks" / "worker-1" / "balance.json").read_text())
    fast, slow = split["speeds"]
    # calibrated at the start, then compared with the speeds the workers showed in training: split
    # again unless the calibration was close enough that a re-split would not pay for itself
    assert split["source"] in ("measured", "measured, then in training") and slow < fast
    share = split["batches"][1] / 512
    assert share == pytest.approx(slow / (fast + slow), abs=1 / 512 + 1e-9)  # proportional to measured speed
    assert 0.1 < share < 0.45
    records = [json.loads(line) for line in (run_dir / "tasks" / "worker-1" / "steps.jsonl").read_text().splitlines()]
    # every step read the examples of the split in force, as announced (the records count what the
    # step's batch held): the calibrated one, changed only where the log says so
    log = (run_dir / "tasks" / "worker-1" / "output.log").read_text()
    calibrated = int(re.search(r"balance: (\d+) of 512 examples per step on this worker \(worker speeds", log)[1])
    found = re.findall(r"balance: (\d+) of 512 examples per step on this worker from step (\d+) "
                       r"\(decided after step (\d+)", log)
    changes = {int(step): int(n) for n, step, _ in found}
    decided = [int(after) for _, _, after in found]
    assert set(decided) <= {4, 16, 24, 32}, found  # compared after 4 steps, then where windows end
    # in force from a step neither pipeline can have begun (what their buffers can take, 4 steps:
    # the prefetch buffer, the step being made and the distributed iterator's), one more of margin
    assert all(READ_AHEAD_BOUND + 2 <= int(step) - int(after) <= 8 for _, step, after in found), found
    assert 4 in decided or "balance: the split stays after step 4 (speeds while training 1.00 : 0." in log
    assert (split["source"] == "measured") == (not changes)
    in_force = calibrated
    for record in records:
        in_force = changes.get(record["step"], in_force)
        assert record["samples"] == in_force, (record, changes)
    assert in_force == split["batches"][1]
    # the same examples at every step: the same model, up to summation order (the loss curve and the
    # final evaluation match)
    dirs = (only_run_dir(runs / "off"), run_dir)
    curves = [loss_curve(d) for d in dirs]
    common = sorted(curves[0].keys() & curves[1].keys())  # (the balanced run also reports its first block)
    assert len(common) >= 4 and common == sorted(curves[0]), curves
    for step in common:
        assert curves[1][step] == pytest.approx(curves[0][step], rel=0.02), (step, curves)
    results = [json.loads((d / "tasks" / "worker-0" / "result.json").read_text()) for d in dirs]
    assert results[1]["loss"] == pytest.approx(results[0]["loss"], rel=0.02)
    assert results[1]["accuracy"] == pytest.approx(results[0]["accuracy"], abs=0.02)
    # within each run, per step: the throttled worker's compute was far longer than the other's with
    # equal shares, and no longer than about the other's with balanced ones (the speed-up itself,
    # measured side by side, is benchmarks/heterogeneous.py's)
    compute = {name: [w["compute_s"] for w in summary["balance"]["workers"]]
               for name, summary in (("equal", equal), ("balanced", balanced))}
    print(f"compute per step (s), fast / throttled worker: {compute}; speeds {fast:,.0f} / {slow:,.0f}")
    assert compute["equal"][1] > 1.5 * compute["equal"][0], compute
    assert compute["balanced"][1] < 1.5 * compute["balanced"][0], compute
    assert equal["balance"]["split"] == "equal"
    assert balanced["balance"]["split"] == f"speed ({split['source']})"
    # the median step's batch, at the final split when it ran long enough
    kept = [r["samples"] for r in records[balanced["warmup_steps"]:]]
    final = final_split_steps(kept)
    assert balanced["balance"]["workers"][1]["batch"] == int(statistics.median(kept[-final:]))
    assert balanced["balance"]["final_split_steps"] == (final if final < len(kept) else None)


def test_dry_run_shows_one_worker_per_gpu_and_refuses_unequal_workers(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("big gpus=4\nsmall gpus=2\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "workers: one per GPU, each with one GPU (the hosts' GPU counts differ: big 4, small 2)" in done.stdout
    rows = re.findall(r"(worker:\d) +│ (big|small) +│ auto +│ program +│ (\d) ", done.stdout)
    assert rows == [("worker:0", "big", "0"), ("worker:1", "big", "1"), ("worker:2", "big", "2"),
                    ("worker:3", "big", "3"), ("worker:4", "small", "0"), ("worker:5", "small", "1")]
    refused = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--worker-per", "host", "--dry-run")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "worker:0 on big: 4, worker:1 on small: 2" in refused.stderr and "--worker-per gpu" in refused.stderr


def test_dry_run_shows_each_tasks_cpu_limits_only_when_a_host_has_some(tmp_path):
    template = Path(__file__).resolve().parents[2] / "cluster_templates" / "localhost-unequal-mwms.yaml"
    done = run_ddlctl("launch", "--template", str(template), "--dry-run")
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"(worker:\d) +│ (\S+) +│ \d+ +│ program +│ - +│ ([^│]+?) +│", done.stdout)
    assert rows == [("worker:0", "localhost", "CPU 0"), ("worker:1", "127.0.0.1", "CPU 1, quota 0.5 CPU")]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost cpus=0-1,3\n127.0.0.1\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--dry-run")
    assert re.findall(r"(worker:\d) +│ \S+ +│ \d+ +│ program +│ - +│ ([^│]+?) +│", done.stdout) == \
        [("worker:0", "CPUs 0-1,3"), ("worker:1", "-")]
    hosts.write_text("localhost\n127.0.0.1\n")
    done = run_ddlctl("launch", "--hosts", str(hosts), "-s", "mwms", "--dry-run")
    assert done.returncode == 0 and "CPU limits" not in done.stdout and "worker:1" in done.stdout


def test_launch_bench_measures_first_and_balances_by_the_saved_profile(tmp_path, runs):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n127.0.0.1\n")
    done = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--balance", "speed", "--bench", "--steps", "16",
                      "--no-telemetry", "--runs-dir", str(runs), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(runs)
    profile = json.loads((run_dir / "cluster-profile.json").read_text())
    speeds = [profile["hosts"][label]["speed"] for label in ("localhost", "127.0.0.1")]
    assert all(s > 0 for s in speeds) and "measured GFLOP/s per device" in done.stdout + done.stderr
    split = json.loads((run_dir / "tasks" / "worker-0" / "balance.json").read_text())
    # the first split came from the saved profile; after 4 steps the workers compared it with the
    # speeds they showed while training (and split again where that paid)
    relative = " : ".join(f"{v / max(speeds):.2f}" for v in speeds)
    log = (run_dir / "tasks" / "worker-0" / "output.log").read_text()
    assert f"(worker speeds {relative}, profile)" in log, log[-2000:]
    resplit = re.search(r"examples per step on this worker from step \d+ \(decided after step 4: speeds while "
                        r"training", log) is not None
    assert resplit or "balance: the split stays after step 4 (speeds while training" in log, log[-2000:]
    assert split["source"] == ("profile, then in training" if resplit else "profile") and sum(split["batches"]) == 64
    # measured through the run's own agents, the device measurement forked from the zygote its host's
    # worker then was: one TensorFlow import per host for both (the measurement's folders kept)
    for host, worker in (("0", "worker-0"), ("1", "worker-1")):
        bench = json.loads((run_dir / "bench" / f"work-{host}" / "bench-devices" / "pid.json").read_text())
        task = json.loads((run_dir / "tasks" / worker / "pid.json").read_text())
        assert prefork.gpu_host() or (bench["forked"] and bench["zygote_pid"] == task["zygote_pid"]), (bench, task)
    assert not list((run_dir / "bench").glob("*/link.bin")), "the link's test file is not kept"
    assert not processes_of_run(run_dir.name)


@pytest.mark.timing  # speeds or times: run alone (not beside other tests)
@needs_cgroup
def test_profile_flags_the_throttled_worker_and_captures_it_beside_a_peer_once_and_nothing_on_a_healthy_job(tmp_path,
                                                                                                           runs):
    outcomes = {}
    for name, second in (("healthy", "127.0.0.1 cpus=1"), ("throttled", "127.0.0.1 cpus=1 cpu_quota=0.35")):
        hosts = tmp_path / f"{name}.txt"
        hosts.write_text(f"localhost cpus=0\n{second}\n")  # (a core each, as on two machines)
        done = run_ddlctl("profile", "-s", "mwms", "--hosts", str(hosts), "--steps", "100", "--runs-dir",
                          str(runs / name), timeout=240)  # (profile: --trace auto unless told otherwise)
        assert done.returncode == 0, done.stderr[-3000:]
        run_dir = only_run_dir(runs / name)
        assert not processes_of_run(run_dir.name)
        outcomes[name] = (done.stdout + done.stderr, run_dir,
                          json.loads((run_dir / "outcome.json").read_text())["auto_traces"])
    out, run_dir, asked = outcomes["healthy"]
    assert asked == [] and "trace auto" not in out and not list(run_dir.glob("tasks/*/capture*"))
    out, run_dir, asked = outcomes["throttled"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {t["name"]: t["straggler"] for t in summary["tasks"]} == {"worker:0": False, "worker:1": True}
    assert "straggler: worker:1 on 127.0.0.1" in out and "tasks" in out and "hosts" in out  # (the full report)
    assert summary["hosts"][0]["samples"] >= 4 and (run_dir / "trace.json").stat().st_size > 0
    [event] = asked  # once, though worker:1 stays slow to the end
    assert (event["task"], event["peer"], event["asked"]) == ("worker:1", "worker:0", ["worker:0", "worker:1"])
    assert event["why"].startswith("worker:1 is a straggler: it has its gradients ready in ")
    assert f"trace auto: {event['why']}: capturing 10 steps of worker:1 and worker:0" in " ".join(out.split())
    traces = json.loads((run_dir / "summary.json").read_text())["traces"]
    [capture] = traces["captures"]
    session = capture["session"]
    assert session.startswith("auto-1-steps-") and capture["why"] == event["why"]
    first, last = (int(n) for n in session.rsplit("-", 2)[1:])
    assert last - first == 9 and 12 < first < 90, session  # (after the pace warmed up: 12 records)
    assert sorted(p.name for p in (run_dir / "profile" / "plugins" / "profile" / session).iterdir()) == [
        "worker-0.xplane.pb", "worker-1.xplane.pb"]
    shares = {t["task"]: {k: v / t["wall_s"] for k, v in t["parts"].items()} for t in traces["tasks"]}
    assert shares["worker:1"]["compute"] > 1.5 * shares["worker:0"]["compute"], shares
    assert shares["worker:0"]["collective"] > 0.3, shares  # (waiting for worker:1 at each all-reduce)
    assert capture["comparison"].startswith("worker:1 holds the others up in its capture: it computes ")
    assert f"profiler capture {session} (trace auto): {capture['comparison']}" in \
        json.loads((run_dir / "summary.json").read_text())["diagnosis"]
