"""Model FLOPs from a Keras model's layers, dense GPU peaks, and MFU in the summary (pure, plus one
real Keras model, and a load of known FLOPs under ddlctl)."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.mark.cluster
def test_a_load_of_known_flops_under_profile_gets_its_achieved_flops_and_mfu_na_on_a_cpu_host(tmp_path):
    """benchmarks/mfu_load.py (numpy here: no GPU) declares exactly 2 x size^2 x layers FLOPs per
    sample: the report multiplies them by the task's samples/s, says MFU n/a, and the line says the
    count was declared."""
    from tests.conftest import PROGRAMS, only_run_dir, run_ddlctl

    runs, own = tmp_path / "runs", tmp_path / "own.json"
    result = run_ddlctl("profile", "--strategy", "one_device", "--runs-dir", str(runs), "--", sys.executable,
                        str(PROGRAMS.parent.parent / "benchmarks" / "mfu_load.py"), "--size", "128", "--batch", "64",
                        "--layers", "2", "--steps", "40", "--out", str(own))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run_dir(runs) / "summary.json").read_text())
    (row,), (task,) = summary["mfu"], summary["tasks"]
    assert row["train_flops_per_sample"] == 2 * 128 * 128 * 2 == json.loads(own.read_text())["train_flops_per_sample"]
    assert row["achieved_flops_per_s"] == pytest.approx(row["train_flops_per_sample"] * task["samples_per_s"])
    assert row["mfu"] is None and row["note"] == "n/a: no GPU (CPU host)" and row["declared"] is True
    assert "model FLOPs 65.54 kFLOP/sample (declared by the program)" in result.stdout

def test_the_built_in_cnn_costs_what_its_layers_say(tmp_path):
    from ddlctl.task.flops import record_model_flops
    from ddlctl.workloads.models import cnn

    record = record_model_flops(cnn(), str(tmp_path))
    # by hand, per 24x24x3 sample: conv 3x3x3x16 at 22x22 positions, conv 3x3x16x32 at 9x9, dense 512x8,
    # 2 FLOPs per multiply-accumulate; training is 3 forward passes
    forward = 2 * (3 * 3 * 3 * 16 * 22 * 22 + 3 * 3 * 16 * 32 * 9 * 9 + 512 * 8)
    assert forward == 1_172_864
    assert record["forward_flops_per_sample"] == forward and record["train_flops_per_sample"] == 3 * forward
    assert record["layers_counted"] == 3 and record["dtype"] == "float32"
    assert json.loads((tmp_path / "flops.json").read_text()) == record
