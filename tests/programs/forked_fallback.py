"""A program ddlctl takes for a TensorFlow one (the import below) that never imports it: with a
TensorFlow that cannot be imported its zygote fails, and it must still run (tests/system/test_prefork.py)."""

import os
import sys

if os.environ.get("NEVER"):
    import tensorflow  # noqa: F401

print(f"ran plain {'tensorflow' in sys.modules}", flush=True)
