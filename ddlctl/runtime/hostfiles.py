"""The host agent's file operations: a tar of task folders, pruning a run's folder, a JSON record
written atomically. Standard library (and ddlctl's name-only contracts) only: it runs from the code bundle."""

from __future__ import annotations

import contextlib
import json
import os

from ddlctl.runfiles import TASK_LOG


def write_json(path: str, record: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)


def pack_folders(dirs: dict) -> bytes:
    """A tar of the plain files directly in each folder (``name -> path``), as ``name/file``;
    output.log (streamed already) and temporary files left out; a missing folder gives nothing."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in dirs.items():
            folder = os.path.expanduser(path)
            try:
                entries = sorted(os.listdir(folder))
            except OSError:
                continue
            for entry in entries:
                full = os.path.join(folder, entry)
                if entry == TASK_LOG or entry.endswith((".tmp", ".ddlctl-partial")) or not os.path.isfile(full):
                    continue
                with contextlib.suppress(OSError):  # a file that vanished is simply not there
                    archive.add(full, arcname=f"{name}/{entry}", recursive=False)
    return buffer.getvalue()


def prune_folder(path: str, keep: list) -> None:
    """Remove ``path`` except the entries named in ``keep``; ``path`` too when nothing is kept."""
    import shutil

    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        return
    for entry in entries:
        if entry in keep:
            continue
        full = os.path.join(path, entry)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(full)
    with contextlib.suppress(OSError):
        os.rmdir(path)  # only when empty
