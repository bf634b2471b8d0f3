"""Pure helpers for remote execution: the one function that builds a remote command line, and the
code bundle that brings ddlctl to hosts where it is not installed.

Every remote command is an argument list quoted once, here, by :func:`shell_command`. Task
arguments and environment never appear in it: they travel to the host agent over its stdin, so no
shell ever splits or expands them and no other user of the host can read them in ``ps``.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import zipfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import ddlctl
from ddlctl.planning.plan import REMOTE_ROOT

PACKAGE_DIR = Path(ddlctl.__file__).resolve().parent


def shell_command(argv: Sequence[str]) -> str:
    """The POSIX shell command line that runs ``argv`` exactly, as the shell's only command."""
    if not argv:
        raise ValueError("empty command")
    return "exec " + shlex.join(argv)


@lru_cache(maxsize=1)
def code_bundle() -> tuple[str, bytes]:
    """(content hash, zip bytes) of the ddlctl package's Python files, importable via zipimport."""
    buffer = io.BytesIO()
    files = sorted(p for p in PACKAGE_DIR.rglob("*") if p.suffix in (".py", ".typed") and p.is_file())
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(f"ddlctl/{path.relative_to(PACKAGE_DIR).as_posix()}",
                                   date_time=(2020, 1, 1, 0, 0, 0))
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest()[:16], data


def bundle_path() -> str:
    """Remote path of this controller's code bundle (content-addressed: versions never mix)."""
    digest, _ = code_bundle()
    return f"{REMOTE_ROOT}/code/ddlctl-{ddlctl.__version__}-{digest}.zip"
