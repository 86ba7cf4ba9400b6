"""A job for the self-fencing test: N steps of S seconds; each step appends "pid step time" to a
shared progress file and saves the step as a checkpoint, so a restarted run continues where the
last one got to and two runs at once would show in the file as interleaved writers. The writer is
named by its run id: in compute containers every run's job is pid 2 of its own PID namespace.

Usage: appender.py PROGRESS_FILE STEPS STEP_S
"""

import os
import sys
import time

progress, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
checkpoint = progress + ".ckpt"
start = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
writer = int(os.environ.get("HFAI_RUN_ID") or os.getpid())
print(f"run {os.environ.get('HFAI_RUN_ID')} starts at step {start} pid {os.getpid()}", flush=True)
for step in range(start, steps):
    # One write per line on an O_APPEND file: lines of concurrent writers never tear.
    fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{writer} {step} {time.time():.6f}\n".encode())
    os.close(fd)
    with open(checkpoint + f".tmp{os.getpid()}", "w") as f:
        f.write(str(step + 1))
    os.replace(checkpoint + f".tmp{os.getpid()}", checkpoint)
    time.sleep(step_s)
print("finished", flush=True)
