"""Built-in training workloads (``ddlctl launch`` with no command runs one of these)."""

#: Workload names accepted by ``--workload``.
WORKLOADS: tuple[str, ...] = ("cnn",)
