"""The host agent's file operations: listing, reading and writing files for checkpoint copies
between hosts (plain files only, never through a link), a tar of task folders, pruning a run's
folder, a JSON record written atomically. Standard library (and ddlctl's name-only contracts)
only: it runs from the code bundle."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat

from ddlctl.contract.rundir import TASK_LOG, TASK_PROFILING
from ddlctl.contract.wire import Kind, Op

#: The largest piece of a file read or a tar a frame carries.
FILE_CHUNK = 1 << 20


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


def take_profiling(task_dir: str) -> str | None:
    """The profiler session a task that ended had open (``ddlctl.task.trace`` says so in its
    folder while it captures), its word removed (a task started again in the folder starts clean)."""
    path = os.path.join(task_dir, TASK_PROFILING)
    try:
        with open(path) as handle:
            session = json.load(handle).get("session")
    except (OSError, ValueError, AttributeError):
        return None
    with contextlib.suppress(OSError):
        os.unlink(path)
    return str(session)[:200] if session else "a capture"


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


def code_bundle_path() -> str | None:
    """The zip this agent's code runs from (ddlctl shipped to a host), or None (installed)."""
    here = os.path.abspath(__file__)
    at = here.find(".zip" + os.sep)
    return here[:at + 4] if at >= 0 else None


def open_plain(path: str, flags: int) -> int:
    """Open ``path`` as a plain file, never through a symbolic link (OSError ELOOP: refused)."""
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a plain file")
    return fd


def file_command(op: str, command: dict, send) -> None:  # noqa: ANN001 - send(header, payload=b"")
    """Checkpoint copies between hosts that share no file system: list a folder, read a file
    (in chunks), write a file (chunks to a temporary name, renamed when complete)."""
    ident = command.get("id")
    try:
        if op == Op.LS:
            root = os.path.expanduser(command["dir"])
            listing = {}
            for folder, _dirs, names in os.walk(root):  # (never into a linked folder)
                for name in names:
                    path = os.path.join(folder, name)
                    info = os.lstat(path)
                    if stat.S_ISREG(info.st_mode):  # plain files only: a link is not followed
                        listing[os.path.relpath(path, root)] = [info.st_size, info.st_mtime_ns]
            send({"k": Kind.LS, "id": ident, "root": root, "files": listing})
        elif op == Op.PACK:  # the run's task files at the end: one tar, no process started
            last = pack_folders(command["dirs"], lambda chunk: send(
                {"k": Kind.DATA, "id": ident, "eof": False}, chunk), FILE_CHUNK)
            send({"k": Kind.DATA, "id": ident, "eof": True}, last)
        elif op == Op.PRUNE:
            prune_folder(os.path.expanduser(command["path"]), command.get("keep") or [])
            send({"k": Kind.WRITTEN, "id": ident})
        elif op == Op.READ:
            with os.fdopen(open_plain(os.path.expanduser(command["path"]), os.O_RDONLY), "rb") as handle:
                while True:
                    chunk = handle.read(FILE_CHUNK)
                    send({"k": Kind.DATA, "id": ident, "eof": len(chunk) < FILE_CHUNK}, chunk)
                    if len(chunk) < FILE_CHUNK:
                        break
        else:
            path = os.path.expanduser(command["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.ddlctl-partial"
            append = bool(command.get("append"))
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            with os.fdopen(open_plain(partial, flags), "ab" if append else "wb") as handle:
                handle.write(base64.b64decode(command.get("data", "")))
            if command.get("final"):
                os.replace(partial, path)
                if command.get("mtime_ns"):  # same mtime as the source: not copied again next time
                    os.utime(path, ns=(int(command["mtime_ns"]), int(command["mtime_ns"])))
            send({"k": Kind.WRITTEN, "id": ident})
    except (OSError, KeyError, ValueError) as exc:
        send({"k": Kind.FILE_ERROR, "id": ident, "error": f"{type(exc).__name__}: {exc}"})
