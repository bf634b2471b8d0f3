"""Importing TensorFlow without the cyclic garbage collector, then freezing what the import made.
Standard library only (a zygote imports it before TensorFlow).

The import makes ~270,000 objects that live as long as the process. The collector's passes over
them as they accumulate cost 13-30% of the import's CPU time, every later full collection goes
over them again (0.2 CPU-s each), and so does Python's own shutdown (a forked program's end took
1.0 CPU-s, 0.25 with them frozen): ``benchmarks/zygote_import.py``. ``gc.freeze`` moves them to the
collector's permanent generation, which no collection looks at; in a process that forks without
exec (a zygote) it is Python's documented recipe, as a child's collections then no longer write to
the pages it shares with its parent (2.4x fewer copied)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_off_then_frozen() -> Iterator[None]:
    """Run the body (imports) with the cyclic collector off; then collect once (what the body made
    and dropped is not kept for good), freeze everything the process holds and turn the collector
    back on (whatever the body raised)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if was_on:
            gc.enable()
