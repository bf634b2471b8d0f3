"""A tf.data service task ddlctl starts (:mod:`ddlctl.planning.dataservice`): the dispatcher
(fault-tolerant: it journals in ``$DDLCTL_TASK_DIR/journal`` and, started again, carries on from
it) or a data worker (registers with the dispatcher, runs the trainers' input pipelines, sends them
the elements). It binds the port in ``$DDLCTL_DATA_ADDRESS`` and serves until it is stopped.
"""

from __future__ import annotations

import os
import sys

from ddlctl.contract import envvars
from ddlctl.task.tfenv import quiet_tensorflow_logs


def main() -> int:
    quiet_tensorflow_logs()
    name = os.environ.get(envvars.TASK, "data:0")
    host, _, port = os.environ.get(envvars.DATA_ADDRESS, "").rpartition(":")
    if not port.isdigit():
        print(f"ddlctl data service: {name}: no address in ${envvars.DATA_ADDRESS}", file=sys.stderr)
        return 2
    import tensorflow as tf

    service = tf.data.experimental.service
    if name.startswith("dispatcher:"):
        journal = os.path.join(os.environ.get(envvars.TASK_DIR) or ".", "journal")
        again = os.path.isdir(journal) and bool(os.listdir(journal))
        os.makedirs(journal, exist_ok=True)
        server = service.DispatchServer(service.DispatcherConfig(port=int(port), work_dir=journal,
                                                                 fault_tolerant_mode=True))
        print(f"ddlctl data service: {name} dispatches at {host}:{port}"
              + (" (carrying on from its journal)" if again else ""), flush=True)
    else:
        dispatcher = os.environ.get(envvars.DATA_DISPATCHER, "")
        server = service.WorkerServer(service.WorkerConfig(dispatcher_address=dispatcher,
                                                           worker_address=f"{host}:{port}", port=int(port)))
        print(f"ddlctl data service: {name} serves input at {host}:{port} (dispatcher {dispatcher})", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
