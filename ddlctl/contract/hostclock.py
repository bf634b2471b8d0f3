"""A host's clock against ddlctl's: the thresholds and the words, one place for the job (the
supervisor), ``check`` and the report (pure, standard library only)."""

from __future__ import annotations

#: A host's clock this far from this machine's (seconds) is corrected for: its task exits are
#: ordered, and its step times and samples reported, on this machine's clock (outcome.json
#: ``clock_offsets``). Below it, the difference is within what a frame's delay blurs.
CLOCK_CORRECTED_S = 0.1
#: A host's clock this far off (seconds) is said: by the job, by ``check``, by the report.
CLOCK_SAID_S = 1.0
#: What to do about it.
SYNCHRONISE = "synchronise the hosts' clocks (chrony, systemd-timesyncd)"


def how_far(offset: float, whose: str = "this machine's") -> str:
    """``"42.0s ahead of this machine's"`` / ``"3.5s behind ddlctl's"`` for a host clock ``offset``
    seconds off."""
    return f"{abs(offset):.1f}s {'ahead of' if offset > 0 else 'behind'} {whose}"
