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
    import inspect

    import ddlctl
    import ddlctl.modelparallel as mp

    for module in (ddlctl, mp):  # (functions, and namespaces of them: ddlctl.data)
        assert module.__all__ and all(callable(getattr(module, name)) or inspect.ismodule(getattr(module, name))
                                      for name in module.__all__), module


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these (one job a module): {long}"


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each prose paragraph and list item of a Markdown text (code blocks,
    tables and headings aside)."""
    found: list[tuple[int, list[str]]] = []
    fenced, current = False, None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced, current = not fenced, None
        elif fenced or not line.strip() or line.startswith(("|", "#")):
            current = None
        elif current is None or re.match(r"\s*([-*]|\d+\.)\s", line):
            current = [line]
            found.append((number, current))
        else:
            current.append(line)
    return [(number, " ".join(lines)) for number, lines in found]


def test_readme_and_docs_read_in_short_paragraphs():
    """README under 130 lines; no paragraph or list item over 120 words (figures go in tables)."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 130
    long = [f"{path.relative_to(ROOT)}:{number} ({len(text.split())} words)"
            for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for number, text in _paragraphs(path.read_text()) if len(text.split()) > 120]
    assert not long, f"split these: {long}"
