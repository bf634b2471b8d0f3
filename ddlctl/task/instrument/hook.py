"""Post-import hook: patch ``keras`` / ``tf_keras`` ``Model.fit`` as soon as the program imports
them, so ``model.fit`` records step timings without code changes (``--no-auto-steps`` turns it off).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGETS = ("keras", "tf_keras")


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the real spec of a target module and patches the module right after it executes."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name not in TARGETS or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            original(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(module: object) -> None:
    try:
        from ddlctl.task.instrument.keras import patch_fit

        patch_fit(module)
    except Exception as exc:  # noqa: BLE001 - instrumentation must never break the program
        print(f"ddlctl: could not instrument {getattr(module, '__name__', module)}.Model.fit: {exc}",
              file=sys.stderr)


def install() -> None:
    """Install the hook (and patch targets already imported)."""
    if any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchAfterImport())
    for name in TARGETS:
        if name in sys.modules:
            _patch(sys.modules[name])
