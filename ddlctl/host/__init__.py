"""What runs on every host, shipped there in the code bundle: the host agent and its tasks, process and
socket facts, the zygote's agent side, the telemetry agent and NVML. Standard library only at import
(``tests/system/test_layout.py`` checks it)."""
