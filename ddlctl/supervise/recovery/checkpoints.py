"""Making the chief's checkpoint available on every host of a group restart.

Every worker of a restarted MWMS group restores from ``DDLCTL_CHECKPOINT_DIR``, but only the chief
(worker 0) wrote there. Hosts that share its file system already see it; to the others ddlctl
copies what they lack through the host agents (a file is copied when its size or modification
time differs, and keeps the source's modification time, so a shared folder or an earlier copy
costs one listing). A copy that fails stops the job with a message naming both hosts.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from ddlctl.transport.session import HostSession


def files_to_copy(source: Mapping[str, tuple[int, int]], target: Mapping[str, tuple[int, int]]) -> list[str]:
    """Files of the source listing that the target lacks or holds with another size or mtime (pure)."""
    return sorted(name for name, stat in source.items() if tuple(target.get(name, ())) != tuple(stat))


def unsafe_name(name: str) -> bool:
    """Whether a name from a source listing could write outside the target folder (pure)."""
    parts = name.split("/")
    return not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts)


def sync_folder(source: HostSession, source_dir: str, target: HostSession, target_dir: str) -> tuple[int, int]:
    """Copy what ``target_dir`` lacks of ``source_dir``; (files, bytes) copied. Raises OSError,
    also for a name in the source listing that would land outside ``target_dir``."""
    have = source.list_files(source_dir)
    bad = sorted(name for name in have if unsafe_name(name))
    if bad:
        raise OSError(f"refusing to copy {bad[0]!r} from {source_dir}: not a name inside the folder")
    missing = files_to_copy(have, target.list_files(target_dir))
    copied = 0
    for name in missing:  # piece by piece: a checkpoint's data file is never held whole
        copied += target.write_chunks(posixpath.join(target_dir, name),
                                      source.read_chunks(posixpath.join(source_dir, name)), mtime_ns=have[name][1])
    return len(missing), copied


#: TensorFlow's checkpoint state file in a CheckpointManager folder (names the latest checkpoint).
CHECKPOINT_STATE = "checkpoint"
_LATEST = re.compile(rb'^model_checkpoint_path:\s*"(?:.*/)?[^"/]*?-(\d+)"', re.MULTILINE)


def newest_state(files: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    """(size, mtime) of the newest checkpoint state file among a folder's ``files`` (relative path
    -> (size, mtime)): the folder's own, or one a level down, where Keras's ``BackupAndRestore``
    keeps its (``<backup_dir>/chief/checkpoint``); None when there is none (pure)."""
    found = [value for path, value in files.items()
             if path == CHECKPOINT_STATE or (path.count("/") == 1 and path.endswith("/" + CHECKPOINT_STATE))]
    return max(found, key=lambda value: value[1]) if found else None


def checkpoint_step(state: bytes | None) -> int:
    """The number of the latest checkpoint a state file names (``ckpt-150`` -> 150); -1: none (pure)."""
    found = _LATEST.search(state or b"")
    return int(found[1]) if found else -1


def promote_copy(session: HostSession, copy_dir: str, shared_dir: str) -> int:
    """A worker that now leads (worker 0 left the job): where its own copy of the checkpoints is
    newer than the shared folder on its host, copy it there (they were taken at the same steps, so
    usually they are the same). The number of files copied."""
    def latest(folder: str) -> int:
        if CHECKPOINT_STATE not in session.list_files(folder):
            return -1
        return checkpoint_step(session.read_file(posixpath.join(folder, CHECKPOINT_STATE)))

    if latest(copy_dir) <= latest(shared_dir):
        return 0
    files, _size = sync_folder(session, copy_dir, session, shared_dir)
    return files
