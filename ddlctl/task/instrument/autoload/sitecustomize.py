"""Loaded at interpreter start-up in every Python task ddlctl starts (this folder is first on PYTHONPATH).

Registers the stack dumper (``ddlctl.task.stack_dumper``: stacks on SIGUSR2 for the hang watch),
installs ddlctl's model.fit hook (``--auto-steps``), then runs the ``sitecustomize`` this one
shadows, if any.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _ddlctl_autoload() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import ddlctl.task.stack_dumper as stacks
    except ImportError:  # this interpreter does not have ddlctl: use the copy we came from
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here)))))
        import ddlctl.task.stack_dumper as stacks
    stacks.install()
    if os.environ.get("DDLCTL_AUTO_STEPS") == "1":
        import ddlctl.task.instrument.hook as hook

        hook.install()
    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _ddlctl_autoload()
except Exception as exc:  # noqa: BLE001 - never stop the user's program from starting
    print(f"ddlctl: auto-instrumentation disabled: {exc}", file=sys.stderr)
