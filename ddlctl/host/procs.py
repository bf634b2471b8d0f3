"""What a host agent sees of its host's processes and sockets: a process group's members and their
states, which TCP ports are free or listened on, and by whom. Standard library only (it runs from
ddlctl's code bundle)."""

from __future__ import annotations

import os
import socket
import struct

from ddlctl.host.killrun import agents_of


def processes_with(entries: list[str], exclude: set[int] | frozenset[int] = frozenset(),
                   starting: str | None = None, without: str | None = None) -> list[int]:
    """Pids (but this process and ``exclude``) whose environment holds every ``KEY=VALUE`` of
    ``entries`` (with ``starting``, an entry that begins so; with ``without``, not that entry): only
    processes whose environment we may read (our own) are considered."""
    needles = [entry.encode() for entry in entries]
    start = starting.encode() if starting else None
    unwanted = without.encode() if without else None
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = set(handle.read().split(b"\0"))
        except OSError:
            continue
        if all(needle in environ for needle in needles) and unwanted not in environ \
                and (start is None or any(e.startswith(start) for e in environ)):
            found.append(int(entry))
    return found


def command_line(pid: int, limit: int = 80) -> str:
    """The command line of ``pid``, its first ``limit`` characters ("" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:limit]
    except OSError:
        return ""


def stat_of(pid: int | str) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of ``/proc/PID/stat`` (state, parent, group, ... CPU
    times: ``man 5 proc``), or None when gone. The name may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    close = stat.rfind(")")
    return stat[stat.find("(") + 1:close], stat[close + 2:].split()


def _pids() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def parents() -> dict[int, int]:
    """pid -> parent pid of every process here."""
    found = {}
    for entry in _pids():
        stat = stat_of(entry)
        if stat is not None and len(stat[1]) > 1:
            found[int(entry)] = int(stat[1][1])
    return found


def descendants(root: int, skip: set[int] | frozenset[int] = frozenset(),
                table: dict[int, int] | None = None) -> list[int]:
    """Every process below ``root`` (children first), leaving out the processes of ``skip`` and
    everything below them."""
    children: dict[int, list[int]] = {}
    for pid, parent in (parents() if table is None else table).items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in skip and child != root:
                found.append(child)
                todo.append(child)
    return found


def tree_of(roots: list[int]) -> dict[int, int]:
    """Every process at or below the processes ``roots``: pid -> the root it is under. From the
    kernel's lists of each thread's children (``/proc/PID/task/TID/children``: a few small reads per
    process of the tree, whatever else runs on the host); where the kernel has no such lists
    (built without ``CONFIG_PROC_CHILDREN``), from one pass over every process's parent."""
    found: dict[int, int] = {}
    table: dict[int, int] | None = None
    for root in roots:
        if root in found or not os.path.exists(f"/proc/{root}"):
            continue
        found[root] = root
        todo = [root]
        while todo:
            pid = todo.pop()
            kids = _children(pid)
            if kids is None:  # (no children lists here: the parents of every process, once)
                table = parents() if table is None else table
                kids = [child for child in descendants(pid, table=table) if child not in found]
                found.update((child, root) for child in kids)
                continue
            for child in kids:
                if child not in found:
                    found[child] = root
                    todo.append(child)
    return found


def _children(pid: int) -> list[int] | None:
    """The children of process ``pid`` (of each of its threads; [] when gone), None when this
    kernel keeps no children lists."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as handle:
                kids.extend(int(child) for child in handle.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{thread}"):
                continue  # (the thread ended)
            return None
        except OSError:
            continue
    return kids


def run_elsewhere(run_id: str, launch: str, limit: int = 5) -> list[tuple[int, str]]:
    """(pid, command) of up to ``limit`` processes here that carry ``DDLCTL_RUN_ID=run_id`` but not
    ``DDLCTL_LAUNCH=launch``: another launch given the same run id (or what it left running)."""
    found = processes_with([f"DDLCTL_RUN_ID={run_id}"], without=f"DDLCTL_LAUNCH={launch}")
    found = sorted(set(found) | set(agents_of(run_id, launch, other_launch=True)))  # (sealed: by command line)
    return [(pid, command) for pid in found[:limit] if (command := command_line(pid))]


def group_processes(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, state letter, command) of every process in process group ``pgid``."""
    found = []
    for entry in _pids():
        stat = stat_of(entry)
        if stat is not None and len(stat[1]) > 2 and int(stat[1][2]) == pgid:
            found.append((int(entry), stat[1][0], stat[0]))
    return found


def work_done(pids: list[int]) -> tuple[float, int]:
    """(CPU seconds, bytes read and written) that processes ``pids`` have used so far: user and
    system time with that of their ended children (``/proc/PID/stat``), and every byte their
    ``read``/``write`` calls moved, files, pipes and sockets alike (``/proc/PID/io``; 0 where the
    kernel hides it). Two readings a few seconds apart say whether a process is at work."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    cpu, moved = 0.0, 0
    for pid in pids:
        stat = stat_of(pid)
        try:
            cpu += sum(int(stat[1][i]) for i in (11, 12, 13, 14)) / ticks  # utime stime cutime cstime
        except (TypeError, ValueError, IndexError):  # (gone: None)
            continue
        try:
            with open(f"/proc/{pid}/io", "rb") as handle:
                counters = dict(line.split(b":", 1) for line in handle.read().splitlines() if b":" in line)
            moved += int(counters.get(b"rchar", b"0")) + int(counters.get(b"wchar", b"0"))
        except (OSError, ValueError):
            pass
    return cpu, moved


def wait_channel(pid: int) -> str:
    """The kernel function process ``pid`` sleeps in (``/proc/PID/wchan``: "nfs_wait_on_request",
    "io_schedule", ...), or "" when unknown (hidden, gone, or running)."""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as handle:
            name = handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return "" if name == "0" else name


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound now (as a TensorFlow server would, with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            return True
        except OSError:
            return False


def accepts(port: int) -> bool:
    """Whether something on this host accepts connections on ``port`` (IPv4 or IPv6 loopback)."""
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family) as sock:
                sock.settimeout(0.2)
                sock.connect((address, port))
                return True
        except OSError:
            continue
    return False


def listening_sockets() -> dict[int, set[str]]:
    """Port -> inodes of the sockets listening on it, for every TCP port of this network namespace
    (IPv4 and IPv6). Asks the kernel over netlink (sock_diag: only listening sockets, ~0.03 ms);
    where that is refused, reads /proc/net/tcp and tcp6, which the kernel generates by walking
    every socket bucket (~4 ms a table here, even with a handful of sockets)."""
    try:
        return _listening_by_netlink()
    except (OSError, ValueError, AttributeError, struct.error):  # AttributeError: no AF_NETLINK (not Linux)
        return _listening_by_proc()


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id


def _listening_by_netlink() -> dict[int, set[str]]:
    """Listening TCP sockets from an inet_diag dump (what ``ss -lt`` asks), IPv4 then IPv6."""
    listening: dict[int, set[str]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(2.0)
        for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            # inet_diag_req_v2: family, protocol, extensions, pad, states bitmask, a zeroed sockid
            request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN) + bytes(48)
            sock.send(_NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                         _NLM_F_REQUEST_DUMP, sequence, 0) + request)
            done = False
            while not done:
                data = sock.recv(1 << 16)
                if not data:
                    raise OSError("netlink: empty reply")
                offset = 0
                while offset + _NLMSG_HEADER.size <= len(data):
                    length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
                    if kind == _NLMSG_ERROR:
                        raise OSError("netlink: sock_diag refused")
                    if kind == _NLMSG_DONE or length < _NLMSG_HEADER.size:
                        done = True
                        break
                    # inet_diag_msg: family, state, timer, retrans; sockid (sport big-endian at +4,
                    # 48 bytes); expires, rqueue, wqueue, uid; inode at +68
                    body = offset + _NLMSG_HEADER.size
                    state = data[body + 1]
                    port = struct.unpack_from(">H", data, body + 4)[0]
                    inode = struct.unpack_from("=I", data, body + 68)[0]
                    if state == _TCP_LISTEN:
                        listening.setdefault(port, set()).add(str(inode))
                    offset += (length + 3) & ~3
    return listening


def _listening_by_proc() -> dict[int, set[str]]:
    listening: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A":
                listening.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(fields[9])
    return listening


def group_listens(pgid: int, port: int, listening: dict[int, set[str]] | None = None) -> bool:
    """Whether a process of group ``pgid`` itself listens on ``port`` (not just anyone: a port taken
    by another program must not pass for the task's). Without /proc/net: whether anyone accepts.
    ``listening``: a :func:`listening_sockets` reading to use instead of reading the tables again."""
    if not os.path.exists("/proc/net/tcp"):
        return accepts(port)
    inodes = (listening_sockets() if listening is None else listening).get(port)
    if not inodes:
        return False
    for pid, _state, _cmd in group_processes(pgid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


def fresh_port() -> int:
    """A port free on this host now, chosen as launch chooses them (:func:`ddlctl.host.ports.free_ports`)."""
    from ddlctl.host.ports import free_ports

    return free_ports(1)[0]
