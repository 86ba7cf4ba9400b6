"""A job for the fault-injection suite: appends "JOB WRITER RUN start TIME" to a shared log, sleeps,
then appends "JOB WRITER RUN end TIME" (WRITER: a random number per process, not its pid: every
compute container's job is pid 2 of a PID namespace of its own). Two runs of one job at once show
as overlapping intervals;
a run that never ended shows as a start without its end. Imports nothing but the standard library,
so a run costs little more than the interpreter's start.

Usage: runlog.py LOG_FILE SECONDS
"""

import os
import sys
import time

log, seconds = sys.argv[1], float(sys.argv[2])
job, run = os.environ.get("HFAI_JOB_ID", "?"), os.environ.get("HFAI_RUN_ID", "?")
writer = int.from_bytes(os.urandom(4), "big")


def line(what: str) -> None:
    # One write per line on an O_APPEND file: lines of concurrent writers never tear.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{job} {writer} {run} {what} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


line("start")
time.sleep(seconds)
line("end")
