"""Free space on the disk of a path, and the sentence for a write the disk refused. Standard
library only."""

from __future__ import annotations

import os
from pathlib import Path

#: Below this much free space on the disk of the runs folder, ``launch`` says so before it starts.
LOW_SPACE_BYTES = 100 * 2**20


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged user may still write on the disk of ``path`` (its nearest existing
    folder); None when it cannot be told."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def size_words(count: int) -> str:
    """``1.5 GiB``, ``300.0 KiB``, ``12 B``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def write_failure(path: str | Path, exc: OSError) -> str:
    """One sentence: what could not be written, why, and the free space on its disk."""
    free = free_bytes(path)
    return f"cannot write {path}: {exc.strerror or exc}" + \
        (f" ({size_words(free)} free on its disk)" if free is not None else "")
