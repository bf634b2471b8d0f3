"""The command line: help, dry runs and clear errors (no processes started)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import run_ddlctl


def test_help_does_not_import_tensorflow_or_nvml():
    code = ("import sys\nfrom ddlctl.cli import app\n"
            "for args in (['--help'], ['launch', '--help']):\n"
            "    try:\n        app(args)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('tensorflow', 'pynvml', 'keras', 'paramiko') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_launch_help_explains_every_option():
    result = run_ddlctl("launch", "--help")
    assert result.returncode == 0
    for option in ("--hosts", "--template", "--strategy", "--workers", "--ps", "--evaluator",
                   "--run-dir", "--env", "--startup-timeout", "--grace", "--dry-run", "--json",
                   "--legacy-keras", "--workload", "--steps", "--batch-size"):
        assert option in result.stdout


def test_dry_run_json_is_the_plan_and_nothing_else(runs):
    result = run_ddlctl("launch", "--strategy", "ps", "--workers", "2", "--dry-run", "--json",
                        "--run-dir", str(runs), "--env", "A=1", "--", "python", "train.py", "--lr", "0.1")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [t["name"] for t in plan["tasks"]] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    chief = plan["tasks"][0]
    assert chief["argv"] == ["python", "train.py", "--lr", "0.1"] and chief["env"]["A"] == "1"
    ports = [t["port"] for t in plan["tasks"]]
    assert all(ports) and len(set(ports)) == 4
    assert list(runs.iterdir()) == [], "a dry run creates nothing"


def test_dry_run_table_shows_tf_config(runs):
    result = run_ddlctl("launch", "--template", "cluster_templates/localhost-mwms.yaml",
                        "--dry-run", "--run-dir", str(runs))
    assert result.returncode == 0, result.stderr
    assert "strategy mwms, 2 task(s)" in result.stdout
    assert result.stdout.count("TF_CONFIG=") == 2


@pytest.mark.parametrize(
    ("args", "hosts_text", "fragments"),
    [
        (["--strategy", "ps"], "node1 slots=2\nnode2 slot=4\n",
         ["hosts.txt:2", "unknown key 'slot'", "node2 slot=4"]),
        (["--strategy", "mirrored"], "localhost\n127.0.0.1 port=2222\n", ["runs on one host"]),
        (["--strategy", "ps", "--workers", "5"], "localhost slots=2\n", ["5 workers requested"]),
        (["--strategy", "horovod"], "localhost\n", ["unknown strategy 'horovod'"]),
        (["--env", "1BAD=x"], "localhost\n", ["--env '1BAD=x' is not KEY=VALUE"]),
        (["--steps", "5", "--", "python", "x.py"], "localhost\n", ["--steps only applies to the built-in"]),
        (["--json"], "localhost\n", ["--json is only available with --dry-run"]),
    ],
)
def test_bad_input_is_a_clear_error_exit_2_no_traceback(tmp_path, args, hosts_text, fragments):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(hosts_text)
    result = run_ddlctl("launch", "--hosts", str(hosts), "--run-dir", str(tmp_path / "runs"), *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error:")
    for fragment in fragments:
        assert fragment in result.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_missing_hosts_file_and_template():
    result = run_ddlctl("launch", "--hosts", "/nonexistent/hosts.txt")
    assert result.returncode == 2 and "'/nonexistent/hosts.txt' does not exist" in result.stderr
    result = run_ddlctl("launch", "--template", "/nonexistent.yaml")
    assert result.returncode == 2 and "does not exist" in result.stderr
