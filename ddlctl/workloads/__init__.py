"""Built-in training workloads (``ddlctl launch`` with no command runs one of these)."""

#: Workload names accepted by ``--workload``.
WORKLOADS: tuple[str, ...] = ("cnn", "mlp")

#: Workloads whose input pipeline does heavy augmentation.
AUGMENTED: frozenset[str] = frozenset({"cnn"})
