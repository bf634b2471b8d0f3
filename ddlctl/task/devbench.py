"""Host-side measurements of ``ddlctl check --bench``, run as tasks through the host agent (so a
host's ``cpu_quota=`` applies, as it does to training tasks).

``python -m ddlctl.task.devbench devices [--seconds S]``: matrix-multiply throughput of every
device of this host in its own TensorFlow (each GPU; the CPU when there is none), one JSON line.

``... serve``: listen on a free port (printed as a JSON line), then answer one peer: echo its pings,
swallow its bulk data and acknowledge it. ``... connect HOST:PORT [--megabytes M]``: ping the
server 20 times (median round trip: latency) and send M MiB (bandwidth), one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

PINGS = 20
CHUNK = 1 << 20


def device_speeds(seconds: float, size: int | None = None) -> dict[str, object]:
    """GFLOP/s of chained float32 matmuls on each device, timed for ``seconds`` after a warm-up."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    results = []
    chain = 8

    def chained(a, b):  # noqa: ANN001, ANN202
        for _ in range(chain):
            a = tf.matmul(a, b)
        return tf.reduce_sum(a[:1, :1])

    for device in gpus or ["/device:CPU:0"]:
        n = size or (4096 if gpus else 512)
        run = tf.function(chained)  # traced per device, inside its scope
        with tf.device(device):
            a = tf.random.normal([n, n], seed=1)
            b = tf.random.normal([n, n], seed=2) / (n ** 0.5)  # keeps the chain's magnitude steady
            run(a, b).numpy()  # trace and warm up
            calls, start = 0, time.perf_counter()
            while True:
                run(a, b).numpy()
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    break
        results.append({"device": device, "kind": "gpu" if gpus else "cpu", "matrix": n,
                        "gflops": calls * chain * 2 * n ** 3 / elapsed / 1e9})
    return {"tensorflow": tf.__version__, "cpus": os.cpu_count(), "devices": results}


def local_gflops(seconds: float = 1.0) -> float:
    """GFLOP/s of this process's first device (the one a model profiled here runs on), measured
    with the same kernel as ``check --bench``: the reference that measured speeds are relative to."""
    return float(device_speeds(seconds)["devices"][0]["gflops"])  # type: ignore[index]


def serve(timeout: float) -> dict[str, object]:
    """Answer one :func:`connect` peer."""
    with socket.create_server(("", 0), family=socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET,
                              dualstack_ipv6=socket.has_dualstack_ipv6()) as server:
        server.settimeout(timeout)
        print(json.dumps({"port": server.getsockname()[1]}), flush=True)
        peer, _ = server.accept()
    with peer:
        peer.settimeout(timeout)
        for _ in range(PINGS):
            peer.sendall(_exactly(peer, 1))
        size = int.from_bytes(_exactly(peer, 8), "big")
        left = size
        while left:
            data = peer.recv(min(CHUNK, left))
            if not data:
                raise ConnectionError("the peer went away mid-transfer")
            left -= len(data)
        peer.sendall(b"k")
    return {"served": size}


def connect(target: str, megabytes: float, timeout: float) -> dict[str, object]:
    """Latency (median ping round trip) and bandwidth (bytes/s of a bulk send) to a server."""
    host, _, port = target.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        trips = []
        for _ in range(PINGS):
            start = time.perf_counter()
            sock.sendall(b"p")
            _exactly(sock, 1)
            trips.append(time.perf_counter() - start)
        size = int(megabytes * CHUNK)
        block = b"\0" * CHUNK
        start = time.perf_counter()
        sock.sendall(size.to_bytes(8, "big"))
        left = size
        while left:
            sent = sock.send(block[:min(CHUNK, left)])
            left -= sent
        _exactly(sock, 1)
        elapsed = time.perf_counter() - start
    return {"latency_s": statistics.median(trips), "bandwidth_bytes_per_s": size / elapsed, "bytes": size}


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlctl.task.devbench")
    sub = parser.add_subparsers(dest="what", required=True)
    devices = sub.add_parser("devices")
    devices.add_argument("--seconds", type=float, default=1.0)
    devices.add_argument("--size", type=int, default=None)
    served = sub.add_parser("serve")
    served.add_argument("--timeout", type=float, default=60.0)
    client = sub.add_parser("connect")
    client.add_argument("target")
    client.add_argument("--megabytes", type=float, default=32.0)
    client.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.what == "devices":
        result = device_speeds(args.seconds, args.size)
    elif args.what == "serve":
        result = serve(args.timeout)
    else:
        result = connect(args.target, args.megabytes, args.timeout)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # TensorFlow's interpreter shutdown (after ``devices``) adds a CPU-second, for nothing
