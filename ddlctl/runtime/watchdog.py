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
"""

from __future__ import annotations

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
    def __init__(self, argv: list[str], grace: float) -> None:
        self.grace = grace
        self.lock = threading.Lock()
        self.kill_timer: threading.Timer | None = None
        self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_child_setup)

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


def main(argv: list[str] | None = None) -> None:
    grace, pidfile, cmd = parse(sys.argv[1:] if argv is None else argv)
    with contextlib.suppress(OSError):  # already a session leader (start_new_session, sshd)
        os.setsid()
    try:
        watchdog = Watchdog(cmd, grace)
    except OSError as exc:
        print(f"ddlctl: cannot start {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)
    if pidfile:
        record = {"watchdog_pid": os.getpid(), "watchdog_pgid": os.getpgid(0),
                  "task_pid": watchdog.child.pid, "task_pgid": watchdog.child.pid}
        tmp = f"{pidfile}.tmp"
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, pidfile)
    status = watchdog.run()
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:  # die of the same signal, so the parent sees what the task saw
        if -status != signal.SIGKILL:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)  # no interpreter shutdown: the control thread may be blocked in read()


if __name__ == "__main__":
    main()
