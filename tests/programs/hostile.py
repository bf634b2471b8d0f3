"""A task that sends ddlctl what a broken or hostile program could (issue 59): step records no
number fits (Infinity, 2**64, a line without end), random bytes in its steps file and its output,
terminal escapes (clear the screen, set the title, OSC 52 to the clipboard), frames written
through its agent's streams; it then steps as usual. With ``HOSTILE_FAIL=1`` it ends with an
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
sys.stdout.buffer.write(bytes(rng.randrange(256) for _ in range(2000)) + b"\n")
print(f"title{ESCAPES}done", flush=True)
for _ in range(8):
    with ddlctl.step(samples=4):
        time.sleep(0.05)
if os.environ.get("HOSTILE_FAIL") == "1":
    raise RuntimeError(f"bad{ESCAPES}end")
print("hostile task ended", flush=True)
