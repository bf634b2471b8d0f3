"""Per-task watchdog: ``python -m ddlctl.runtime.watchdog --grace S [--pidfile F] -- CMD ...``.

Standard library only, so the same file can run on a host where ddlctl is not installed.

* Starts CMD in its own process group, with stdin from /dev/null and stdout/stderr inherited.
  On Linux the task also gets ``PR_SET_PDEATHSIG = SIGKILL``: if the watchdog is killed, so is it.
* Reads control lines on its own stdin: ``TERM``, ``INT``, ``HUP`` (forwarded to the task's group,
  then SIGKILL after the grace period) or ``KILL``. End of input means the controller is gone
  (killed, SSH connection dropped): the task's group is terminated the same way.
* SIGTERM, SIGINT or SIGHUP to the watchdog itself also terminate the task (TERM, grace, KILL).
* When the task exits, anything left in its process group is killed, and the watchdog exits with
  the task's status: the same exit code, or killed by the same signal.

Remote form: ``python -c SOURCE --spec BASE64_JSON`` where the JSON carries ``argv``, ``env``,
``unset``, ``cwd``, ``pidfile``, ``status_file`` and ``grace``. Arguments and environment travel
base64-encoded, so nothing in them is ever seen, split or expanded by a shell. ``~`` in paths is
expanded here, on the task's host. The status file records the exit code or signal, because SSH
reports a signal death as a bare exit status.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1
CONTROL = {b"TERM": signal.SIGTERM, b"INT": signal.SIGINT, b"HUP": signal.SIGHUP,
           b"KILL": signal.SIGKILL}


def _child_setup() -> None:
    """Runs in the task process before exec: own process group, die with the watchdog."""
    os.setpgid(0, 0)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Watchdog:
    def __init__(self, argv: list[str], grace: float, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.grace = grace
        self.lock = threading.Lock()
        self.kill_timer: threading.Timer | None = None
        self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_child_setup,
                                      env=env, cwd=cwd)

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, sig)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to the task's group now, SIGKILL after the grace period."""
        self.signal_group(sig)
        if sig == signal.SIGKILL:
            return
        with self.lock:
            if self.kill_timer is None:
                self.kill_timer = threading.Timer(self.grace, self.signal_group, (signal.SIGKILL,))
                self.kill_timer.daemon = True
                self.kill_timer.start()

    def read_control(self) -> None:
        # Raw reads on fd 0: a buffered stdin would hold a lock at interpreter exit.
        pending = b""
        while True:
            try:
                chunk = os.read(0, 4096)
            except OSError:
                chunk = b""
            if not chunk:  # controller gone
                self.terminate(signal.SIGTERM)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                sig = CONTROL.get(line.strip())
                if sig is not None:
                    self.terminate(sig)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: self.terminate(signal.SIGTERM))
        threading.Thread(target=self.read_control, daemon=True).start()
        status = self.child.wait()
        self.signal_group(signal.SIGKILL)  # leftovers of the task's group
        return status


def _expand(path: str | None) -> str | None:
    return None if path is None else os.path.expanduser(path)


def parse_spec(encoded: str) -> dict:
    """Decode ``--spec``: paths expanded on this host, environment merged over ours."""
    spec = json.loads(base64.urlsafe_b64decode(encoded.encode()).decode("utf-8"))
    env = dict(os.environ)
    for key in spec.get("unset", []):
        env.pop(key, None)
    for key, value in spec.get("env", {}).items():
        env[key] = os.path.expanduser(value) if key in ("DDLCTL_TASK_DIR", "DDLCTL_CHECKPOINT_DIR") else value
    if spec.get("pythonpath"):
        path = os.path.expanduser(spec["pythonpath"])
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return {"argv": spec["argv"], "env": env, "cwd": _expand(spec.get("cwd")),
            "pidfile": _expand(spec.get("pidfile")), "status_file": _expand(spec.get("status_file")),
            "grace": float(spec.get("grace", 5.0)), "mkdirs": [_expand(d) for d in spec.get("mkdirs", [])]}


def parse(argv: list[str]) -> tuple[float, str | None, list[str]]:
    grace, pidfile = 5.0, None
    if "--" not in argv:
        raise SystemExit("usage: watchdog --grace S [--pidfile F] -- CMD ...")
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1:]
    i = 0
    while i < len(opts):
        if opts[i] == "--grace":
            grace = float(opts[i + 1])
        elif opts[i] == "--pidfile":
            pidfile = opts[i + 1]
        else:
            raise SystemExit(f"watchdog: unknown option {opts[i]!r}")
        i += 2
    if not cmd:
        raise SystemExit("watchdog: no command")
    return grace, pidfile, cmd


def _write_json(path: str, record: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(record, handle)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    env = cwd = status_file = None
    if args[:1] == ["--spec"] and len(args) == 2:
        spec = parse_spec(args[1])
        grace, pidfile, cmd = spec["grace"], spec["pidfile"], spec["argv"]
        env, cwd, status_file = spec["env"], spec["cwd"], spec["status_file"]
        for folder in spec["mkdirs"]:
            os.makedirs(folder, exist_ok=True)
    else:
        grace, pidfile, cmd = parse(args)
    with contextlib.suppress(OSError):  # already a session leader (start_new_session, sshd)
        os.setsid()
    try:
        watchdog = Watchdog(cmd, grace, env, cwd)
    except OSError as exc:
        what = f"cannot start {cmd[0]!r}" if not (cwd and not os.path.isdir(cwd)) \
            else f"working directory {cwd!r} does not exist"
        print(f"ddlctl: {what}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
    if pidfile:
        _write_json(pidfile, {"watchdog_pid": os.getpid(), "watchdog_pgid": os.getpgid(0),
                              "task_pid": watchdog.child.pid, "task_pgid": watchdog.child.pid,
                              "ssh_connection": os.environ.get("SSH_CONNECTION")})
    status = watchdog.run()
    if status_file:
        _write_json(status_file, {"code": status if status >= 0 else None,
                                  "signal": -status if status < 0 else None})
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:  # die of the same signal, so the parent sees what the task saw
        if -status != signal.SIGKILL:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)  # no interpreter shutdown: the control thread may be blocked in read()


if __name__ == "__main__":
    main()
