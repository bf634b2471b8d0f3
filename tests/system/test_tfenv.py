"""Task-side helpers that read TF_CONFIG and wait for a cluster's tasks (real sockets)."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time

import pytest

from ddlctl.task.tfenv import cluster_addresses, not_listening


def test_cluster_addresses_are_every_other_task_but_evaluators(monkeypatch):
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    assert cluster_addresses("chief", 0) == ["p:1", "w:1", "w:2"]
    assert cluster_addresses("worker", 1) == ["c:1", "p:1", "w:1"]
    monkeypatch.delenv("TF_CONFIG")
    assert cluster_addresses("chief", 0) == []


def test_not_listening_returns_when_a_late_port_opens_and_names_the_ones_that_never_do():
    late = socket.socket()
    late.bind(("127.0.0.1", 0))
    late_port = late.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: refuses connections
    closed_port = closed.getsockname()[1]
    threading.Timer(0.3, late.listen).start()
    try:
        started = time.monotonic()
        assert not_listening([f"127.0.0.1:{late_port}"], up_to_s=10) == []
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5, waited
        started = time.monotonic()
        assert not_listening([f"127.0.0.1:{late_port}", f"127.0.0.1:{closed_port}"], up_to_s=0.3) == \
            [f"127.0.0.1:{closed_port}"]
        assert time.monotonic() - started < 3
    finally:
        late.close()
        closed.close()


def test_retracing_warnings_of_ddlctls_own_measurements_are_dropped_and_the_programs_kept():
    """TensorFlow really warns about both functions (each traced for five shapes); only the
    warning about ddlctl's measuring function is dropped."""
    import os
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import tensorflow as tf
        from ddlctl.modelparallel.profile import noop_call
        from ddlctl.task.tfenv import quiet_own_retracing

        quiet_own_retracing()
        def users_function(t):
            return tf.reduce_sum(t)
        for fn in (noop_call(tf), users_function):
            traced = tf.function(fn)
            for n in range(1, 8):
                traced(tf.zeros((n, n)))
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "retracing" in line]
    assert warnings and all("users_function" in line for line in warnings), done.stderr[-2000:]


def test_a_server_task_serves_the_profiler_on_its_own_port_only_when_asked():
    from ddlctl.task.server import profiler_port

    assert profiler_port("7700", "worker", 2) == 7702 and profiler_port("7700", "ps", 0) == 7800
    assert profiler_port(None, "worker", 0) is None and profiler_port("", "worker", 0) is None
    assert profiler_port("on", "worker", 0) is None


def _serve(tmp_path, code: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Start a ps server process (``code``: its command) for a one-ps cluster, wait until it
    listens, stop it; (its pid, what it printed, the import times it wrote to stderr)."""
    import subprocess
    import sys

    from ddlctl.host.probe import free_ports

    ps, worker = free_ports(2)
    tf_config = {"cluster": {"ps": [f"localhost:{ps}"], "worker": [f"localhost:{worker}"]},
                 "task": {"type": "ps", "index": 0}}
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, *code], stdout=stdout, stderr=stderr, env={
            **os.environ, **env, "TF_CONFIG": json.dumps(tf_config), "PYTHONPROFILEIMPORTTIME": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2"})
        try:
            deadline = time.monotonic() + 120
            while "listening at" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read().split(b"\0")  # noqa: SIM115
        finally:
            proc.kill()
            proc.wait()
    assert cmdline[1:3] == [b"-m", b"ddlctl.task.server"], cmdline  # (the same pid, run again: exec)
    return proc.pid, out.read_text(), err.read_text()


@pytest.mark.cluster
def test_a_server_imports_only_what_serves_and_runs_itself_again_with_all_of_tensorflow_when_that_fails(tmp_path):
    # lean: the server's modules, never the tf.* API or Keras (seconds of a start and of every restart)
    _, said, imported = _serve(tmp_path, ["-m", "ddlctl.task.server"], {})
    assert "ddlctl server: ps:0 listening at grpc://localhost:" in said, said + imported[-2000:]
    assert "tensorflow.python.training.server_lib" in imported
    assert not re.search(r"\|\s+keras\b", imported) and "tensorflow._api.v2" not in imported
    # that import failing (a TensorFlow laid out otherwise): the same process runs again, all imported
    broken = ("import runpy, sys; sys.modules['tensorflow.python.training.server_lib'] = None; "
              "runpy.run_module('ddlctl.task.server', run_name='__main__')")
    _, said, imported = _serve(tmp_path, ["-c", broken], {})
    assert "ddlctl server: ps:0 listening at grpc://localhost:" in said, said + imported[-2000:]
    assert "tensorflow._api.v2" in imported and re.search(r"\|\s+keras\b", imported)
