"""The tf.data service ddlctl starts (``--data-workers N``): a dispatcher and data workers, real
TensorFlow, before the trainers; the trainers' batches come from them."""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter

import pytest

from ddlctl.testing.faults import Job, wait_for
from tests.conftest import processes_of_run
from tests.system.test_compare import IDS

pytestmark = pytest.mark.cluster


def test_an_epoch_through_the_data_workers_a_killed_one_and_the_dispatcher_restarted_no_sample_twice(runs):
    """An epoch of 3,072 ids (48 global steps of 64) through 2 data workers to 2 mwms trainers: one
    data worker and then the dispatcher SIGKILLed mid-epoch, each restarted in place; the epoch is
    read to its end. DYNAMIC sharding is at most once: no id twice, and what is lost is the whole
    batches the killed data worker had in hand."""
    job = Job(runs, "-s", "mwms", "--workers", "2", "--data-workers", "2", "--max-restarts", "2", "--no-telemetry",
              "--", sys.executable, "-m", "ddlctl.workloads", "--epoch-size", "3072", "--batch-size", "64",
              "--record-ids", "--min-step-ms", "200")
    job.wait_steps("worker-0", 12)
    job.kill("data-1", signal.SIGKILL)
    job.wait_steps("worker-0", 24)
    job.kill("dispatcher-0", signal.SIGKILL)  # (fault-tolerant: started again, it carries on from its journal)
    assert job.wait() == 0, job.stderr()[-3000:]
    data, dispatcher = job.outcome()["restarts"]
    assert (data["task"], data["scope"], data["tasks"]) == ("data:1", "task", ["data:1"])
    assert (dispatcher["task"], dispatcher["scope"], dispatcher["tasks"]) == ("dispatcher:0", "task", ["dispatcher:0"])
    assert "restarting it in place (the trainers' input carries on from the other data workers)" in job.stderr()
    assert "(carrying on from its journal)" in (job.run_dir / "tasks" / "dispatcher-0" / "output.log").read_text()
    # every batch whole (made from one batch's ids by one data worker), each to one trainer, none twice
    batches = [b for task in ("worker-0", "worker-1") for b in consumed_batches(job.run_dir, task)]
    assert all(b == list(range(b[0], b[0] + 32)) and b[0] % 32 == 0 for b in batches)
    ids = Counter(i for b in batches for i in b)
    assert set(ids.values()) == {1} and set(ids) <= set(range(3072))
    lost = 3072 - len(ids)
    assert lost <= 3072 // 4, f"{lost} ids lost: more than a killed data worker holds"
    assert all(consumed_batches(job.run_dir, task) for task in ("worker-0", "worker-1"))
    tasks = job.run_dir / "tasks"
    assert "ddlctl data service: dispatcher:0 dispatches at " in (tasks / "dispatcher-0" / "output.log").read_text()
    assert list((tasks / "dispatcher-0" / "journal").iterdir())  # (fault-tolerant: its journal)
    assert (tasks / "data-1" / "output.log").read_text().count("ddlctl data service: data:1 serves input at ") == 2
    # the report's section: each data worker (restarts; CPU where telemetry ran), each trainer's input wait
    section = json.loads((job.run_dir / "summary.json").read_text())["data_service"]
    assert [(w["task"], w["restarts"]) for w in section["workers"]] == [("dispatcher:0", 1), ("data:0", 0),
                                                                         ("data:1", 1)]
    assert [t["task"] for t in section["trainers"]] == ["worker:0", "worker:1"]
    assert all(t["samples_per_s"] > 0 and 0 <= t["input_fraction"] < 1 for t in section["trainers"])
    wait_for(lambda: not processes_of_run(job.run_dir.name), 15, "every process of the run to end")


def test_an_epoch_through_the_data_service_is_read_exactly_once_and_trains_as_local_input_does(runs):
    """No fault: every id of the epoch exactly once, however unequal the trainers' shares (a step runs
    while either has a batch), and the accuracy of the same epoch read by each trainer's own pipeline."""
    epoch = ("--", sys.executable, "-m", "ddlctl.workloads", "--epoch-size", "6144", "--batch-size", "64")
    accuracy = {}
    for kind in ("service", "local"):
        (runs / kind).mkdir()
        job = Job(runs / kind, "-s", "mwms", "--workers", "2", *(("--data-workers", "2") if kind == "service" else ()),
                  "--no-telemetry", *epoch, "--input", kind, *(("--record-ids",) if kind == "service" else ()))
        assert job.wait() == 0, job.stderr()[-3000:]
        results = [json.loads((job.run_dir / "tasks" / t / "result.json").read_text())
                   for t in ("worker-0", "worker-1")]
        assert results[0]["accuracy"] == results[1]["accuracy"], "one model, trained in lockstep"
        accuracy[kind] = results[0]["accuracy"]
        if kind == "service":
            shares = [consumed_batches(job.run_dir, t) for t in ("worker-0", "worker-1")]
            ids = Counter(i for share in shares for b in share for i in b)
            assert sorted(ids) == list(range(6144)) and set(ids.values()) == {1}, "every id, once"
    assert accuracy["service"] == pytest.approx(accuracy["local"], abs=0.04), accuracy


def consumed_batches(run_dir, task: str) -> list[list[int]]:  # noqa: ANN001
    """The batches ``task`` trained on (an empty one, taken when the others still had some, left out)."""
    text = (run_dir / "tasks" / task / "output.log").read_text()
    return [[int(i) for i in match.split()] for match in IDS.findall(text) if match.strip()]


def test_compare_runs_local_and_service_input_side_by_side_and_one_trainer_reads_the_same_batches(tmp_path):
    from tests.conftest import run_ddlctl

    done = run_ddlctl("compare", "--strategies", "one_device", "--input", "local,service", "--steps", "24",
                      "--batch-size", "16", "--runs-dir", str(tmp_path), "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    rows = {r["execution"]: r for r in data["rows"]}
    assert set(rows) == {"pipelined", "pipelined+service"} and data["inputs"] == ["local", "service"]
    roles = {mode: sorted(t["role"] for t in json.loads((tmp_path / row["run_dirs"][0] / "plan.json").read_text())
                          ["tasks"]) for mode, row in rows.items()}
    assert roles == {"pipelined": ["worker"], "pipelined+service": ["data", "dispatcher", "worker"]}
    local, served = rows["pipelined"], rows["pipelined+service"]
    # one trainer, one data worker: the same batches in the same order as its own pipeline's
    assert served["loss"] == local["loss"] and served["accuracy"] == local["accuracy"]
    figures = data["service_speedups"]["one_device"]["pipelined"]
    assert figures["ratio"] == pytest.approx(served["throughput_samples_per_s"] / local["throughput_samples_per_s"])
    assert (figures["input_local"], figures["input_service"]) == (local["input_fraction"], served["input_fraction"])


def test_ps_workers_read_their_closures_batches_from_the_data_service_none_twice(runs):
    job = Job(runs, "-s", "ps", "--workers", "2", "--data-workers", "1", "--no-telemetry", "--",
              sys.executable, "-m", "ddlctl.workloads", "--steps", "40", "--batch-size", "16", "--record-ids")
    assert job.wait() == 0, job.stderr()[-3000:]
    shares = {w: consumed_batches(job.run_dir, w) for w in ("worker-0", "worker-1")}
    batches = [b for share in shares.values() for b in share]
    assert len(batches) == 40 and all(b == list(range(b[0], b[0] + 16)) and b[0] % 16 == 0 for b in batches)
    assert set(Counter(i for b in batches for i in b).values()) == {1}, "no id twice"
    assert all(shares.values()), "each worker's closures read from the service"
    work = {w["task"]: w["steps"] for w in json.loads((job.run_dir / "summary.json").read_text())["work"]}
    assert work == {w.replace("-", ":"): len(share) for w, share in shares.items()}, "each batch, one step"
