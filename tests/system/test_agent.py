"""The telemetry agent on this machine: no GPU is a normal state, host and task figures are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ddlctl.host.nvml import GpuSampler, inventory


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


KERNEL_HEAVY = """import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
while True:
    block = libc.malloc(8 << 20)
    ctypes.memset(block, 1, 8 << 20)
    libc.free(block)
"""


def test_agent_reports_host_task_and_step_figures(tmp_path):
    run_id = "agent-test-run"
    task_dir = tmp_path / "worker-0"
    task_dir.mkdir()
    steps = task_dir / "steps.jsonl"
    steps.write_text("")
    # a stand-in task: a shell (the pid its host agent would record) whose child holds 50 MB and
    # spins; the agent follows the task from its pid.json down to that child
    spin = "import time\nx = bytearray(50_000_000)\nwhile True: pass"
    task = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{spin}'; true"], start_new_session=True,
                            env={**os.environ, "DDLCTL_RUN_ID": run_id, "DDLCTL_TASK": "worker:0"})
    (task_dir / "pid.json").write_text(json.dumps({"task_pid": task.pid}))
    # and one whose time is the kernel's: 8 MiB taken from it, written and given back, again and again
    churn_dir = tmp_path / "worker-1"
    churn_dir.mkdir()
    churn = subprocess.Popen([sys.executable, "-c", KERNEL_HEAVY], env={
        **os.environ, "DDLCTL_RUN_ID": run_id, "DDLCTL_TASK": "worker:1", "MALLOC_MMAP_THRESHOLD_": "131072"})
    (churn_dir / "pid.json").write_text(json.dumps({"task_pid": churn.pid}))
    # a process of the same run id nobody started as a task, and a pid.json that names a process
    # of another task: neither is counted
    stray = subprocess.Popen([sys.executable, "-c", spin],
                             env={**os.environ, "DDLCTL_RUN_ID": run_id, "DDLCTL_TASK": "worker:2"})
    liar_dir = tmp_path / "worker-3"
    liar_dir.mkdir()
    (liar_dir / "pid.json").write_text(json.dumps({"task_pid": churn.pid}))
    agent = subprocess.Popen([sys.executable, "-m", "ddlctl.host.telemetry", "--host", "here", "--run-id", run_id,
                              "--interval", "0.25", f"--watch=worker:0={task_dir}",
                              f"--task=worker:1={churn_dir}", f"--task=worker:3={liar_dir}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(agent.stdout.readline())
        assert hello["type"] == "hello" and hello["host"] == "here" and hello["psutil"] is True
        if not hello["gpus"]:
            assert hello["gpu_note"]
        with steps.open("a") as f:
            f.write('{"step": 1}\n{"step": 2}\n{"step": 3')  # the third line is not complete yet
        samples, seen = [], []  # seen: the samples with both tasks' CPU
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            record = json.loads(agent.stdout.readline())
            samples.append(record)
            if all(record.get("procs", {}).get(w, [0])[0] > 0 for w in ("worker:0", "worker:1")):
                seen.append(record)
                if len(samples) > 4 and len(seen) >= 4:
                    break
        last = samples[-1]
        assert last["type"] == "sample" and 0 <= last["cpu"] <= 100
        assert last["mem_total"] > last["mem_used"] > 0
        # no reading over the instant between finding a process and sampling it (one CPU tick read
        # as 1,742% of a CPU): none above what this machine's CPUs can give
        readings = [r["procs"][w] for r in samples for w in ("worker:0", "worker:1") if w in r.get("procs", {})]
        assert all(cpu <= 105 * os.cpu_count() and kernel <= cpu + 5 for cpu, _, kernel in readings), readings
        # the shares over the samples that saw both (one sample of a loaded machine holds a
        # few 10 ms ticks of a task: 2 of CPU and 1 of them the kernel's was read, exactly half)
        def total(task: str) -> tuple[float, float]:
            return sum(r["procs"][task][0] for r in seen), sum(r["procs"][task][2] for r in seen)

        cpu, kernel = total("worker:0")
        assert last["procs"]["worker:0"][1] > 50_000_000 and cpu > 0 and kernel < 0.2 * cpu, seen
        cpu, kernel = total("worker:1")  # (of a CPU: the two share this machine's cores)
        assert cpu > 0 and kernel > 0.5 * cpu, seen
        assert hello["gpu_fields"][:2] == ["index", "util"]
        assert last["steps"] == {"worker:0": 2}, "only complete lines count"
        assert not {"worker:2", "worker:3"} & {t for r in samples for t in r.get("procs", {})}
        gaps = [b["t"] - a["t"] for a, b in zip(samples, samples[1:], strict=False)]
        assert all(0.1 < g < 1.0 for g in gaps)
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        for process in (churn, stray):
            process.kill()
        agent.terminate()
        assert agent.wait(10) == 0, "the agent exits 0 on SIGTERM"
