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
import uuid
import zipfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import ddlctl
from ddlctl.cluster.model import Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import LaunchError
from ddlctl.planning.plan import REMOTE_ROOT
from ddlctl.transport.agentcmd import agent_argv, launch_key
from ddlctl.transport.session import HostSession
from ddlctl.transport.streams import Stream

PACKAGE_DIR = Path(ddlctl.__file__).resolve().parent


#: ``sh`` prelude: ``$p`` is ``$1`` with a leading ``~/`` made ``$HOME/`` (paths are passed as
#: arguments, never spliced into a script; the host's own ``$HOME`` is what ``~`` means there).
EXPAND_1 = 'p="$1"; case "$p" in "~/"*) p="$HOME/${p#"~/"}";; "~") p="$HOME";; esac; '
NEED_CODE_EXIT = 97
NEED_CODE_TEXT = "ddlctl: its code is not on this host yet"
#: A bundle counts as there only with ``PATH.sha256`` beside it: written once the upload was checked
#: (a zip cut short, by an upload of an older ddlctl or anything else, is never run: it is sent again).
BUNDLE_THERE = '[ -f "$p" ] && [ -f "$p.sha256" ]'
#: ``sh -c FIND_BUNDLE sh PATH``: prints the bundle's absolute path (and touches it) if it is there.
FIND_BUNDLE = EXPAND_1 + f'if {BUNDLE_THERE}; then touch "$p"; printf %s "$p"; exit 0; fi; exit 1'
#: ``sh -c UPLOAD_BUNDLE sh PATH UNIQUE SIZE SHA256 PYTHON`` with the zip on stdin: written under a
#: unique temporary name, its size and SHA-256 checked (by the host's own Python: no tool assumed),
#: then renamed (hosts may share a file system, and another launch may be writing the same bundle);
#: a damaged upload is removed and said; bundles unused for 30 days are removed; prints the path.
#: A PYTHON that is not there exits 127, as ``env PYTHON`` does.
UPLOAD_BUNDLE = (EXPAND_1 + 'set -e; mkdir -p "$(dirname "$p")"; t="$p.$2.tmp"; cat > "$t"; '
                 'command -v "$5" > /dev/null 2>&1 || { rm -f "$t"; echo "$5: not found" >&2; exit 127; }; '
                 'n=$(wc -c < "$t" | tr -d " "); '
                 'h=$("$5" -c "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], \'rb\').read())'
                 '.hexdigest())" "$t") || h="(no hash: $5 failed)"; '
                 'if [ "$n" != "$3" ] || [ "$h" != "$4" ]; then rm -f "$t"; '
                 'echo "the code bundle arrived damaged ($n of $3 bytes, SHA-256 $h): not installed" >&2; exit 1; fi; '
                 'mv -f "$t" "$p"; printf "%s\n" "$4" > "$p.sha256"; '
                 'find "$(dirname "$p")" -maxdepth 1 \\( -name "ddlctl-*.zip" -o -name "ddlctl-*.zip.sha256" \\) '
                 '-mtime +30 -exec rm -f {} + 2>/dev/null || true; printf %s "$p"')
#: ``sh -c RUN_BUNDLED sh PATH COMMAND...``: runs COMMAND with the bundle on PYTHONPATH, or exits
#: with NEED_CODE_EXIT when the bundle is not on the host yet.
RUN_BUNDLED = (EXPAND_1 + f'shift; if {BUNDLE_THERE}; then touch "$p"; PYTHONPATH="$p"; export PYTHONPATH; '
               f'exec "$@"; fi; echo "{NEED_CODE_TEXT}" >&2; exit {NEED_CODE_EXIT}')


def upload_args(data: bytes, python: str) -> list[str]:
    """``UPLOAD_BUNDLE``'s arguments for the bundle ``data``, checked on the host by ``python``."""
    return [bundle_path(), uuid.uuid4().hex, str(len(data)), hashlib.sha256(data).hexdigest(), python]


def bundled_agent_argv(python: str, run_id: str, ports: int | None) -> list[str]:
    """The argv that starts a host agent of run ``run_id`` from the shipped code bundle."""
    return ["sh", "-c", RUN_BUNDLED, "sh", bundle_path(), "env", f"{envvars.RUN_ID}={run_id}",
            f"{envvars.LAUNCH}={launch_key()}", f"{envvars.SAFE_PATH}=1", *agent_argv(python, run_id, ports)]


def shell_command(argv: Sequence[str]) -> str:
    """The POSIX shell command line that runs ``argv`` exactly, as the shell's only command."""
    if not argv:
        raise ValueError("empty command")
    return "exec " + shlex.join(argv)


def _sources() -> list[tuple[str, bytes]]:
    """(name in the bundle, bytes) of the package's Python files, sorted."""
    files = sorted(p for p in PACKAGE_DIR.rglob("*") if p.suffix in (".py", ".typed") and p.is_file())
    return [(f"ddlctl/{p.relative_to(PACKAGE_DIR).as_posix()}", p.read_bytes()) for p in files]


@lru_cache(maxsize=1)
def bundle_digest() -> str:
    """The bundle's content address: a hash of the sources and this Python's bytecode version
    (cheap: a launch needs it for every host, the zip itself only when a host lacks it). Not a
    hash of the ``.pyc`` bytes: ``marshal``'s output depends on the interpreter's state (object
    reference counts), so two controllers of one version can write different, equivalent bytecode."""
    from importlib.util import MAGIC_NUMBER

    digest = hashlib.sha256(MAGIC_NUMBER)
    for name, source in _sources():
        digest.update(f"{name}\0{len(source)}\0".encode() + source)
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def code_bundle() -> tuple[str, bytes]:
    """(content address, zip bytes) of the ddlctl package, importable via zipimport.

    Each module also comes compiled (an unchecked hash-based ``.pyc`` of this Python): zipimport
    never writes bytecode, so without it every agent and task on a host compiles what it imports
    (hostagent: 29 ms -> 17 ms to import). A host whose Python has another bytecode version ignores
    the ``.pyc`` (its magic number differs) and compiles the ``.py`` as before."""
    from importlib._bootstrap_external import _code_to_hash_pyc  # the stdlib's own pyc writer
    from importlib.util import source_hash

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in _sources():
            archive.writestr(_entry(name), source, compresslevel=9)
            if name.endswith(".py"):
                code = compile(source, name, "exec", dont_inherit=True)
                archive.writestr(_entry(name + "c"), bytes(_code_to_hash_pyc(code, source_hash(source), checked=False)),
                                 compresslevel=9)
    return bundle_digest(), buffer.getvalue()


def _entry(name: str) -> zipfile.ZipInfo:
    """A zip entry with a fixed date (the bundle's hash depends on content only), compressed."""
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED  # (a ZipInfo is stored uncompressed unless told)
    return info


def bundle_path() -> str:
    """Remote path of this controller's code bundle (content-addressed: versions never mix)."""
    return f"{REMOTE_ROOT}/code/ddlctl-{ddlctl.__version__}-{bundle_digest()}.zip"


def start_bundled_agent(host: Host, python: str, start: Callable[[], tuple[Stream, Callable[[], bool]]],
                        upload: Callable[[], str], bundle: str | None,
                        require_bundle: bool = True) -> tuple[HostSession, str | None]:
    """Start a host agent that runs ddlctl's code from the shipped bundle, for every transport that
    reaches a host where ddlctl is not installed (SSH, srun). ``start()`` starts the agent and gives
    its stream and a function that says whether it exited for want of the bundle; then the bundle is
    uploaded (``upload()``: its path on the host) and the agent started once more. Returns the
    session, its tasks' PYTHONPATH set, and the bundle's path. A LaunchError says why it failed.
    ``require_bundle=False``: an agent that runs from an installed ddlctl (a Slurm node that shares
    the controller's file system says no bundle) is fine too."""
    for attempt in range(2):
        stream, needs_code = start()
        session = HostSession(host, stream, [], python)
        try:
            session.await_hello()
        except LaunchError as exc:
            if attempt == 0 and (NEED_CODE_TEXT in exc.message or needs_code()):
                bundle = upload()
                continue
            raise
        found = str((session.hello or {}).get("code") or bundle or "")
        if not found and require_bundle:
            session.close()
            raise LaunchError(f"{host.label}: the host agent did not say where ddlctl's code is")
        session.pythonpath = (f"{found}/ddlctl/task/instrument/autoload", found)
        return session, found or None
    raise AssertionError("unreachable")
