"""The console every line of ddlctl's goes through: a rich ``Console`` that passes each piece of
text through :func:`~ddlctl.contract.shown.shown` as it is written. Whatever a renderer was given
(a task name in a table, a GPU name from a host, a line of a task's traceback, a notice quoting a
log), no control character reaches the terminal; rich's own sequences (colours, the live region's
cursor moves) are styles and control segments, written as rich writes them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from ddlctl.contract.shown import shown


class SafeConsole(Console):
    """A rich console whose text segments are shown safe (newlines and tabs kept). A string given
    to ``print`` is shown safe before rich makes it a ``Text`` (which would drop BEL and CR
    unseen); every other piece of text when it is written."""

    def render_str(self, text: str, **kwargs: Any) -> Text:  # type: ignore[override]
        return super().render_str(shown(text, keep_newlines=True), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(shown(segment.text, keep_newlines=True), segment.style)
            for segment in buffer)
