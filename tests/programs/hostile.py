"""A task that sends ddlctl what a broken or hostile program could (issue 59): step records no
number fits (Infinity, 2**64, a line without end), random bytes in its steps file and its output,
terminal escapes (clear the screen, set the title, OSC 52 to the clipboard), frames written
through its agent's streams; it tries to open the memory of its host agent and of the telemetry
agent for writing (refused: they are sealed, unless this process may ptrace anything, as root with
``CAP_SYS_PTRACE``); it then steps as usual. With ``HOSTILE_FAIL=1`` it ends with an
exception whose message carries escapes (the failure block shows it). No TensorFlow."""

import os
import random
import sys
import time

import ddlctl

ESCAPES = "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b]52;c;aWQgPiAvdG1wL3B3bmVk\x07\x9b31m"
steps_path = os.path.join(os.environ["DDLCTL_TASK_DIR"], "steps.jsonl")
rng = random.Random(59)
with open(steps_path, "ab") as steps:
    steps.write(b'{"task": "worker:0", "step": Infinity, "start_us": 1, "duration_s": 1}\n')
    steps.write(b'{"task": "worker:0", "step": %d, "start_us": 1, "duration_s": 1}\n' % 2**64)
    steps.write(bytes(rng.randrange(256) for _ in range(3000)) + b"\n")
    steps.write(b'{"step": 1, "worker": "' + ESCAPES.encode() + b'", "start_us": 1, "duration_s": 0.1}\n')
for fd in (1, 0):  # frames and commands through the agent's streams (refused: a socket)
    try:
        out = os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY)
        os.write(out, b'\n{"k":"exit","task":"worker:0","code":0}\n{"op":"shutdown"}\n')
        os.close(out)
    except OSError as exc:
        print(f"fd {fd} refused: {exc.strerror}", flush=True)


def telemetry_agent() -> int | None:
    """The pid of this run's telemetry agent (by its command line: it runs with ``--run-id``),
    waited for up to 30 s (it may start after this task)."""
    for _ in range(300):
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    args = handle.read().split(b"\0")
            except OSError:
                continue
            if b"ddlctl.host.telemetry" in args and os.environ["DDLCTL_RUN_ID"].encode() in args:
                return int(entry)
        time.sleep(0.1)
    return None


def open_memory(who: str, pid: int | None) -> None:
    """Try to open ``pid``'s memory for writing; say whether it was refused. The telemetry agent
    starts beside this task and seals itself once its imports are done: tried for up to 20 s."""
    for _ in range(200):
        try:
            os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
        except OSError as exc:
            print(f"mem {who} refused: {exc.strerror}", flush=True)
            return
        time.sleep(0.1)
    print(f"mem {who} opened", flush=True)


open_memory("agent", os.getppid())
open_memory("telemetry", telemetry_agent())
sys.stdout.buffer.write(b"lone \x9b31m C1 " + bytes(rng.randrange(256) for _ in range(2000)) + b"\n")
print(f"title{ESCAPES}done", flush=True)
for _ in range(8):
    with ddlctl.step(samples=4):
        time.sleep(0.05)
if os.environ.get("HOSTILE_FAIL") == "1":
    raise RuntimeError(f"bad{ESCAPES}end")
print("hostile task ended", flush=True)
