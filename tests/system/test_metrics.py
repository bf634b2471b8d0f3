"""Prometheus metrics: the series from fed figures (pure, a fake clock), then a real Prometheus
server (Debian's ``prometheus``) scraping a live job and queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ddlctl.console.metrics import JobMetrics, parse_metrics_address
from ddlctl.contract.errors import ConfigError
from ddlctl.testing.faults import wait_for
from tests.conftest import ROOT, ddlctl_cmd, only_run_dir, processes_of_run


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scrape(metrics: JobMetrics) -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    lines = generate_latest(registry).decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def test_steps_step_time_restarts_goodput_and_gpus_follow_what_the_supervisor_receives():
    clock = Clock()
    metrics = JobMetrics(clock=clock)
    tasks = [("chief:0", "h1", "chief", True), ("worker:0", "h1", "worker", True), ("ps:0", "h2", "ps", True)]
    metrics.on_progress({"chief:0": (0, 100)}, (tasks, 0))
    clock.now = 102.0
    metrics.on_progress({"chief:0": (8, 100)}, (tasks, 0))
    clock.now = 104.0
    metrics.on_progress({"chief:0": (16, 100)}, (tasks, 0))
    clock.now = 108.0  # restarted: back at its checkpoint (step 10), the redone steps count again
    metrics.on_progress({"chief:0": (10, 100)}, ([tasks[0], ("worker:0", "h1", "worker", False), tasks[2]], 1))
    clock.now = 110.0
    metrics.on_progress({"chief:0": (14, 100)}, ([tasks[0], ("worker:0", "h1", "worker", False), tasks[2]], 1))
    metrics.on_sample("h1", {"type": "hello", "gpu_fields": ["index", "util", "mem_used"]})
    metrics.on_sample("h1", {"type": "sample", "cpu": 75.0, "gpus": [[0, 40, 2**30], [1, 90, 2**31]]})
    got = scrape(metrics)
    assert got['ddlctl_steps_total{task="chief:0"}'] == 16 + 4
    assert got['ddlctl_step_seconds_count{task="chief:0"}'] == 20
    assert got['ddlctl_step_seconds_sum{task="chief:0"}'] == 2.0 + 2.0 + 2.0  # 108-110 after the restart
    assert got['ddlctl_task_up{host="h1",role="worker",task="worker:0"}'] == 0
    assert got['ddlctl_task_up{host="h2",role="ps",task="ps:0"}'] == 1
    assert got["ddlctl_restarts_total"] == 1
    # productive: 102-104 only (before 102: start-up; 104-110: no progress for 6 s, a restart)
    assert got["ddlctl_goodput_ratio"] == pytest.approx(2.0 / 10.0)
    metrics.on_progress({"agent:0": (0, None), "chief:0": (14, 100)})
    assert not any("agent:0" in k for k in scrape(metrics)), "telemetry agents are not tasks"
    assert got['ddlctl_host_cpu_utilization_ratio{host="h1"}'] == 0.75
    assert got['ddlctl_gpu_utilization_ratio{gpu="1",host="h1"}'] == 0.9
    assert got['ddlctl_gpu_memory_used_bytes{gpu="0",host="h1"}'] == 2**30
    assert not any(k.startswith("ddlctl_gpu_power_watts") for k in got), "a field the GPU did not report: no series"


def test_the_metrics_address_is_a_port_or_host_and_port():
    assert parse_metrics_address("9400") == ("127.0.0.1", 9400)
    assert parse_metrics_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    for bad in ("x", "70000", "host:"):
        with pytest.raises(ConfigError, match="--metrics-port"):
            parse_metrics_address(bad)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, expression: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["data"]["result"]
    except OSError:
        return []


STEPPING = ("import time, ddlctl\nwhile True:\n    with ddlctl.step(samples=8):\n        time.sleep(0.02)\n")


@pytest.mark.cluster
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Prometheus (apt-get install prometheus)")
def test_a_real_prometheus_scrapes_a_live_job(tmp_path):
    exporter, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ddlctl\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{exporter}']\n")
    server = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    runs = tmp_path / "runs"
    started = time.time()
    job = subprocess.Popen(ddlctl_cmd("launch", "-s", "one_device", "--metrics-port", str(exporter), "--runs-dir",
                                      str(runs), "--", sys.executable, "-c", STEPPING),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        steps = wait_for(lambda: [r for r in query(web, 'ddlctl_steps_total{task="worker:0"} > 20')], 90,
                         "Prometheus to have scraped steps")
        assert steps[0]["metric"]["job"] == "ddlctl"
        [up] = wait_for(lambda: query(web, "ddlctl_task_up"), 30, "task_up")
        assert (up["metric"]["task"], up["metric"]["role"], up["value"][1]) == ("worker:0", "worker", "1")
        [rate] = wait_for(lambda: query(web, "rate(ddlctl_steps_total[10s]) > 5"), 30, "a step rate")
        assert float(rate["value"][1]) < 55, rate  # a step every 20 ms and a bit: under 50/s
        [cpu] = wait_for(lambda: query(web, "ddlctl_host_cpu_utilization_ratio"), 30, "host CPU")
        assert 0 <= float(cpu["value"][1]) <= 1
        [goodput] = query(web, "ddlctl_goodput_ratio")
        assert 0 < float(goodput["value"][1]) <= 1
        assert query(web, "ddlctl_restarts_total")[0]["value"][1] == "0"
        # the time so far by cause adds up to the wall (ddlctl's start to the last count: <= 1 s apart)
        [counted] = wait_for(lambda: query(web, 'ddlctl_time_seconds{cause="productive"} > 1'), 30, "productive time")
        [total] = query(web, "sum(ddlctl_time_seconds)")
        [startup] = query(web, 'ddlctl_time_seconds{cause="startup"}')
        assert 0 < float(startup["value"][1]) < float(total["value"][1]) < time.time() - started + 1
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=60)
        assert job.returncode == 130, err[-2000:]
        assert f"Prometheus metrics at http://127.0.0.1:{exporter}/metrics" in err + out
    finally:
        if job.poll() is None:
            job.kill()
        server.terminate()
        server.wait(30)
    assert not processes_of_run(only_run_dir(runs).name)
    with socket.socket() as s:  # the exporter closed with the job
        assert s.connect_ex(("127.0.0.1", exporter)) != 0


def test_a_metrics_port_in_use_is_a_clear_error():
    from ddlctl.console.metrics import MetricsServer

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}.*choose a free port"):
            MetricsServer(JobMetrics(), "127.0.0.1", port)


def test_a_bad_or_busy_metrics_port_is_refused_before_anything_starts(tmp_path):
    from tests.conftest import run_ddlctl

    bad = run_ddlctl("launch", "-s", "one_device", "--metrics-port", "99999", "--runs-dir", str(tmp_path / "a"))
    assert bad.returncode == 2 and "--metrics-port '99999': give a port (9400) or HOST:PORT" in bad.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = run_ddlctl("launch", "-s", "one_device", "--metrics-port", str(port), "--runs-dir", str(tmp_path / "b"))
    assert busy.returncode == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in busy.stderr
    assert "Traceback" not in bad.stderr + busy.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists(), "no run directory, nothing started"
