"""Launch preparation in-process: what is decided before any process starts."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from ddlctl.commands import launch as launch_mod
from ddlctl.commands.config import LaunchConfig, OutputOptions, RequestOptions
from ddlctl.commands.launch import prepare


def launch_config(run_dir: str, **request: object) -> LaunchConfig:
    return LaunchConfig(request=RequestOptions(**request), output=OutputOptions(run_dir=run_dir))


def test_missing_tf_keras_is_said_before_starting_and_legacy_is_not_forced(monkeypatch, tmp_path):
    monkeypatch.setattr(launch_mod, "tf_keras_available", lambda: False)
    buffer = io.StringIO()
    opts = launch_config(str(tmp_path), strategy="mwms", workers=2, command=("python", "fit.py"))
    plan, _ = prepare(opts, Console(file=buffer, width=300))
    assert "tf-keras is not installed" in buffer.getvalue()
    assert "model.fit" in buffer.getvalue()
    assert all("TF_USE_LEGACY_KERAS" not in t.env for t in plan.tasks)


def test_tf_keras_present_sets_legacy_for_commands(monkeypatch, tmp_path):
    monkeypatch.setattr(launch_mod, "tf_keras_available", lambda: True)
    buffer = io.StringIO()
    opts = launch_config(str(tmp_path), strategy="ps", workers=2, command=("python", "fit.py"))
    plan, _ = prepare(opts, Console(file=buffer, width=300))
    assert buffer.getvalue() == ""
    assert plan.task("chief:0").env["TF_USE_LEGACY_KERAS"] == "1"


def test_run_dir_is_absolute_and_unique(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opts = launch_config("runs", strategy="mwms")
    first, _ = prepare(opts, Console(file=io.StringIO()))
    second, _ = prepare(opts, Console(file=io.StringIO()))
    assert first.run_dir.startswith(str(tmp_path / "runs"))
    assert first.run_id != second.run_id
    assert all(t.task_dir.startswith(first.run_dir) for t in first.tasks)


def test_run_files_read_while_the_job_runs_are_replaced_whole(tmp_path):
    from ddlctl.contract.runfolder import write_whole

    path = tmp_path / "pids.json"
    write_whole(path, '{"a": 1}\n')
    write_whole(path, '{"a": 2}\n')
    assert path.read_text() == '{"a": 2}\n'
    assert list(tmp_path.iterdir()) == [path], "no partial file is left beside it"


def test_a_refused_launchs_run_folder_is_removed_only_when_it_holds_nothing_but_empty_agent_logs(tmp_path):
    from ddlctl.contract.runfolder import remove_unused

    def folder(name: str, **files: str) -> Path:
        run = tmp_path / name
        (run / "agents").mkdir(parents=True)
        for file, text in files.items():
            (run / "agents" / file).write_text(text)
        return run

    empty = folder("empty", **{"hostagent-localhost.log": "", "hostagent-10.0.0.2.log": ""})
    assert remove_unused(empty) and not empty.exists()
    said = folder("said", **{"hostagent-localhost.log": "", "hostagent-h2.log": "Traceback ...\n"})
    assert not remove_unused(said) and (said / "agents" / "hostagent-localhost.log").exists()
    other = folder("other", **{"hostagent-localhost.log": ""})
    (other / "plan.json").write_text("{}")  # another launch's, given the same folder
    assert not remove_unused(other) and (other / "plan.json").exists()
