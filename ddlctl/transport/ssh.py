"""SSH transport (paramiko): one connection per host, opened in parallel, reused for its tasks.

Connections honour ``~/.ssh/config`` (Host aliases, HostName, User, Port, IdentityFile), the
ssh-agent and ``--ssh-key``. Host keys are checked against the user's known-hosts files
(``~/.ssh/known_hosts``, or ``UserKnownHostsFile``) and the system's (``/etc/ssh/ssh_known_hosts``,
or ``GlobalKnownHostsFile``: where administrators publish their hosts' keys); unknown keys are
refused unless ``accept_new_host_keys`` (like ``StrictHostKeyChecking=accept-new``: recorded in the
first user file), and a changed key is always refused. Every failure names the host and a reason a person can act on.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlctl.cluster.model import Host
from ddlctl.contract import envvars
from ddlctl.contract.errors import ConfigError, LaunchError
from ddlctl.transport.agentcmd import no_python
from ddlctl.transport.fanout import all_or_fail, each_host
from ddlctl.transport.options import SshOptions
from ddlctl.transport.remote import (
    EXPAND_1,
    FIND_BUNDLE,
    NEED_CODE_EXIT,
    UPLOAD_BUNDLE,
    bundle_path,
    bundled_agent_argv,
    code_bundle,
    shell_command,
    start_bundled_agent,
    upload_args,
)
from ddlctl.transport.session import HostSession


def _import_paramiko():  # noqa: ANN202 - the module
    """paramiko, imported without ``invoke``: paramiko loads it (~40 ms, a third of its import)
    only to run ``Match exec`` lines of an SSH config; :func:`resolve_target` loads it for a
    config that has one."""
    import sys

    if "paramiko" in sys.modules or "invoke" in sys.modules:
        import paramiko
    else:
        sys.modules["invoke"] = None  # type: ignore[assignment] - `import invoke` raises ImportError
        try:
            import paramiko
        finally:
            del sys.modules["invoke"]
    return paramiko


paramiko = _import_paramiko()

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")

# paramiko logs every refused port probe as a warning; ddlctl reports failures itself.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False
_known_hosts_lock = threading.Lock()


#: OpenSSH's ``GlobalKnownHostsFile`` default: where administrators publish their hosts' keys.
SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


@dataclass(frozen=True)
class Target:
    """Where a host really is after ``~/.ssh/config``: address, port, user, identity files."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    #: known-hosts files, OpenSSH's order: the user's (new keys go to the first), then the system's
    user_known_hosts: tuple[str, ...] = ("~/.ssh/known_hosts",)
    global_known_hosts: tuple[str, ...] = SYSTEM_KNOWN_HOSTS
    hash_known_hosts: bool = False  # HashKnownHosts: a key accepted is recorded under a hashed name


@functools.lru_cache(maxsize=4)
def _ssh_config(path: str) -> paramiko.SSHConfig:
    """An SSH config file, parsed once per launch (with ``invoke`` when it has ``Match exec``)."""
    text = Path(path).read_text(errors="replace")
    if re.search(r"(?im)^\s*match\b.*\bexec\b", text) and paramiko.config.invoke is None:
        with contextlib.suppress(ImportError):
            import invoke

            paramiko.config.invoke = invoke
    return paramiko.SSHConfig.from_text(text)


def resolve_target(host: Host, options: SshOptions) -> Target:
    """Apply ``~/.ssh/config`` to a host (explicit hosts-file values win)."""
    config: dict[str, object] = {}
    path = Path(options.ssh_config).expanduser()
    if path.is_file():
        config = _ssh_config(str(path)).lookup(host.name)
    for key, option in (("proxycommand", "ProxyCommand"), ("proxyjump", "ProxyJump"), ("hostkeyalias", "HostKeyAlias")):
        value = str(config.get(key) or "")
        if value and value.lower() != "none":  # (connecting straight to HostName would skip what it says)
            straight = config.get("hostname", host.name)
            raise ConfigError(f"{path}: {option} {value!r} applies to host {host.name}, and ddlctl does not "
                              f"follow {option} yet (it would connect straight to {straight})",
                              f"list a host ddlctl can reach directly, or give it a Host block without {option}")
    port = host.port if host.port != 22 else int(str(config.get("port", 22)))
    user = host.user or options.user or str(config.get("user") or getpass.getuser())
    keys: tuple[str, ...] = ()
    if options.key_file:
        keys = (str(Path(options.key_file).expanduser()),)
    elif config.get("identityfile"):
        keys = tuple(str(Path(k).expanduser()) for k in config["identityfile"])  # type: ignore[union-attr]
    user_files = str(config.get("userknownhostsfile") or "").split() or [options.known_hosts]
    global_files = str(config.get("globalknownhostsfile") or "").split() or list(SYSTEM_KNOWN_HOSTS)
    return Target(hostname=str(config.get("hostname", host.name)), port=port, user=user, key_files=keys,
                  user_known_hosts=tuple(user_files), global_known_hosts=tuple(global_files),
                  hash_known_hosts=str(config.get("hashknownhosts", "no")).lower() == "yes")


def _known_hosts_entry(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Accept and record an unknown key (a changed key still fails: paramiko raises before)."""

    def __init__(self, known_hosts: Path, port: int, hashed: bool = False) -> None:
        self.known_hosts = known_hosts
        self.port = port
        self.hashed = hashed

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = hostname if hostname.startswith("[") else _known_hosts_entry(hostname, self.port)
        client.get_host_keys().add(entry, key.get_name(), key)
        name = paramiko.HostKeys.hash_host(entry) if self.hashed else entry  # as OpenSSH writes it
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a") as handle:
                handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _tried_keys(target: Target) -> str:
    keys = list(target.key_files) or [str(Path("~/.ssh").expanduser() / k) for k in DEFAULT_KEYS
                                      if (Path("~/.ssh").expanduser() / k).exists()]
    agent = "ssh-agent" if os.environ.get("SSH_AUTH_SOCK") else "no ssh-agent"
    return (", ".join(keys) or "no key files") + f"; {agent}"


def describe_connect_error(host: Host, target: Target, exc: BaseException, timeout: float,
                           elapsed: float = 0.0) -> str:
    """A reason a person can act on, for an exception raised while connecting."""
    where = f"{target.user}@{target.hostname}:{target.port}"
    silent = "banner" in str(exc) or "No existing session" in str(exc) or isinstance(exc, EOFError)
    if silent and elapsed >= 0.9 * timeout:
        return (f"timed out after {timeout:g}s waiting for an SSH answer from {where} (something "
                f"listens there but does not speak SSH, or the host is overloaded)")
    if isinstance(exc, socket.gaierror):
        return f"host name {target.hostname!r} could not be resolved ({exc.strerror})"
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"host key for {where} has CHANGED (got {exc.key.get_name()} "
                f"{exc.key.get_fingerprint().hex()}); refusing to connect. If the host was "
                f"reinstalled, remove the old key: ssh-keygen -R "
                f"'{_known_hosts_entry(target.hostname, target.port)}'")
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed for user {target.user!r} at {where} (tried: {_tried_keys(target)})"
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return (f"host key of {where} is unknown (not in known_hosts); verify it and connect once "
                f"with ssh, or pass --accept-new-host-keys")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"connection refused at {where} (is sshd running on port {target.port}?)"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused at {where} (is sshd running on port {target.port}?)"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout:g}s connecting to {where} (host down or port filtered?)"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"SSH error with {where}: {exc}"




class SshConnection:
    """An open SSH connection to one host, with helpers to run short commands and move files.

    Everything goes through exec channels (``sh``, ``cat``, ``tar``): no SFTP subsystem is needed,
    so a host whose sshd has none (or a forced command wrapper) works the same."""

    def __init__(self, host: Host, target: Target, client: paramiko.SSHClient) -> None:
        self.host = host
        self.target = target
        self.client = client

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise LaunchError(f"{self.host.label}: the SSH connection was lost")
        return transport

    def run_bytes(self, argv: Sequence[str], data: bytes = b"", timeout: float = 30.0) -> tuple[int, bytes, str]:
        """Run a short command with ``data`` on its stdin; (exit status, stdout bytes, stderr)."""
        channel = self.transport.open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(shell_command(argv))
            try:
                if data:
                    channel.sendall(data)
                channel.shutdown_write()
            except OSError:  # ("Socket is closed") the command ended before it read all (a full disk):
                pass  # what it printed and its exit status, read below, say why
            out = channel.makefile("rb").read()
            err = channel.makefile_stderr("rb").read().decode("utf-8", "replace")
            return channel.recv_exit_status(), out, err
        finally:
            channel.close()

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str, str]:
        """Run a short command; (exit status, stdout, stderr)."""
        status, out, err = self.run_bytes(argv, timeout=timeout)
        return status, out.decode("utf-8", "replace"), err

    def sh(self, script: str, *args: str, data: bytes = b"", timeout: float = 30.0) -> tuple[int, bytes, str]:
        """Run a fixed ``sh`` script; ``args`` are its ``$1``, ``$2``... (never parsed by a shell)."""
        return self.run_bytes(["sh", "-c", script, "sh", *args], data=data, timeout=timeout)

    def ensure_bundle(self, python: str) -> str:
        """Upload ddlctl's code zip if this exact version is not on the host yet (``python``, the
        host's, checks what arrived); its absolute path.
        The bundles are kept by content hash; one unused for 30 days is removed when another is
        uploaded (using a bundle touches it)."""
        status, out, _ = self.sh(FIND_BUNDLE, bundle_path())
        if status == 0 and out.startswith(b"/"):
            return out.decode()
        _, data = code_bundle()
        # a unique temporary name, renamed into place: hosts may share a file system, and another
        # launch may be putting the same bundle there at the same moment
        status, out, err = self.sh(UPLOAD_BUNDLE, *upload_args(data, python), data=data, timeout=120)
        if status == 127:  # (before, "the code bundle arrived damaged ... no hash": the check could not run)
            raise no_python(self.host, python)
        if status != 0 or not out.startswith(b"/"):
            self.sh(EXPAND_1 + 'rm -f "$p".*.tmp', bundle_path())
            raise LaunchError(f"{self.host.label}: cannot copy ddlctl's code to {bundle_path()}: {err.strip()}",
                              "check the disk and permissions of ~/.ddlctl on that host")
        return out.decode()

    def close(self) -> None:
        self.client.close()


class _Transport(paramiko.Transport):
    """paramiko's transport asking for AES-GCM first: an authenticated cipher checks each packet in
    the same C call that decrypts it, where CTR with an HMAC made a new HMAC object and compared the
    MAC byte by byte in Python for every packet (a task's output arrives in thousands of them)."""

    _preferred_ciphers = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                          *(c for c in paramiko.Transport._preferred_ciphers if "gcm" not in c))


def connect(host: Host, options: SshOptions) -> SshConnection:
    """Open one connection; raises :class:`LaunchError` naming the host and the reason."""
    target = resolve_target(host, options)
    client = paramiko.SSHClient()
    for name in (*target.user_known_hosts, *target.global_known_hosts):  # all of them, as OpenSSH reads them
        path = Path(name).expanduser()
        if path.is_file():
            with contextlib.suppress(OSError):
                client.get_host_keys().load(str(path))
    known_hosts = Path(target.user_known_hosts[0]).expanduser()  # where a new key is recorded
    if options.accept_new_host_keys:
        client.set_missing_host_key_policy(_AcceptNewPolicy(known_hosts, target.port, target.hash_known_hosts))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    timeout = options.connect_timeout_s
    started = time.monotonic()
    try:
        client.connect(target.hostname, port=target.port, username=target.user,
                       key_filename=list(target.key_files) or None, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout, allow_agent=True,
                       look_for_keys=not target.key_files, transport_factory=_Transport)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message for a person
        client.close()
        raise LaunchError(f"{host.label} ({host.source}): "
                          f"{describe_connect_error(host, target, exc, timeout, time.monotonic() - started)}"
                          ) from None
    client.get_transport().set_keepalive(5)  # type: ignore[union-attr]
    return SshConnection(host, target, client)


def connect_each(hosts: Sequence[Host], options: SshOptions) -> dict[str, SshConnection | LaunchError]:
    """Connect to every host in parallel (bounded); each host gets its connection or its error."""
    return each_host(hosts, lambda host: connect(host, options), options.max_parallel)


def connect_all(hosts: Sequence[Host], options: SshOptions) -> dict[str, SshConnection]:
    """Connect to every host; if any fails, close the rest and raise one :class:`LaunchError`
    that names every failing host and why (one bad host never hides the others)."""
    return all_or_fail(connect_each(hosts, options), "reach", SshConnection.close)


class ChannelStream:
    """A host agent's SSH exec channel as a :class:`~ddlctl.transport.streams.Stream`."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.channel.settimeout(0.0)
        self._stderr = b""

    def fileno(self) -> int:
        return self.channel.fileno()

    def read(self) -> bytes | None:
        while self.channel.recv_stderr_ready():
            self._stderr = (self._stderr + self.channel.recv_stderr(65536))[-8192:]
        if self.channel.recv_ready():
            return self.channel.recv(262144)
        if self.channel.closed or self.channel.eof_received or not self.channel.get_transport().is_active():
            return b""
        return None

    def write(self, data: bytes) -> None:
        self.channel.settimeout(30.0)  # a full window blocks at most this long
        try:
            self.channel.sendall(data)
        finally:
            self.channel.settimeout(0.0)

    def errors(self) -> str:
        return self._stderr.decode("utf-8", "replace")

    def abandon(self) -> None:
        """Closing the channel ends the agent's input: if it is alive, it kills its tasks."""
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()

    def ended(self) -> str:
        """Nothing more than the closed channel says."""
        return ""


class SshTransport:
    """Runs tasks on one remote host through its :class:`SshConnection`."""

    def __init__(self, conn: SshConnection, options: SshOptions | None = None) -> None:
        self.conn = conn
        self.host = conn.host
        self.options = options or SshOptions()  # to connect again after a loss
        self._bundle: str | None = None

    def address(self) -> str | None:
        """The host's real address (``HostName`` of ~/.ssh/config), for TF_CONFIG."""
        return self.conn.target.hostname

    def source_address(self) -> str | None:
        """This machine's address on the connection: what the host sees of it."""
        with contextlib.suppress(Exception):
            return self.conn.client.get_transport().sock.getsockname()[0]
        return None

    def reopen(self, run_id: str, log_dir: Path) -> HostSession:
        """After a lost connection: connect again and start a new agent."""
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = connect(self.host, self.options)
        return self.open_session(run_id, log_dir)

    @property
    def python(self) -> str:
        return self.host.python or "python3"

    def free_ports(self, count: int) -> list[int]:
        return [int(p) for p in self.probe(quick_ports=count)["ports"]]  # type: ignore[union-attr]

    def open_session(self, run_id: str, log_dir: Path | None = None, ports: int | None = None) -> HostSession:
        """Start this host's agent in one SSH exec session, running ddlctl's code from the shipped
        bundle; with ``ports``, its hello carries the launch-time probe. The bundle is checked in
        the same exec (one round trip per host when it is there); uploaded, and the agent started
        again, when it is not."""
        argv = bundled_agent_argv(self.python, run_id, ports)

        def start() -> tuple[ChannelStream, Callable[[], bool]]:
            try:
                channel = self.conn.transport.open_session(timeout=30)
                channel.exec_command(shell_command(argv))
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise LaunchError(f"{self.host.label}: cannot start the ddlctl host agent over SSH: {exc}") from None

            def needs_code() -> bool:  # the exit status may arrive just after the channel's end
                channel.status_event.wait(5)
                return channel.exit_status_ready() and channel.recv_exit_status() == NEED_CODE_EXIT

            return ChannelStream(channel), needs_code

        session, self._bundle = start_bundled_agent(self.host, self.python, start,
                                                    lambda: self.conn.ensure_bundle(self.python), self._bundle)
        return session

    def probe(self, quick_ports: int | None = None) -> dict[str, object]:
        """Facts from ``ddlctl.host.probe`` run by the host's Python with the shipped bundle;
        with ``quick_ports``, the cheap launch-time probe that also picks that many free ports.
        An unexpected failure is retried once (a transient exec or channel error)."""
        if self._bundle is None:
            self._bundle = self.conn.ensure_bundle(self.python)
        extra = [] if quick_ports is None else ["--quick", str(quick_ports)]
        argv = ["env", f"PYTHONPATH={self._bundle}", f"{envvars.SAFE_PATH}=1", self.python, "-m",
                "ddlctl.host.probe", *extra]
        problem = ""
        for _attempt in range(2):
            try:
                status, out, err = self.conn.run(argv, timeout=60)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                problem = f"the probe could not run: {exc}"
                continue
            if status == 127:  # (env's exit for a command it cannot find; any other "No such file" is
                raise no_python(self.host, self.python)  # the probe's own trouble, said below with its words)
            lines = [line for line in out.splitlines() if line.strip()]
            if status == 0 and lines:
                try:  # the last line: a login shell may print before the command runs
                    return json.loads(lines[-1])
                except ValueError:
                    pass
            problem = (f"the host probe failed with {self.python!r} (exit {status}): "
                       f"stdout {out.strip()[-200:]!r} stderr {err.strip()[-300:]!r}")
        raise LaunchError(f"{self.host.label}: {problem}")

    def end_leftovers(self, run_id: str, launch: str) -> list[str]:
        """SIGKILL what this launch left running on the host (tasks' daemons whose host agent was
        killed and could not end them): ``"PID (command)"`` of each. Connects again (once, within
        ``--connect-timeout``) when the connection is gone; raises :class:`LaunchError` saying why
        when the host cannot be reached."""
        from ddlctl.host import killrun

        argv = [self.python, "-c", killrun.script(), run_id, launch]
        problem = ""
        for attempt in range(2):
            try:
                if attempt:
                    with contextlib.suppress(Exception):
                        self.conn.close()
                    self.conn = connect(self.host, self.options)
                status, out, err = self.conn.run(argv, timeout=30)
            except (paramiko.SSHException, OSError, EOFError, LaunchError) as exc:
                problem = str(getattr(exc, "message", exc))
                continue
            if status == 0:
                with contextlib.suppress(ValueError, IndexError):
                    return [f"{pid} ({command})" for pid, command in json.loads(out.splitlines()[-1])]
            problem = f"exit {status}: {err.strip()[-200:]}"
        raise LaunchError(problem)

    def close(self) -> None:
        self.conn.close()

