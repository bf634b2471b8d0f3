"""What the layers promise about where code runs, checked in the Python it runs in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_host_and_contract_import_with_the_standard_library_alone():
    """``host/`` is shipped to hosts whose Python may have nothing installed: with site-packages off
    (``-S``), every module of it and of ``contract/`` imports, and nothing outside the standard
    library and ddlctl is loaded. A module-level ``import psutil`` there fails this test."""
    modules = sorted(f"ddlctl.{p.parent.name}.{p.stem}" for folder in ("host", "contract")
                     for p in (ROOT / "ddlctl" / folder).glob("*.py") if p.stem != "__init__")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "outside = sorted({n.split('.')[0] for n in sys.modules}"
            " - set(sys.stdlib_module_names) - {'ddlctl', '__main__'})\n"
            "print(outside)")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    assert len(modules) > 15
