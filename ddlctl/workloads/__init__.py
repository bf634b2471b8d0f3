"""Built-in training workloads (``ddlctl launch`` with no command runs one of these)."""

#: Workload names accepted by ``--workload``.
WORKLOADS: tuple[str, ...] = ("cnn", "mlp", "deep", "heavy")

#: Workloads whose input pipeline does heavy augmentation.
AUGMENTED: frozenset[str] = frozenset({"cnn", "heavy"})
#: Workloads whose input also decodes each image (a JPEG of 4x its size: several times the step's
#: compute per sample, for the tf.data service to take off the trainers: ``heavy``, cnn's model).
DECODED: frozenset[str] = frozenset({"heavy"})

#: Execution modes of the built-in workloads (``--execution``): pipelined (tf.data with parallel
#: map and prefetch, input overlapping compute), linear (the same tf.data input with no prefetch and
#: no parallel map: input and compute strictly alternate) and python-feed (batches built in Python
#: sample by sample and fed one step per call: the strawman, kept under its own name).
EXECUTIONS: tuple[str, ...] = ("pipelined", "linear", "python-feed")
