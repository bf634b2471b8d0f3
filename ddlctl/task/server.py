"""A ``tf.distribute.Server`` for ps-strategy worker and ps tasks: ``python -m ddlctl.task.server``.

It reads its identity from ``TF_CONFIG``, starts the gRPC server and blocks until ddlctl stops it
(a plain server exits on SIGTERM).

A server needs TensorFlow's runtime, not its Python API: where nothing else would be loaded by a
full ``import tensorflow`` (no dynamic kernels or device plugins beside it, no profiler asked for),
it imports only the modules that create the server, which skips building the ``tf.*`` API and
Keras (40% of the import: 2.2 instead of 3.8 CPU-seconds on a 2-core VM), so ps jobs start and
restart sooner. If that import fails (another TensorFlow's layout), the process runs itself again
with the full import (:data:`FULL_IMPORT`).
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
import types

from ddlctl.contract import envvars
from ddlctl.host.procs import port_free
from ddlctl.task.tfenv import min_inter_op_threads, quiet_tensorflow_logs, task_context

#: Set (to 1) in the environment when the server runs itself again with ``import tensorflow``.
FULL_IMPORT = "DDLCTL_SERVER_FULL_IMPORT"


def _loads_more(tf_dir: str) -> bool:
    """Whether ``import tensorflow`` would load more than the runtime: dynamic kernels in its
    ``core/kernels``, a ``tensorflow-plugins`` folder in a site-packages, a pluggable device."""
    if os.path.exists(os.path.join(tf_dir, "core", "kernels")) or os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
        return True
    folders = {p for p in sys.path if "site-packages" in p}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    if site.ENABLE_USER_SITE and site.USER_SITE:
        folders.add(site.USER_SITE)
    for scheme in sysconfig.get_scheme_names():
        folders.update(sysconfig.get_path(name, scheme) for name in ("purelib", "platlib"))
    return any(os.path.exists(os.path.join(folder, "tensorflow-plugins")) for folder in folders if folder)


def server_api(lean: bool) -> tuple[type, type, type]:
    """(``Server``, ``TFConfigClusterResolver``, ``ConfigProto``): from the modules that define
    them alone when ``lean`` and nothing more would be loaded, else through ``import tensorflow``.
    A lean import leaves ``tensorflow`` in ``sys.modules`` as a bare package (no ``tf.*`` API)."""
    spec = importlib.util.find_spec("tensorflow")
    if lean and spec is not None and spec.submodule_search_locations and "tensorflow" not in sys.modules \
            and not _loads_more(list(spec.submodule_search_locations)[0]):
        package = types.ModuleType("tensorflow")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        sys.modules["tensorflow"] = package
        from tensorflow.core.protobuf.config_pb2 import ConfigProto
        from tensorflow.python.distribute.cluster_resolver.tfconfig_cluster_resolver import TFConfigClusterResolver
        from tensorflow.python.training.server_lib import Server

        return Server, TFConfigClusterResolver, ConfigProto
    import tensorflow as tf

    return tf.distribute.Server, tf.distribute.cluster_resolver.TFConfigClusterResolver, tf.compat.v1.ConfigProto


def profiler_port(base: str | None, role: str, index: int, planned: str | None = None) -> int | None:
    """The port this task serves TensorFlow's profiler on: the one ddlctl planned for ``--trace``
    (``$DDLCTL_PROFILER_SERVE``), else ``$DDLCTL_PROFILER_PORT`` + its index (ps tasks + 100 more),
    or None when neither is a port number."""
    if planned and planned.isdigit():
        return int(planned)
    if not base or not base.isdigit():
        return None
    return int(base) + index + (100 if role == "ps" else 0)


def main() -> int:
    """Start the server described by TF_CONFIG and join it."""
    quiet_tensorflow_logs()
    ctx = task_context("ps")
    profiler = profiler_port(os.environ.get(envvars.PROFILER_PORT), ctx.role, ctx.index,
                             os.environ.get(envvars.PROFILER_SERVE))
    try:
        server_class, resolver_class, config_class = server_api(lean=not profiler and not os.environ.get(FULL_IMPORT))
    except ImportError:
        if os.environ.get(FULL_IMPORT):
            raise
        # a TensorFlow laid out otherwise: run again, with the whole import (same pid, a clean interpreter)
        os.environ[FULL_IMPORT] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "ddlctl.task.server"])
    resolver = resolver_class()
    if not resolver.cluster_spec().as_dict():
        print("ddlctl server: TF_CONFIG is missing or has no cluster", file=sys.stderr)
        return 2
    config = config_class(inter_op_parallelism_threads=min_inter_op_threads(ctx.num_workers))
    server = server_class(
        resolver.cluster_spec(), job_name=ctx.role, task_index=ctx.index,
        protocol=resolver.rpc_layer or "grpc", config=config, start=True)
    if profiler:
        import tensorflow as tf

        if not port_free(profiler):  # (TensorFlow would only log it, and serve no profiler: a retry takes a new one)
            print(f"ddlctl server: {ctx.name} cannot serve TensorFlow's profiler on port {profiler}: Address already "
                  "in use", file=sys.stderr, flush=True)
            return 1
        tf.profiler.experimental.server.start(profiler)
        print(f"ddlctl server: {ctx.name} serves TensorFlow's profiler on port {profiler}", flush=True)
    print(f"ddlctl server: {ctx.name} listening at {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
