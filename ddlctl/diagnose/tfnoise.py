"""TensorFlow's start-up notices that say nothing to a person (TF 2.21, verbatim in the tests).

Every TensorFlow process prints them before absl is initialised, and no environment variable hides
them: the absl banner, oneDNN's note, "Could not find cuda drivers" and cuInit failures on CPU
hosts, the CPU-instructions notice and its continuation line; and one INFO line per traced function
a ``--strategy model`` chief releases ("Ignoring error status when releasing multi-device function
handle UNIMPLEMENTED": TensorFlow ignores it, and it comes by the dozen at exit); the profiler's
four lines a capture (``--trace``: the report says what was captured). They stay in ``output.log``; the
console leaves them out (``--verbose`` shows everything). Anything else, TensorFlow errors after
start-up included, is always shown.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_GLOG = rb"[IWE]\d{4} \d\d:\d\d:[\d.]+\s+\d+ "
STARTUP_NOISE = re.compile(
    rb"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|" + _GLOG + rb"port\.cc:\d+\] oneDNN custom operations are on\."
    rb"|" + _GLOG + rb"cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    rb"|" + _GLOG + rb"cuda_platform\.cc:\d+\] failed call to cuInit: "
    rb"|" + _GLOG + rb"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU"
    rb"|" + _GLOG + rb"kernel_and_device\.cc:\d+\] Ignoring error status when releasing multi-device function "
    rb"handle UNIMPLEMENTED: Releasing a multi-device component handle on a remote device is not yet implemented\."
    rb"|" + _GLOG + rb"profiler_session\.cc:\d+\] Profiler session (?:initializing|started|collecting data|tear down)\."
    rb"|" + _GLOG + rb"generator_dataset_op\.cc:\d+\] Memory patch applied: "
    rb"|" + _GLOG + rb"dataset\.cc:\d+\] Input of GeneratorDatasetOp::Dataset will not be optimized because "
    rb"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.)")
#: Whether a block of lines holds one of them (one scan: most blocks hold none).
_NOISE_IN_BLOCK = re.compile(rb"(?m)" + STARTUP_NOISE.pattern)


def is_startup_noise(line: bytes) -> bool:
    """Whether ``line`` is one of TensorFlow's known-harmless notices (most come at start-up)."""
    return STARTUP_NOISE.match(line) is not None


#: What every notice holds (a glog line names its source file, ``port.cc:``; absl's banner; the CPU
#: instructions' continuation): a block without any of them holds no notice.
_MARKS = (b".cc:", b"WARNING: All log messages", b"To enable the following")


def noise_in(block: bytes) -> bool:
    """Whether any line of ``block`` (whole lines, joined) may be one of the notices: their marks
    are looked for first (a substring search that skips ahead: a fraction of a byte-by-byte scan,
    where looking for each line's first letter stopped at every newline), the pattern only then."""
    if not any(mark in block for mark in _MARKS):
        return False
    return _NOISE_IN_BLOCK.search(block) is not None


@contextlib.contextmanager
def startup_noise_hidden() -> Iterator[None]:
    """Within the block, this process's file descriptor 2 goes to a spool; at its end, every line
    but the known start-up notices is written to the real stderr (for ddlctl's own commands that
    start TensorFlow in-process, e.g. ``ddlctl partition``; the block should be short: its output
    comes out at its end)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as spool:
        os.dup2(spool.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            spool.seek(0)
            kept = [line for line in spool.read().splitlines(keepends=True) if not is_startup_noise(line)]
            if kept:
                os.write(2, b"".join(kept))
