"""Pure helpers for remote execution: the one function that builds a remote command line, and the
code bundle that brings ddlctl to hosts where it is not installed.

Every remote command is an argument list quoted once, here, by :func:`shell_command`. Task
arguments and environment never appear in it: they travel base64-encoded inside the watchdog's
``--spec``, so no shell ever splits or expands them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
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
def watchdog_source() -> str:
    """Source of the standard-library-only watchdog, run remotely with ``python -c``."""
    return (PACKAGE_DIR / "runtime" / "watchdog.py").read_text(encoding="utf-8")


def encode_spec(spec: dict[str, object]) -> str:
    """Base64 (URL-safe) of the JSON spec: only ``[A-Za-z0-9_=-]`` reaches the shell."""
    return base64.urlsafe_b64encode(json.dumps(spec).encode("utf-8")).decode("ascii")


def watchdog_command(python: str, spec: dict[str, object]) -> str:
    """Remote command line: the watchdog from source, told what to run by ``spec``."""
    return shell_command([python, "-c", watchdog_source(), "--spec", encode_spec(spec)])


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
