"""A job that tries to reach what is not its user's, for the compute-container tests.

Usage: escape.py TARGET...   Each TARGET is ``read:PATH``, ``list:PATH``, ``write:PATH`` or
``proc:REKRAM`` (a process whose command line holds MARKER, given reversed: this job's own command
line, and its container's pid 1's, hold the target as given). Prints one line per target:
``REACHED <target>`` when it got through, ``BLOCKED <target>: <why>`` when it did not, then ``done``.
"""

import os
import sys


def attempt(target: str) -> str:
    how, _, what = target.partition(":")
    if how == "read":
        with open(what, "rb") as f:
            f.read(64)
    elif how == "list":
        os.listdir(what)
    elif how == "write":
        with open(what, "wb") as f:
            f.write(b"x")
    elif how == "proc":
        what = what[::-1]
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if what.encode() in f.read():
                            return "REACHED"
                except OSError:
                    continue
        raise LookupError("no such process in sight")
    return "REACHED"


for target in sys.argv[1:]:
    try:
        print(f"{attempt(target)} {target}", flush=True)
    except Exception as e:  # noqa: BLE001 - every refusal is the answer we look for
        print(f"BLOCKED {target}: {type(e).__name__}", flush=True)
print("done", flush=True)
