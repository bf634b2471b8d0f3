"""Model FLOPs from a Keras model's layers, dense GPU peaks, and MFU in the summary (pure, plus one
real Keras model, and a load of known FLOPs under ddlctl)."""

from __future__ import annotations

import json

import pytest

from ddlctl.report.mfu import dense_peak_flops, task_mfu
from ddlctl.report.render import mfu_line
from ddlctl.report.summary import summarize


def test_dense_peaks_never_the_sparse_figure_and_by_precision():
    assert dense_peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(494.7e12)  # TF32 dense (989 sparse)
    assert dense_peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == pytest.approx(989.4e12)
    assert dense_peak_flops("NVIDIA H100 PCIe") == pytest.approx(378e12)
    assert dense_peak_flops("NVIDIA A100-SXM4-80GB", "float16") == pytest.approx(312e12)
    assert dense_peak_flops("NVIDIA L40S") == pytest.approx(183e12) and dense_peak_flops("NVIDIA L4") == 60e12
    assert dense_peak_flops("Tesla V100-SXM2-16GB") == pytest.approx(15.7e12), "no TF32 before Ampere: FP32"
    assert dense_peak_flops("Some Future GPU") is None


def test_mfu_is_achieved_over_peak_and_na_without_a_gpu():
    flops = {"train_flops_per_sample": 1e9, "dtype": "float32"}
    row = task_mfu(flops, 1000.0, ["NVIDIA A100-SXM4-80GB"])
    assert row["achieved_flops_per_s"] == 1e12 and row["mfu"] == pytest.approx(1e12 / 156e12)
    cpu = task_mfu(flops, 1000.0, [])
    assert cpu["mfu"] is None and cpu["note"] == "n/a: no GPU (CPU host)" and cpu["achieved_flops_per_s"] == 1e12
    assert task_mfu(flops, 1000.0, ["Mystery"])["note"] == "n/a: no dense peak known for Mystery"


def test_a_recorded_run_on_two_gpus_has_each_tasks_mfu(tmp_path):
    run = tmp_path / "run"
    t0 = 1_800_000_000.0
    plan = {"run_id": "r", "strategy": "mwms", "request": {}, "tasks": [
        {"name": "worker:0", "host": "g1", "role": "worker"}, {"name": "worker:1", "host": "g1", "role": "worker"}]}
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(plan))
    for i in range(2):
        folder = run / "tasks" / f"worker-{i}"
        folder.mkdir(parents=True)
        (folder / "steps.jsonl").write_text("".join(json.dumps(
            {"task": f"worker:{i}", "step": n, "start_us": int((t0 + n * 0.1) * 1e6), "duration_s": 0.1,
             "samples": 64}) + "\n" for n in range(1, 21)))
        (folder / "flops.json").write_text(json.dumps({"train_flops_per_sample": 1e9, "dtype": "float32"}))
    (run / "telemetry").mkdir()
    hello = {"type": "hello", "host": "g1", "interval": 1.0, "gpu_fields": ["index", "util"],
             "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H100 80GB HBM3"}]}
    sample = {"type": "sample", "t": t0 + 1, "cpu": 50.0, "gpus": [[0, 90], [1, 90]]}
    (run / "telemetry" / "g1.jsonl").write_text(json.dumps(hello) + "\n" + json.dumps(sample) + "\n")
    rows = summarize(run, warmup_steps=0).mfu
    # each worker: 64 samples per 0.1 s step = 640 samples/s x 1 GFLOP = 640 GFLOP/s on its own H100
    assert [(r["task"], r["achieved_flops_per_s"]) for r in rows] == [("worker:0", pytest.approx(640e9)),
                                                                     ("worker:1", pytest.approx(640e9))]
    assert all(r["peak_flops_per_s"] == pytest.approx(494.7e12) for r in rows)
    assert rows[0]["mfu"] == pytest.approx(640e9 / 494.7e12)
    assert mfu_line(rows) == ("model FLOPs 1.00 GFLOP/sample (3 x forward); achieved worker:0 640.00 GFLOP/s, "
                              "worker:1 640.00 GFLOP/s; MFU worker:0 0.1%, worker:1 0.1%")


def test_a_program_declares_its_flops_and_the_keras_hook_leaves_them(tmp_path, monkeypatch):
    from ddlctl.task.flops import declare_flops, record_model_flops

    with pytest.raises(ValueError, match="positive"):
        declare_flops(0)
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        declare_flops(1e9, "fp8")
    monkeypatch.delenv("DDLCTL_TASK_DIR", raising=False)
    assert declare_flops(1e9) is None, "outside ddlctl: nothing written"
    record = declare_flops(6e9, "bfloat16", str(tmp_path))
    assert json.loads((tmp_path / "flops.json").read_text()) == record and record["dtype"] == "bfloat16"

    class Dense:  # a layer as model_flops sees one: a kernel of 4 x 8
        kernel = type("Kernel", (), {"shape": (4, 8)})()

    model = type("Model", (), {"layers": [Dense()]})()
    assert record_model_flops(model, str(tmp_path)) is None, "the program's own count stands"
    assert json.loads((tmp_path / "flops.json").read_text())["train_flops_per_sample"] == 6e9
    other = tmp_path / "other"
    other.mkdir()
    assert record_model_flops(model, str(other))["train_flops_per_sample"] == 3 * 2 * 32


