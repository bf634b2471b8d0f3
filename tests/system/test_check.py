"""``ddlctl check`` on a machine where another user is logged in: it warns, naming them, since
the TensorFlow servers of a run accept any connection (a real login record, written for the test)."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest

from tests.conftest import run_ddlctl

UTMP = Path("/var/run/utmp")


def login_record(pid: int, user: str, line: str, host: str) -> bytes:
    """A USER_PROCESS record as glibc's ``struct utmp`` lays it out on Linux x86-64 (384 bytes; what
    ``who`` and psutil read). Written here: ``utmpdump -r`` failed or crashed on about a third of
    its runs on this machine (util-linux 2.38: "Extraneous newline in file", or SIGSEGV)."""
    import socket

    when = 1795600800  # 2026-11-25 10:00 UTC
    return struct.pack("<h2xi32s4s32s256shhiii16s20x", 7, pid, line.encode(), line[-4:].encode(), user.encode(),
                       host.encode(), 0, 0, 0, when, 0, socket.inet_aton(host) + bytes(12))


@pytest.fixture
def someone_else_logged_in():
    if os.geteuid() != 0:
        pytest.skip("writing the system's login records needs root (CI runs as root)")
    saved = UTMP.read_bytes() if UTMP.exists() else None
    UTMP.write_bytes((saved or b"") + login_record(os.getpid(), "ddlctl-other", "pts/9", "10.0.0.5"))
    try:
        yield "ddlctl-other"
    finally:
        if saved is None:
            UTMP.unlink()
        else:
            UTMP.write_bytes(saved)


def test_check_warns_when_other_users_are_logged_in(tmp_path, someone_else_logged_in):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    done = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert someone_else_logged_in in report["logged_in"] and report["usable"]
    [warning] = report["warnings"]
    assert f"other users are logged in ({someone_else_logged_in})" in warning and "unauthenticated" in warning
    shown = run_ddlctl("check", "--hosts", str(hosts), timeout=120)
    assert shown.returncode == 0 and f"warning: localhost: other users are logged in ({someone_else_logged_in})" \
        in " ".join(shown.stdout.split())


def test_check_warns_when_the_disk_of_a_hosts_ddlctl_folder_is_nearly_full(tmp_path, small_disk):
    """A host whose home (where ~/.ddlctl keeps runs on SSH and Slurm hosts) is a real 1 MiB disk."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    done = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120, env={"HOME": str(small_disk)})
    assert done.returncode == 0, done.stderr
    [report] = json.loads(done.stdout)
    assert 0 < report["disk_free"] <= 2**20 and report["usable"], "a warning, not a reason to refuse the host"
    [warning] = [w for w in report["warnings"] if "free on the disk" in w]
    assert re.match(r"only (\d+\.\d KiB|1\.0 MiB) free on the disk of ~/\.ddlctl \(a run.s task", warning), warning
    # and where there is room, nothing is said
    roomy = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120)
    [report] = json.loads(roomy.stdout)
    assert report["disk_free"] > 100 * 2**20 and not [w for w in report["warnings"] if "free on the disk" in w]


def test_hosts_whose_tensorflow_differs_are_warned_by_check_and_refused_by_launch(tmp_path):
    """A second local host whose Python has another TensorFlow release installed (its distribution's
    metadata, as pip leaves it: what ddlctl reads, without importing TensorFlow)."""
    import subprocess
    import sys

    from ddlctl.commands.preflight import tensorflow_mismatch

    other = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    site = Path(subprocess.run([str(other / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "tensorflow").mkdir()
    (site / "tensorflow" / "__init__.py").write_text("")
    (site / "tensorflow-2.15.1.dist-info").mkdir()
    (site / "tensorflow-2.15.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\n"
                                                                   "Version: 2.15.1\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"localhost slots=1\n127.0.0.1 slots=1 python={other / 'bin' / 'python'}\n")
    done = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    reports = {r["host"]: r for r in json.loads(done.stdout)}
    mine = reports["localhost"]["tensorflow"]
    assert reports["127.0.0.1"]["tensorflow"] == "2.15.1" and re.match(r"\d+\.\d+\.\d+", mine)
    said = f"TensorFlow differs across the hosts (2.15.1 on 127.0.0.1; {mine} on localhost)"
    assert all(any(w.startswith(said) for w in r["warnings"]) for r in reports.values())
    refused = run_ddlctl("launch", "-s", "mwms", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"),
                         "--", sys.executable, "-c", "pass", timeout=120)
    assert refused.returncode == 1 and f"error: {said}: the servers of one job must run" in refused.stderr
    assert "pip install tensorflow==VERSION" in refused.stderr and "Traceback" not in refused.stderr
    assert not list((tmp_path / "runs").glob("*/tasks")), "refused before any task started"
    # a patch release apart is one release (a warning in check, no refusal); unknown versions say nothing
    assert tensorflow_mismatch({"a": "2.21.0", "b": "2.21.1"}, releases_only=True) is None
    assert tensorflow_mismatch({"a": "2.21.0", "b": "2.21.1"}).startswith("TensorFlow differs across the hosts")
    assert tensorflow_mismatch({"a": "2.21.0", "b": "present", "c": None}) is None


def test_a_host_with_gpus_whose_tensorflow_would_not_find_cuda_is_warned_with_what_to_install():
    from ddlctl.commands.preflight import host_warnings
    from ddlctl.host.probe import missing_cuda_libraries, probe, quick_probe

    facts = {"executable": "/usr/bin/python3", "tensorflow": "2.21.0", "gpus": [{"index": 0}, {"index": 1}],
             "cuda_missing": ["libcudart.so.12", "libcudnn.so.9"]}
    assert host_warnings(facts) == [
        "its TensorFlow will not use its 2 GPU(s): libcudart.so.12 and libcudnn.so.9 not found for /usr/bin/python3 "
        "(TensorFlow trains on the CPU then): run '/usr/bin/python3 -m pip install \"tensorflow[and-cuda]\"' there"]
    assert host_warnings({**facts, "cuda_missing": []}) == []  # (all found)
    assert host_warnings({**facts, "gpus": [], "cuda_missing": None}) == []  # (no GPU: not looked for)
    assert host_warnings({**facts, "tensorflow": None}) == []  # (said as a problem of its own)
    # what launch reads of a remote host (its quick probe: device files, no NVML)
    quick = {"executable": "/usr/bin/python3", "tensorflow": "2.21.0", "gpu_devices": 8,
             "cuda_missing": ["libcudnn.so.9"]}
    assert host_warnings(quick) == [
        "its TensorFlow will not use its 8 GPU(s): libcudnn.so.9 not found for /usr/bin/python3 (TensorFlow trains on "
        "the CPU then): run '/usr/bin/python3 -m pip install \"tensorflow[and-cuda]\"' there"]
    # this machine: no NVIDIA GPU, so not looked for; its pip TensorFlow has no CUDA libraries
    assert probe()["cuda_missing"] is None
    assert quick_probe(1)["gpu_devices"] == 0 and quick_probe(1)["cuda_missing"] is None
    assert set(missing_cuda_libraries()) <= {"libcudart.so.12", "libcudnn.so.9"}


def test_check_says_what_each_host_runs_and_how_many_cpus_a_data_hosts_workers_share(tmp_path):
    from ddlctl.cluster.model import Host
    from ddlctl.commands.check import data_warnings, what_it_runs
    from ddlctl.commands.preflight import HostReport

    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2 roles=chief,worker\n127.0.0.1 slots=3 roles=data cpus=0\n")
    done = run_ddlctl("check", "--hosts", str(hosts), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    trainer, data = json.loads(done.stdout)
    assert trainer["runs"] == "chief, worker (2 slots)" and data["usable"]
    assert data["runs"] == "data: 3 data workers on 1 CPU (tf.data service)", "cpus=0: the CPUs its tasks may use"
    assert [w for w in data["warnings"] if "data workers share" in w] == [
        "slots=3 data workers share 1 CPU: each makes input at a fraction of a core (an input pipeline uses a core "
        "or more): slots=1 or fewer"]
    shown = " ".join(run_ddlctl("check", "--hosts", str(hosts), timeout=120).stdout.split())
    assert "warning: 127.0.0.1: slots=3 data workers share 1 CPU" in shown and "any role" not in shown
    # a data-only host's GPUs train nothing; one that also trains is both
    gpu_host = HostReport("g", "hosts.txt:3", facts={"gpus": [{"index": 0}, {"index": 1}], "cpus": 32},
                          spec=Host("g", slots=8, roles=("data",)))
    assert data_warnings(gpu_host) == ["its 2 GPU(s) stay idle: data workers make input on CPUs (roles=data,worker "
                                       "trains there too)"]
    both = HostReport("g", "hosts.txt:3", facts={"cpus": 32}, spec=Host("g", slots=1, roles=("worker", "data")))
    assert what_it_runs(both) == "worker (1 slot); data: 1 data worker on 32 CPUs (tf.data service)"
    assert data_warnings(both) == []
