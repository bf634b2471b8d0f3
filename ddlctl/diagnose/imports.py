"""A program that could not import a module: which Python ran it, and what to do.

The most common first failure of a launch is a command whose Python is not the one with
TensorFlow: ``-- python train.py`` finds ``python`` on the host's PATH, with no virtual environment
activated (ddlctl itself may run from one). The root cause then says which Python that was and,
on this machine, whether ddlctl's own Python has the module.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence

from ddlctl.diagnose.rootcause import last_traceback
from ddlctl.diagnose.tfmessages import final_error

#: The last line of a traceback whose import failed.
NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


#: Python's own words when ``python -m MODULE`` finds no such module (no traceback; exit code 1),
#: and when MODULE is a package without a ``__main__`` module.
NO_MODULE_TO_RUN = re.compile(r"\S+: No module named ([\w.]+)")
PACKAGE_TO_RUN = re.compile(r"\S+: No module named ([\w.]+)\.__main__; '[\w.]+' is a package and cannot be "
                            r"directly executed")


def module_to_run_missing(log_text: str) -> str | None:
    """The module ``python -m`` was given and did not find (its output's last line; a package
    without ``__main__``: "PACKAGE.__main__"), or None."""
    lines = [line for line in log_text[-4096:].splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    package = PACKAGE_TO_RUN.fullmatch(last)
    if package:
        return f"{package.group(1)}.__main__"
    match = NO_MODULE_TO_RUN.fullmatch(last)
    return match.group(1) if match else None


def module_to_run_hint(module: str, host: str, workdir: str | None) -> str:
    """What to say of ``python -m module`` that found no ``module`` on ``host``."""
    if module.endswith(".__main__"):
        package = module.removesuffix(".__main__")
        return (f"{package} is a package without a __main__ module: give the module in it that runs the training "
                f"(`-m {package}.train`, say), or add {package}/__main__.py")
    where = f"in {workdir} on {host}" if workdir else f"in its host agent's folder on {host}"
    return (f"tasks run {where}, where `python -m` looks for {module} first (then PYTHONPATH and its "
            "site-packages): start ddlctl from the folder that holds it, give the host workdir= in the hosts file, "
            "or add its folder with --env PYTHONPATH=FOLDER")


def missing_module(log_text: str) -> str | None:
    """The top-level package of the module whose import ended the program (its last traceback
    ends in ``ModuleNotFoundError``), or None."""
    lines = last_traceback(final_error(log_text))
    match = NO_MODULE.fullmatch(lines[-1].strip()) if lines else None
    return match.group(1).split(".")[0] if match else None


def missing_module_hint(module: str, argv: Sequence[str], host: str, found: str | None = None,
                        ours: str | None = None) -> str:
    """What to say of a program on ``host`` that could not import ``module``: the Python its command
    ran (``argv[0]``, ``found`` where the host's PATH found it) lacks it; ``ours``: a Python on that
    host that has it (ddlctl's own, on this machine), to give after ``--`` instead."""
    first = argv[0] if argv else ""
    if os.path.basename(first).startswith("python"):
        where = f" ({found})" if found and found != first else ""
        said = f"it cannot import {module}: the Python it ran under, `{first}`{where} on {host}, does not have it"
    else:  # (a shell script, a wrapper: which Python it starts is its own affair)
        said = f"it cannot import {module}: the Python its command (`{first}`) started on {host} does not have it"
    if ours:
        rest = shlex.join(argv[1:]) if os.path.basename(first).startswith("python") else "PROGRAM"
        example = f"{ours} {rest}" if len(rest) <= 60 else f"{ours} ..."
        return (f"{said}; ddlctl's own Python there does ({ours}): give that one after -- (`-- {example}`), "
                "or activate its environment before starting ddlctl")
    return (f"{said}: install {module} into it, or give after -- a Python on {host} that has it (a bare name "
            "is looked up on the host's PATH, with no virtual environment activated; `ddlctl check` says what "
            "each host's Python imports)")


def import_hint(log_text: str, argv: Sequence[str], host: str, local: bool, workdir: str | None = None,
                executable: object = None) -> str | None:
    """:func:`missing_module_hint` for a failed task's log (:func:`module_to_run_hint` for a
    ``python -m`` that found nothing to run, ``workdir``: the task's folder), or None when no import
    ended it. ``executable``: where the host agent found the command's first word (else, on this
    machine, it is looked up on the PATH). On this machine (``local``) ddlctl's own Python is
    offered when it has the module and is another one."""
    to_run = module_to_run_missing(log_text)
    if to_run is not None:
        return module_to_run_hint(to_run, host, workdir)
    module = missing_module(log_text)
    if module is None:
        return None
    found = executable if isinstance(executable, str) and executable else None
    ours = None
    if local and argv:
        found = found or (shutil.which(argv[0]) if os.sep not in argv[0] else argv[0])
        # (a virtual environment is its path, not its binary: a venv's python links to the one it was made from)
        if not (found and os.path.abspath(found) == os.path.abspath(sys.executable)) and _importable(module):
            ours = sys.executable
    return missing_module_hint(module, argv, host, found, ours)


def _importable(module: str) -> bool:
    """Whether ddlctl's own Python finds ``module`` (found, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
