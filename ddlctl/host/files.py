"""The host agent's file operations: a tar of task folders, pruning a run's folder, a JSON record
written atomically. Standard library (and ddlctl's name-only contracts) only: it runs from the code bundle."""

from __future__ import annotations

import contextlib
import json
import os

from ddlctl.contract.rundir import TASK_LOG


def write_json(path: str, record: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)
    except OSError:  # (a full disk: the record goes by the protocol alone; no empty file left)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class _ChunkWriter:
    """A write-only file that hands on what it is given in pieces of ``size`` bytes."""

    def __init__(self, send, size: int) -> None:  # noqa: ANN001 - send(bytes)
        self.send, self.size, self.buffer = send, size, bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        while len(self.buffer) >= self.size:
            self.send(bytes(self.buffer[:self.size]))
            del self.buffer[:self.size]
        return len(data)

    def rest(self) -> bytes:
        data, self.buffer = bytes(self.buffer), bytearray()
        return data


def pack_folders(dirs: dict, send, size: int = 1 << 20) -> bytes:  # noqa: ANN001 - send(bytes)
    """A tar of the plain files directly in each folder (``name -> path``), as ``name/file``, handed
    to ``send`` in pieces of ``size`` bytes as it is written (a step file of millions of lines is
    never held whole); returns the last, shorter piece. output.log (streamed already) and temporary
    files are left out; a missing folder gives nothing."""
    import tarfile

    out = _ChunkWriter(send, size)
    with tarfile.open(fileobj=out, mode="w|") as archive:  # type: ignore[call-overload]
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
    return out.rest()


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
