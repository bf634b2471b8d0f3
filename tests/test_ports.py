"""The ports launch chooses for its tasks (``ddlctl.runtime.probe.free_ports``), on real sockets."""

from __future__ import annotations

import socket

from ddlctl.runtime.probe import LOWEST_PORT, ephemeral_range, free_ports


def test_ports_are_chosen_below_the_ephemeral_range_distinct_and_free(tmp_path):
    low, high = ephemeral_range() or (32768, 60999)
    ports = free_ports(20, (low, high))
    assert len(set(ports)) == 20 and all(LOWEST_PORT <= p < low for p in ports), ports
    held = []
    try:  # free now: each can be bound (what the task does with it)
        for port in ports:
            sock = socket.socket()
            sock.bind(("", port))
            held.append(sock)
        # a port in use is never chosen: with every candidate but one taken (a range of 1,000
        # ports from LOWEST_PORT, all held here but for one), the free one is found
        taken = []
        for port in range(LOWEST_PORT, LOWEST_PORT + 1000):
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            taken.append(sock)
        spare = taken.pop()
        left = spare.getsockname()[1]
        spare.close()
        assert free_ports(1, (LOWEST_PORT + 1000, high), tries=20000) == [left]
        for sock in taken:
            sock.close()
    finally:
        for sock in held:
            sock.close()


def test_without_room_below_the_range_the_kernel_chooses(tmp_path):
    assert ephemeral_range(str(tmp_path / "missing")) is None
    odd = tmp_path / "range"
    odd.write_text("1024\t65535\n")
    assert ephemeral_range(str(odd)) == (1024, 65535)
    low, high = ephemeral_range() or (32768, 60999)  # where the kernel's own choices fall
    for ports in (free_ports(3, (1024, 65535)), free_ports(3, (LOWEST_PORT + 10, 65535))):
        assert len(set(ports)) == 3 and all(low <= p <= high for p in ports), ports
