"""ddlctl: launch and profile TensorFlow distributed training on many machines.

Kept import-light on purpose: ``ddlctl --help`` must not pull in TensorFlow or NVML.
"""

__version__ = "0.1.0"
