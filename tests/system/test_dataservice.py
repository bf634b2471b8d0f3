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


def test_mwms_trains_on_batches_from_the_data_workers_a_killed_one_and_the_dispatcher_restarted_no_sample_twice(runs):
    job = Job(runs, "-s", "mwms", "--workers", "2", "--data-workers", "2", "--max-restarts", "2", "--no-telemetry",
              "--", sys.executable, "-m", "ddlctl.workloads", "--steps", "48", "--batch-size", "64",
              "--steps-per-call", "2", "--record-ids", "--min-step-ms", "200")
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
    # every batch whole (made from one batch's ids by one data worker), each to one trainer: with
    # DYNAMIC sharding a batch is read at most once (one the killed worker had in hand is lost)
    batches = [b for task in ("worker-0", "worker-1") for b in consumed_batches(job.run_dir, task)]
    assert len(batches) == 48 * 2 and all(b == list(range(b[0], b[0] + 32)) and b[0] % 32 == 0 for b in batches)
    ids = Counter(i for b in batches for i in b)
    assert set(ids.values()) == {1}
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


def consumed_batches(run_dir, task: str) -> list[list[int]]:  # noqa: ANN001
    text = (run_dir / "tasks" / task / "output.log").read_text()
    return [[int(i) for i in match.split()] for match in IDS.findall(text)]
