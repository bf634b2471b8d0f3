"""``python -m ddlctl.workloads``: run the built-in training program in this process."""

import os
import sys

from ddlctl.workloads.train import main

if __name__ == "__main__":
    code = main()
    # Everything is written (steps, result.json, checkpoints); TensorFlow's interpreter shutdown
    # would add about a second to every run and to every restart, for nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
