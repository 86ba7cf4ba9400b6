"""The per-run launcher: ``python -m hfai.agent.launcher RUN_DIR LOG_FILE -- ARGV...``.

The agent starts this small process (in its own session) instead of the job itself, so that the
job's exit status is written to ``RUN_DIR/exit_code`` even when the agent is not there to reap it
(an agent restarted while a job runs adopts the job and reads its exit status later). The job runs
in a process group of its own (pid written to ``RUN_DIR/child_pid``) that the agent signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hfai._atomic import write_atomic


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m hfai.agent.launcher RUN_DIR LOG_FILE -- ARGV...", file=sys.stderr)
        return 2
    run_dir, log_file, cmd = argv[0], argv[1], argv[3:]
    with open(log_file, "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        except OSError as e:
            log.write(f"hfai: cannot start {cmd[0]!r}: {e}\n".encode())
            write_atomic(os.path.join(run_dir, "exit_code"), "127\n")
            return 127
        write_atomic(os.path.join(run_dir, "child_pid"), f"{child.pid}\n")

        def forward(signum, _frame):
            try:
                os.killpg(child.pid, signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = child.wait()
        log.write(f"=== hfai: process exited with code {code} at {time.strftime('%H:%M:%S')} ===\n".encode())
    write_atomic(os.path.join(run_dir, "exit_code"), f"{code}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
