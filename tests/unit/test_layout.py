"""The tree is the map: docs/layout.md names every folder of the package, and nothing but the public
API sits at the package's top (the import contract itself is ``lint-imports``, run by .ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ddlctl"


def _folders() -> set[str]:
    return {str(p.parent.relative_to(ROOT)) + "/" for p in PACKAGE.rglob("*.py")} - {"ddlctl/"}


def test_layout_md_names_every_folder_of_the_package_and_no_other():
    text = (ROOT / "docs" / "layout.md").read_text()
    named = set(re.findall(r"^(ddlctl/[\w/]+/)", text, re.M))
    assert named == _folders(), (f"folders missing from docs/layout.md: {sorted(_folders() - named)}; "
                                 f"named there but not in the tree: {sorted(named - _folders())}")


def test_only_the_public_api_sits_at_the_packages_top():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose


def test_the_public_api_is_declared():
    import ddlctl
    import ddlctl.modelparallel as mp

    for module in (ddlctl, mp):
        assert module.__all__ and all(callable(getattr(module, name)) for name in module.__all__), module
