"""The command line: help, dry runs and clear errors (no processes started)."""

from __future__ import annotations

import json
import os
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


def test_a_dry_run_renders_its_plan_without_the_reports_numpy():
    # (the summary's modules are the controller's at a job's end; a dry run took 0.53 CPU-s with
    # them, 0.28 without)
    code = ("import sys\nfrom ddlctl.cli import app\n"
            "try:\n    app(['launch', '-s', 'ps', '--dry-run'])\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('numpy', 'tensorflow', 'paramiko') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "chief:0" in out.stdout and "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_launch_help_explains_every_option():
    result = run_ddlctl("launch", "--help")
    assert result.returncode == 0
    for option in ("--hosts", "--template", "--strategy", "--workers", "--ps", "--evaluator",
                   "--runs-dir", "--env", "--startup-timeout", "--grace", "--dry-run", "--json",
                   "--legacy-keras", "--workload", "--steps", "--batch-size", "--min-workers", "--rejoin-after"):
        assert option in result.stdout


def test_dry_run_json_is_the_plan_and_nothing_else(runs):
    result = run_ddlctl("launch", "--strategy", "ps", "--workers", "2", "--dry-run", "--json",
                        "--runs-dir", str(runs), "--env", "A=1", "--", "python", "train.py", "--lr", "0.1")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [t["name"] for t in plan["tasks"]] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    chief = plan["tasks"][0]
    # (a bare python: ddlctl's own interpreter, run from its environment with no other active)
    assert chief["argv"] == [sys.executable, "train.py", "--lr", "0.1"] and chief["env"]["A"] == "***"
    assert f"'python' in the command is run as {sys.executable} on localhost" in result.stderr
    assert chief["env"]["DDLCTL_TASK"] == "chief:0", "ddlctl's own variables stay readable"
    ports = [t["port"] for t in plan["tasks"]]
    assert all(ports) and len(set(ports)) == 4
    assert list(runs.iterdir()) == [], "a dry run creates nothing"


def test_min_workers_rounds_the_default_batch_to_divide_every_size_the_job_may_have(runs):
    result = run_ddlctl("launch", "-s", "mwms", "--workers", "3", "--min-workers", "2", "--max-restarts", "1",
                        "--dry-run", "--json", "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["tasks"][0]["argv"]
    assert argv[argv.index("--batch-size") + 1] == "66", "64 rounded up to a multiple of 2 and 3"


def test_dry_run_table_shows_tf_config(runs):
    result = run_ddlctl("launch", "--template", "cluster_templates/localhost-mwms.yaml",
                        "--dry-run", "--runs-dir", str(runs))
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
        (["--strategy", "horovod"], "localhost\n", ["'horovod' is not one of 'ps', 'mwms'", "--help"]),
        (["--restart-on", "always"], "localhost\n", ["'always' is not one of 'fault', 'any'"]),
        (["--execution", "fast"], "localhost\n", ["'fast' is not one of 'pipelined', 'linear', 'python-feed'"]),
        (["--workers", "0"], "localhost\n", ["--workers", "x>=1"]),
        (["--env", "1BAD=x"], "localhost\n", ["--env '1BAD=x' is not KEY=VALUE"]),
        (["--steps", "5", "--", "python", "x.py"], "localhost\n", ["--steps only applies to the built-in"]),
        (["-s", "one_device", "--min-workers", "1", "--max-restarts", "1"], "localhost\n",
         ["--min-workers applies to --strategy mwms or ps, not one_device"]),
        (["-s", "mwms", "--workers", "2", "--min-workers", "3", "--max-restarts", "1"], "localhost slots=2\n",
         ["--min-workers 3 is more than the 2 worker(s)"]),
        (["-s", "mwms", "--workers", "2", "--min-workers", "1"], "localhost slots=2\n",
         ["--min-workers needs --max-restarts 1 or more"]),
        (["-s", "mwms", "--workers", "3", "--min-workers", "2", "--max-restarts", "1", "--batch-size", "64"],
         "localhost slots=3\n", ["--batch-size 64 cannot be split evenly over any of 2 to 3 mwms workers",
                                  "use a multiple of 6, e.g. --batch-size 66"]),
    ],
)
def test_bad_input_is_a_clear_error_exit_2_no_traceback(tmp_path, args, hosts_text, fragments):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(hosts_text)
    result = run_ddlctl("launch", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *args)
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


# -- hostile input: always a clear error (exit 2) or a plan (exit 0), never a traceback ------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HOSTILE = st.lists(st.sampled_from(list("[]/b\"'=\\ ,:@é✓\t\x1b\x07") + ["[/b]", "[bold]", "slots", "2"]),
                   max_size=8).map("".join)


def invoke(args: list[str]) -> tuple[int, str]:
    """Run the CLI in-process exactly as ``main`` does; (exit code, stderr). A traceback fails the test."""
    import contextlib
    import io

    from ddlctl.cli import run_app

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = run_app(args)
    return code, err.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(st.sampled_from(["node-a", "node-b", "gpu1"]),
                                st.sampled_from(["slots", "gpus", "roles", "python", "workdir", "port", "user"]),
                                HOSTILE), min_size=1, max_size=3),
       strategy=st.one_of(st.none(), HOSTILE, st.sampled_from(["ps", "mwms"])),
       env=st.one_of(st.none(), HOSTILE))
def test_generated_hosts_files_and_options_never_end_in_a_traceback(tmp_path, lines, strategy, env):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"{name} {key}={value}\n" for name, key, value in lines), encoding="utf-8")
    args = ["launch", "--hosts", str(hosts), "--dry-run", "--json"]
    if strategy is not None:
        args += ["--strategy", strategy]
    if env is not None:
        args += ["--env", env]
    code, err = invoke(args)
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("error:"), err


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=HOSTILE, strategies=HOSTILE)
def test_generated_templates_and_compare_strategies_never_end_in_a_traceback(tmp_path, name, strategies):
    template = tmp_path / "t.yaml"
    template.write_text(json.dumps({"hosts": [name or "x", {"host": name, "gpus": 1}], "strategy": "mwms"}),
                        encoding="utf-8")
    code, err = invoke(["launch", "--template", str(template), "--dry-run", "--json"])
    assert code in (0, 2) and "Traceback" not in err, err
    code, err = invoke(["compare", "--strategies", strategies, "--runs-dir", str(tmp_path / "runs")])
    assert code == 2 and err.startswith("error:"), err


def test_markup_in_a_hosts_file_value_is_shown_as_text(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node-a slots=[/b]\n")
    code, err = invoke(["launch", "--hosts", str(hosts), "--dry-run"])
    assert code == 2 and "slots='[/b]' is not an integer" in err


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_unusable_run_dir_is_a_clear_error(tmp_path, where):
    plain = tmp_path / "plain"
    plain.write_text("")
    run_dir = str(plain / "runs") if where == "file" else "/proc/ddlctl-no/runs"
    code, err = invoke(["launch", "-s", "one_device", "--runs-dir", run_dir, "--", "true"])
    assert code == 2, err
    assert f"--runs-dir: cannot use {run_dir} as a folder" in err


def test_help_keeps_square_brackets():
    code, _ = invoke(["launch", "--help"])
    result = run_ddlctl("launch", "--help")
    assert result.returncode == 0 and code == 0
    assert "[user@]host [slots=N]" in " ".join(result.stdout.split())


def test_report_on_a_folder_without_plan_json_is_not_a_run(tmp_path):
    (tmp_path / "tasks").mkdir()
    code, err = invoke(["report", str(tmp_path)])
    assert code == 2 and "is not a run directory (no plan.json)" in err


def test_report_and_stop_take_a_run_id_of_the_default_runs_folder(tmp_path):
    done = run_ddlctl("launch", "-s", "one_device", "--run-id", "r1", "--", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run_ddlctl("report", "r1", "--json", cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["run_id"] == "r1", shown.stderr
    stopped = run_ddlctl("stop", "r1", cwd=tmp_path)
    assert stopped.returncode == 0 and "localhost: killed 0 process(es)" in stopped.stdout, stopped.stderr
    # from another folder the id names nothing there: the error says what it takes
    (tmp_path / "other").mkdir()
    elsewhere = run_ddlctl("report", "r1", cwd=tmp_path / "other")
    assert elsewhere.returncode == 2 and "r1 is not a run directory (no plan.json)" in elsewhere.stderr
    assert "or a run id of ./runs" in elsewhere.stderr


def test_a_runs_folder_others_may_write_to_is_refused_and_run_files_are_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    code, err = invoke(["launch", "-s", "one_device", "--runs-dir", str(shared), "--", "true"])
    assert code == 2 and f"--runs-dir: {shared} is writable by others (mode 777)" in err, err
    assert "chmod go-w" in err and list(shared.iterdir()) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if os.getuid() == 0:  # root can give it away (CI runs as root)
        os.chown(theirs, 65534, 65534)
        code, err = invoke(["launch", "-s", "one_device", "--runs-dir", str(theirs), "--", "true"])
        assert code == 2 and f"--runs-dir: {theirs} belongs to another user (uid 65534)" in err, err
    mine = tmp_path / "mine"
    done = run_ddlctl("launch", "-s", "one_device", "--no-telemetry", "--runs-dir", str(mine), "--", "true")
    assert done.returncode == 0, done.stderr
    run_dir = next(mine.iterdir())
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert ((run_dir / "plan.json").stat().st_mode & 0o777) == 0o600
    log = run_dir / "tasks" / "worker-0" / "output.log"
    assert (log.stat().st_mode & 0o077) == 0, "nothing of the run readable by others"
