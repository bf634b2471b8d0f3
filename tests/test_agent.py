"""The telemetry agent on this machine: no GPU is a normal state, host and task figures are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ddlctl.telemetry.nvml import GpuSampler, inventory


def test_no_gpu_is_a_state_not_an_error():
    found = inventory()
    sampler = GpuSampler()
    try:
        if not found.gpus:
            assert found.note and sampler.note
            assert sampler.sample() == []
        else:  # on a GPU machine the same code path gives readings
            assert len(sampler.sample()) == len(found.gpus)
    finally:
        sampler.close()


def test_agent_reports_host_task_and_step_figures(tmp_path):
    run_id = "agent-test-run"
    task_dir = tmp_path / "worker-0"
    task_dir.mkdir()
    steps = task_dir / "steps.jsonl"
    steps.write_text("")
    # a stand-in task process: the agent finds it by the run id in its environment
    task = subprocess.Popen([sys.executable, "-c", "import time\nx = bytearray(50_000_000)\nwhile True: pass"],
                            env={**os.environ, "DDLCTL_RUN_ID": run_id, "DDLCTL_TASK": "worker:0"})
    agent = subprocess.Popen([sys.executable, "-m", "ddlctl.runtime.agent", "--host", "here", "--run-id", run_id,
                              "--interval", "0.25", f"--watch=worker:0={task_dir}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(agent.stdout.readline())
        assert hello["type"] == "hello" and hello["host"] == "here" and hello["psutil"] is True
        if not hello["gpus"]:
            assert hello["gpu_note"]
        with steps.open("a") as f:
            f.write('{"step": 1}\n{"step": 2}\n{"step": 3')  # the third line is not complete yet
        samples = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            record = json.loads(agent.stdout.readline())
            samples.append(record)
            if len(samples) > 4 and "worker:0" in record["procs"] and record["procs"]["worker:0"][0] > 0:
                break
        last = samples[-1]
        assert last["type"] == "sample" and 0 <= last["cpu"] <= 100
        assert last["mem_total"] > last["mem_used"] > 0
        cpu, rss = last["procs"]["worker:0"]
        assert rss > 50_000_000 and cpu > 0
        assert hello["gpu_fields"][:2] == ["index", "util"]
        assert last["steps"] == {"worker:0": 2}, "only complete lines count"
        gaps = [b["t"] - a["t"] for a, b in zip(samples, samples[1:], strict=False)]
        assert all(0.1 < g < 1.0 for g in gaps)
    finally:
        task.kill()
        agent.terminate()
        assert agent.wait(10) == 0, "the agent exits 0 on SIGTERM"
