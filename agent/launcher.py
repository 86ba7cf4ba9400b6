"""The per-run launcher: ``python -m hfai.agent.launcher RUN_DIR``.

The agent starts this small process (in its own session) instead of the job itself, so that the
job's exit status is written to ``RUN_DIR/exit_code`` even when the agent is not there to reap it
(an agent restarted while a job runs adopts the job and reads its exit status later). The job runs
in a process group of its own (pid written to ``RUN_DIR/child_pid``) that the agent signals.

Who runs as whom: the launcher runs as the agent (usually root) with the agent's own environment,
and reads what to run from ``RUN_DIR/launch`` (JSON: argv, env, cwd, log, and uid/gid/groups when
it must switch). The run directory is the agent's alone (0700), so the job can neither change what
is launched nor forge ``child_pid`` or ``exit_code``. Only the job process becomes the submitter,
and enters its workdir as that user: the job's environment (LD_PRELOAD, PYTHONPATH, ...) never
reaches a process that keeps root.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

from hfai._atomic import write_atomic

LAUNCH_FILE = "launch"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m hfai.agent.launcher RUN_DIR", file=sys.stderr)
        return 2
    run_dir = argv[0]
    with open(os.path.join(run_dir, LAUNCH_FILE), "rb") as f:
        spec = json.load(f)
    fd = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(fd, "ab", buffering=0) as log:
        try:
            child = _spawn(spec, log)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            log.write(f"hfai: cannot start {spec['argv'][0]!r}{_as_whom(spec)}: {_reason(e, spec)}\n".encode())
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


def _spawn(spec: dict, log) -> subprocess.Popen:
    switch = {}
    if spec.get("uid") is not None:
        # extra_groups is always given, even empty: otherwise the job keeps root's groups.
        switch = dict(user=spec["uid"], group=spec["gid"], extra_groups=list(spec["groups"]))
    # The chdir runs in the child after the uid switch, so the job starts only in a directory its
    # user may enter (the launcher is single-threaded: preexec_fn is safe here).
    return subprocess.Popen(spec["argv"], env=spec["env"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=functools.partial(os.chdir, spec["cwd"]), **switch)


def _as_whom(spec: dict) -> str:
    return f" as uid {spec['uid']}" if spec.get("uid") is not None else ""


def _reason(e: Exception, spec: dict) -> str:
    if isinstance(e, subprocess.SubprocessError):  # preexec_fn failed: only the chdir runs there
        return f"cannot enter workdir {spec['cwd']}"
    return str(e)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
