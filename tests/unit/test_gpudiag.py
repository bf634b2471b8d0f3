"""GPU diagnosis from telemetry samples: kernels too small, power/thermal capped, memory nearly full.

The H100 fixtures (tests/fixtures/gpu/) carry the figures verified on a real H100; they go through
the same reader and summary as a real run's telemetry."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ddlctl.report.gpudiag import Sample, diagnose_gpu, throttling
from ddlctl.report.summary import summarize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def run_with(tmp_path: Path, fixture: str) -> Path:
    run = tmp_path / fixture
    (run / "telemetry").mkdir(parents=True)
    (run / "tasks").mkdir()
    (run / "plan.json").write_text(json.dumps({"run_id": fixture, "strategy": "one_device", "tasks": []}))
    shutil.copy(FIXTURES / f"{fixture}.jsonl", run / "telemetry" / "h100.jsonl")
    return run


def test_tiny_kernels_are_told_apart_from_a_busy_gpu(tmp_path):
    summary = summarize(run_with(tmp_path, "h100-tiny-kernels"))
    gpu = summary.hosts[0].gpus[0]
    assert gpu.util_mean == pytest.approx(23, abs=2) and gpu.sm_active_mean < 1
    text = "\n".join(summary.diagnosis)
    assert re.search(r"GPU 0 on h100: kernels too small to fill the GPU: a kernel was running 2\d% of the time, "
                     r"but on average only 0\.\d% of the SMs were busy", text), text
    assert "power-capped" not in text and "thermally" not in text


def test_a_matmul_at_the_power_limit_is_power_capped_not_slow(tmp_path):
    summary = summarize(run_with(tmp_path, "h100-bf16-matmul"))
    gpu = summary.hosts[0].gpus[0]
    assert gpu.power_capped_share == 1.0 and gpu.power_limit_w == 700.0 and gpu.sm_clock_max_mhz == 1980
    assert 1185 <= gpu.sm_clock_busy_mean_mhz <= 1410
    text = "\n".join(summary.diagnosis)
    assert "GPU 0 on h100 power-capped at its 700 W limit in 100% of busy samples; SM clock" in text
    assert "of 1980 MHz while busy" in text
    assert "kernels too small" not in text and "mostly idle" not in text
    assert json.loads(json.dumps(summary.to_dict()))["hosts"][0]["gpus"][0]["power_capped_share"] == 1.0


def busy(n: int, **fields: float | int | None) -> list[Sample]:
    return [Sample(**{"util": 99.0, "sm_active": 90.0, **fields}) for _ in range(n)]


def test_power_cap_is_seen_from_power_and_clocks_when_no_reason_bits_are_read():
    samples = busy(10, sm_clock_mhz=1300, power_w=698.0, throttle=None)
    lines = diagnose_gpu("GPU 1 on b", 99.0, 90.0, throttling(samples), 1980, 700.0, None, None)
    assert lines == ["GPU 1 on b power-capped at its 700 W limit; SM clock 1300 of 1980 MHz while busy "
                     "(the work is limited by power, not by the program)"]
    # full clocks at the limit: running flat out, nothing held it down
    assert diagnose_gpu("g", 99.0, 90.0, throttling(busy(10, sm_clock_mhz=1980, power_w=699.0)), 1980, 700.0,
                        None, None) == []


def test_thermal_throttling_and_memory_nearly_full():
    samples = busy(3, sm_clock_mhz=1000, throttle=0x20, temp_c=91) + busy(1, sm_clock_mhz=1900, throttle=0)
    throttled = throttling(samples + [Sample(util=5.0, throttle=0x1, temp_c=40)])  # idle samples do not count
    assert throttled.busy_samples == 4 and throttled.thermal_capped_share == 0.75 and throttled.temp_peak_c == 91
    lines = diagnose_gpu("GPU 0 on a", 80.0, 70.0, throttled, 1980, None, 79 * 2**30, 80 * 2**30)
    assert lines[0].startswith("GPU 0 on a thermally throttled in 75% of busy samples, peak 91 °C; SM clock 1225")
    assert lines[1].startswith("GPU 0 on a memory nearly full: peak 99% of 80 GiB")


def test_a_gpu_without_the_optional_fields_gets_no_guess():
    samples = [Sample(util=99.0) for _ in range(5)]  # an older GPU: no SM activity, clocks, reasons, power
    assert diagnose_gpu("g", 99.0, None, throttling(samples), None, None, None, None) == []
