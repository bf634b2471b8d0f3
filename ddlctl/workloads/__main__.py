"""``python -m ddlctl.workloads``: run the built-in training program in this process."""

import sys

from ddlctl.workloads.train import main

if __name__ == "__main__":
    sys.exit(main())
