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
