"""Test hosts: real OpenSSH servers, one per loopback address (127.0.0.2, 127.0.0.3, ...).

Each server has its own host key and listens on a free port of its own address; one user key is
authorised on all of them. A private HOME holds the controller's ``~/.ssh`` (the user key and a
known_hosts listing every server), so tests never touch the real one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _keygen(path: Path, kind: str = "ed25519") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return (path.with_suffix(".pub") if path.suffix else Path(f"{path}.pub")).read_text().strip()


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


@dataclass
class SshHost:
    address: str
    port: int
    host_key: Path
    config: Path
    log: Path
    process: subprocess.Popen | None = None

    @property
    def known_hosts_entry(self) -> str:
        kind, key = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {key}"

    def hosts_line(self, **fields: object) -> str:
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{self.address} port={self.port} python={sys.executable} {extra}".strip()

    def start(self) -> None:
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))  # noqa: SIM115
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"sshd failed: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not start")

    def drop_connections(self, stop_listener: bool = False) -> int:
        """Kill every sshd process serving a connection (as a network drop does): the sessions'
        own processes get end-of-file. The listener stays unless ``stop_listener`` (a host that
        stays down). How many were killed."""
        import psutil

        if self.process is None:
            return 0
        children = psutil.Process(self.process.pid).children(recursive=True)
        if stop_listener:
            self.stop()
        killed = 0
        for child in children:
            try:
                if child.name().startswith("sshd"):
                    child.kill()
                    killed += 1
            except psutil.NoSuchProcess:
                continue
        return killed

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


class SshTestCluster:
    """Several sshd test hosts plus a private controller HOME that trusts them."""

    def __init__(self, root: Path, count: int, same_port: bool = False, separate_homes: bool = False,
                 sftp: bool = True, host_env: dict[int, dict[str, str]] | None = None) -> None:
        self.separate_homes = separate_homes  # each host its own $HOME: ~/.ddlctl is not shared
        self.host_env = host_env or {}  # host index -> what its sessions' environment also holds
        self.sftp = sftp  # False: no SFTP subsystem (some hardened hosts)
        self.root = root
        self.home = root / "home"
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        self.user_key = ssh_dir / "id_ed25519"
        user_pub = _keygen(self.user_key)
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(user_pub + "\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation directory
        self.hosts: list[SshHost] = []
        # same_port: one port on every address (what pdsh needs: it cannot vary the port per host)
        shared = free_port("127.0.0.1") if same_port else None
        for i in range(count):
            address = f"127.0.0.{i + 2}"
            folder = root / f"host{i}"
            folder.mkdir()
            host_key = folder / "ssh_host_ed25519_key"
            _keygen(host_key)
            host = SshHost(address, shared or free_port(address), host_key, folder / "sshd_config",
                           folder / "sshd.log")
            host.config.write_text(self._config(host, folder, self.host_env.get(i, {})))
            self.hosts.append(host)
        for host in self.hosts:
            host.start()
        self.write_known_hosts()

    def _config(self, host: SshHost, folder: Path, env: dict[str, str]) -> str:
        return "\n".join([
            f"ListenAddress {host.address}:{host.port}",
            f"HostKey {host.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {folder / 'sshd.pid'}",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "AllowTcpForwarding yes",
            # OpenSSH's defaults (MaxSessions 10, MaxStartups 10:30:100): as strict as a real host.
            "LogLevel VERBOSE",
            *([f"SetEnv HOME={self.host_home(host)}"] if self.separate_homes else []),
            *([" ".join(["SetEnv", *(f"{k}={v}" for k, v in env.items())])] if env else []),
            *(["Subsystem sftp internal-sftp"] if self.sftp else []),
            "",
        ])

    def host_home(self, host: SshHost) -> Path:
        """$HOME of sessions on ``host`` (the real one unless ``separate_homes``)."""
        if not self.separate_homes:
            return Path(os.path.expanduser("~root"))
        home = host.config.parent / "home"
        home.mkdir(exist_ok=True)
        return home

    def write_known_hosts(self, hosts: list[SshHost] | None = None) -> None:
        entries = [h.known_hosts_entry for h in (self.hosts if hosts is None else hosts)]
        (self.home / ".ssh" / "known_hosts").write_text("".join(e + "\n" for e in entries))

    def hosts_file(self, path: Path, hosts: list[SshHost] | None = None, **fields: object) -> Path:
        path.write_text("".join(h.hosts_line(**fields) + "\n" for h in (self.hosts if hosts is None
                                                                         else hosts)))
        return path

    @property
    def env(self) -> dict[str, str]:
        """Environment for a controller that uses this cluster's HOME (and no ssh-agent)."""
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["HOME"] = str(self.home)
        return env

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()


def libfaketime() -> str | None:
    """The path of libfaketime (the ``faketime`` package), which gives a process a clock of its
    own (``FAKETIME=+42``): a host whose clock is off. None when it is not installed."""
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def sshd_available() -> bool:
    return Path(SSHD).exists() and os.geteuid() == 0
