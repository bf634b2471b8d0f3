"""The ports launch chooses for its tasks (``ddlctl.host.ports.free_ports``), on real sockets."""

from __future__ import annotations

import os
import socket

from ddlctl.host.ports import CLAIM_S, LOWEST_PORT, PRUNE_AT, claim, ephemeral_range, free_ports, prune_claims


def test_ports_are_chosen_below_the_ephemeral_range_distinct_and_free(tmp_path):
    low, high = ephemeral_range() or (32768, 60999)
    ports = free_ports(20, (low, high), folder=str(tmp_path))
    assert len(set(ports)) == 20 and all(LOWEST_PORT <= p < low for p in ports), ports
    held = []
    try:  # free now: each can be bound (what the task does with it)
        for port in ports:
            sock = socket.socket()
            sock.bind(("", port))
            held.append(sock)
        # a port in use is never chosen: with every candidate but one taken (a range of 1,000
        # ports from LOWEST_PORT, all held here but for one), the free one is found
        taken, left = _hold_all_but(1, LOWEST_PORT, LOWEST_PORT + 1000)
        assert free_ports(1, (LOWEST_PORT + 1000, high), tries=20000, folder=str(tmp_path / "b")) == left
        for sock in taken:
            sock.close()
    finally:
        for sock in held:
            sock.close()


def _hold_all_but(n: int, first: int, last: int) -> tuple[list[socket.socket], list[int]]:
    """Bind every port from ``first`` to ``last`` that is free, but for ``n`` of them: (the sockets
    holding the rest, the ``n`` left free)."""
    held = []
    for port in range(first, last):
        sock = socket.socket()
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            continue
        held.append(sock)
    spare = [held.pop() for _ in range(n)]
    left = [sock.getsockname()[1] for sock in spare]
    for sock in spare:
        sock.close()
    return held, left


def test_a_port_another_launch_chose_is_not_chosen_until_its_claim_is_old(tmp_path):
    folder = str(tmp_path / "claims")
    within = (LOWEST_PORT + 1000, 60999)  # candidates: LOWEST_PORT .. +999
    held, left = _hold_all_but(4, LOWEST_PORT, LOWEST_PORT + 1000)
    try:
        first = free_ports(3, within, tries=20000, folder=folder)
        assert set(first) < set(left)
        # the first launch's tasks have not bound their ports yet: free, but claimed, so a second
        # launch gets the one port left (without claims: one of the four, the first's 3 times in 4)
        assert sorted(int(name) for name in os.listdir(folder)) == sorted(first)
        assert free_ports(1, within, tries=20000, folder=folder) == sorted(set(left) - set(first))
        # a claim older than CLAIM_S is taken over (its task bound the port long ago, or never will)
        port = first[0]
        assert not claim(port, folder)
        assert claim(port, folder, now=os.stat(os.path.join(folder, str(port))).st_mtime + CLAIM_S + 1)
    finally:
        for sock in held:
            sock.close()


def test_without_room_below_the_range_the_kernel_chooses(tmp_path):
    assert ephemeral_range(str(tmp_path / "missing")) is None
    odd = tmp_path / "range"
    odd.write_text("1024\t65535\n")
    assert ephemeral_range(str(odd)) == (1024, 65535)
    low, high = ephemeral_range() or (32768, 60999)  # where the kernel's own choices fall
    for ports in (free_ports(3, (1024, 65535), folder=str(tmp_path)),
                  free_ports(3, (LOWEST_PORT + 10, 65535), folder=str(tmp_path))):
        assert len(set(ports)) == 3 and all(low <= p <= high for p in ports), ports


def test_old_claims_are_cleared_once_they_pile_up(tmp_path):
    folder = tmp_path / "claims"
    folder.mkdir()
    old = 1_000_000.0
    for port in range(20000, 20000 + PRUNE_AT):  # outside the candidates below
        (folder / str(port)).touch()
        os.utime(folder / str(port), (old, old))
    assert prune_claims(str(folder), now=old + 2 * CLAIM_S) == 0  # not yet too many
    fresh = free_ports(3, (LOWEST_PORT + 1000, 60999), folder=str(folder))  # claims 3 more, now
    assert prune_claims(str(folder), now=None) == PRUNE_AT  # the old ones go, the new stay
    assert sorted(int(p.name) for p in folder.iterdir()) == sorted(fresh)


def test_a_host_that_cannot_bind_says_so_instead_of_searching_forever(monkeypatch, tmp_path):
    from ddlctl.host import probe

    class Refusing(socket.socket):
        def bind(self, address):  # noqa: ANN001, ANN202
            raise OSError(98, "Address already in use")

    monkeypatch.setattr(probe.socket, "socket", Refusing)
    assert probe.can_bind_ports(2) is False
    try:
        free_ports(2, (LOWEST_PORT + 1000, 60999), tries=50, folder=str(tmp_path))
    except OSError as exc:
        assert exc.errno == 98
    else:
        raise AssertionError("free_ports returned ports it could not bind")


def test_a_claims_folder_someone_else_could_have_planted_is_not_used_and_no_link_is_followed(tmp_path):
    # before: the folder's name is predictable (/tmp/ddlctl-ports-<uid>) and was used whoever made
    # it; a link planted there had a victim file's modification time changed
    victim = tmp_path / "victim"
    victim.write_text("x")
    os.utime(victim, (1000, 1000))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "23456").symlink_to(victim)
    assert claim(23456, str(shared), now=5000) and victim.stat().st_mtime == 1000
    assert claim(23456, str(shared), now=5001), "no claims kept in a folder others may write"
    planted = tmp_path / "mine"
    planted.mkdir(mode=0o700)
    (planted / "23457").symlink_to(victim)
    assert claim(23457, str(planted), now=os.lstat(planted / "23457").st_mtime + CLAIM_S + 1)
    assert victim.stat().st_mtime == 1000 and (planted / "23457").is_symlink()
