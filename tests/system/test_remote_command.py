"""The one function that builds remote command lines, and the shipped code bundle."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

from hypothesis import given, settings
from hypothesis import strategies as st

from ddlctl.transport.remote import code_bundle, shell_command

ECHO = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
args_strategy = st.lists(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                                 max_size=20), max_size=6)


@settings(max_examples=40, deadline=None)
@given(args_strategy)
def test_shell_command_round_trips_any_arguments_through_sh(args):
    out = subprocess.run(["sh", "-c", shell_command([*ECHO, *args])], capture_output=True, timeout=30)
    assert json.loads(out.stdout) == args


def test_bundle_is_importable_zip_of_the_package():
    digest, data = code_bundle()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "ddlctl/host/agent.py" in names and "ddlctl/workloads/train.py" in names
    assert len(digest) == 16 and code_bundle()[0] == digest, "content-addressed, stable"


def test_tasks_import_ddlctl_from_the_bundle_first(tmp_path):
    _, data = code_bundle()
    bundle = tmp_path / "ddlctl.zip"
    bundle.write_bytes(data)
    out = subprocess.run([sys.executable, "-c", "import ddlctl.host.agent as w; print(w.__file__)"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(bundle)}, timeout=30,
                         cwd=tmp_path)
    assert out.stdout.strip().startswith(str(bundle))


def test_hosts_use_the_bundles_bytecode_and_fall_back_to_source_for_another_python(tmp_path):
    _, data = code_bundle()
    code = "import ddlctl.host.agent as w; print(w.__file__)"
    bundle = tmp_path / "ddlctl.zip"
    bundle.write_bytes(data)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(bundle)}, timeout=30, cwd=tmp_path)
    assert out.stdout.strip() == f"{bundle}/ddlctl/host/agent.pyc", out.stderr
    # a host whose Python writes another bytecode version: the .pyc is skipped, the source compiled
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(other, "w") as target:
        for info in source.infolist():
            content = source.read(info)
            target.writestr(info, b"\0\0\r\n" + content[4:] if info.filename.endswith(".pyc") else content)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(other)}, timeout=30, cwd=tmp_path)
    assert out.stdout.strip() == f"{other}/ddlctl/host/agent.py", out.stderr
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = archive.infolist()
    assert all(e.compress_type == zipfile.ZIP_DEFLATED for e in entries)
    assert len(data) < 0.5 * sum(e.file_size for e in entries), "compressed"


def test_an_upload_cut_short_or_changed_is_not_installed_and_a_bundle_without_its_check_is_not_run(tmp_path):
    """The upload script, run by a real ``sh``: the zip is checked (size, SHA-256, by the host's
    Python) before it is renamed into place; what is not there whole, with its check, is not run."""
    from ddlctl.transport.remote import RUN_BUNDLED, UPLOAD_BUNDLE, upload_args

    _, data = code_bundle()
    path = tmp_path / "code" / "ddlctl-x.zip"

    def upload(sent: bytes) -> subprocess.CompletedProcess:
        args = upload_args(data, sys.executable)
        return subprocess.run(["sh", "-c", UPLOAD_BUNDLE, "sh", str(path), *args[1:]], input=sent,
                              capture_output=True)

    for damaged in (data[: len(data) // 3], data[:-1] + b"x"):
        done = upload(damaged)
        assert done.returncode != 0 and b"the code bundle arrived damaged" in done.stderr
        assert not list(path.parent.iterdir()), "nothing installed, nothing left behind"
    done = upload(data)
    assert done.returncode == 0 and done.stdout == str(path).encode()
    assert path.read_bytes() == data and (tmp_path / "code" / "ddlctl-x.zip.sha256").is_file()
    ran = subprocess.run(["sh", "-c", RUN_BUNDLED, "sh", str(path), *ECHO, "ok"], capture_output=True, text=True)
    assert ran.returncode == 0 and json.loads(ran.stdout) == ["ok"]
    (tmp_path / "code" / "ddlctl-x.zip.sha256").unlink()  # a bundle some other way put there
    ran = subprocess.run(["sh", "-c", RUN_BUNDLED, "sh", str(path), *ECHO, "ok"], capture_output=True, text=True)
    assert ran.returncode == 97 and "not on this host yet" in ran.stderr
