"""The in-job side of the interrupt protocol: suspend flag, acknowledgement, whole-life state.

The agent gives each run a *control directory* (``$HFAI_CONTROL_DIR``). It is the local control
channel between agent and job, kept as plain files so that it survives an agent restart and costs
one ``stat`` to poll:

* ``suspend``          - created by the agent: the platform asks the job to checkpoint and stop;
* ``ack``              - created by the job in :func:`go_suspend`: checkpoint saved; "<pid> <time>
                         exit" (exiting now: the agent waits a grace) or "... stop" (stop me);
* ``whole_life_state`` - an integer the job sets; it is carried to the next run of the chain.

Off the platform (no control directory) every call is a cheap no-op and
:func:`receive_suspend_command` returns False, unless ``HFAI_SIMULATE_SUSPEND_S=N`` asks for a
simulated suspend N seconds after the process first asked (its first ``receive_suspend_command()``
or ``go_suspend()`` call: a script that spends its first minute importing torch and loading data
still trains before it is "suspended"), to try a script's resume path locally.
Running the same command again then resumes the simulated chain as the platform would: the next
run sees ``HFAI_SUSPEND_COUNT`` one higher and the whole-life state last set (kept in a small file,
``$HFAI_SIMULATE_STATE``, by default one per working directory and command line under
``$HFAI_HOME/simulate``; a run that ends without a suspend ends the chain).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from hfai._atomic import write_atomic
from hfai._throughput import mark_step

SUSPEND_FILE = "suspend"
ACK_FILE = "ack"
WHOLE_LIFE_FILE = "whole_life_state"

#: When this process first asked about a simulated suspend (monotonic seconds); None until then.
_simulation_clock: float | None = None


def _simulation_file() -> str | None:
    """Where a simulated chain carries its state between runs; None unless a suspend is simulated
    off the platform. Fixed in ``$HFAI_SIMULATE_STATE`` at import, so spawned workers, whose
    command lines differ, write where their parent reads."""
    if not os.environ.get("HFAI_SIMULATE_SUSPEND_S") or control_dir() is not None:
        return None
    path = os.environ.get("HFAI_SIMULATE_STATE")
    if not path:
        # hfai.core.config.hfai_home, spelled out: importing hfai.core.config would make `import hfai` heavy.
        home = os.environ.get("HFAI_HOME") or os.path.join(os.path.expanduser("~"), ".hfai")
        key = hashlib.sha256("\0".join([os.getcwd(), *sys.argv]).encode(errors="replace")).hexdigest()[:16]
        path = os.environ["HFAI_SIMULATE_STATE"] = os.path.join(home, "simulate", f"{key}.json")
    return path


def _resume_simulated_chain() -> None:
    """At import: give this run what the platform gives a resumed one. The file is consumed, so a
    run that then ends without a simulated suspend leaves nothing, and the next starts afresh."""
    path = _simulation_file()
    if path is None:
        return
    try:
        with open(path) as f:
            state = json.load(f)
        os.unlink(path)
        count, whole_life = int(state["suspend_count"]), int(state["whole_life_state"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            print(f"hfai: ignoring the unreadable simulated-suspend state {path}: {e}", file=sys.stderr, flush=True)
        # A first run, or a worker whose parent already took the file: it inherited the count.
        for prefix in ("HFAI", "MARSV2"):
            os.environ.setdefault(f"{prefix}_SUSPEND_COUNT", str(_env_int("HFAI_SUSPEND_COUNT")))
        return
    print(f"hfai: simulated resume, suspend count {count}, whole-life state {whole_life} (from {path})",
          file=sys.stderr, flush=True)
    for prefix in ("HFAI", "MARSV2"):
        os.environ[f"{prefix}_SUSPEND_COUNT"] = str(count)
        os.environ[f"{prefix}_WHOLE_LIFE_STATE"] = str(whole_life)


def _env_int(name: str) -> int:
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


def _save_simulated_suspend() -> None:
    """A simulated suspend was acknowledged: the next run of this command resumes the chain."""
    path = _simulation_file()
    if path is None:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = {"suspend_count": _env_int("HFAI_SUSPEND_COUNT") + 1, "whole_life_state": get_whole_life_state()}
    write_atomic(path, json.dumps(state) + "\n")


def control_dir() -> str | None:
    """The run's control directory, or None off the platform."""
    return os.environ.get("HFAI_CONTROL_DIR") or None


def _simulated_suspend_due() -> bool:
    raw = os.environ.get("HFAI_SIMULATE_SUSPEND_S")
    if not raw:
        return False
    global _simulation_clock
    try:
        due_s = float(raw)
    except ValueError:
        return False
    now = time.monotonic()
    if _simulation_clock is None:
        _simulation_clock = now
    return now - _simulation_clock >= due_s


def receive_suspend_command(timeout: float = 500, raise_exception: bool = False, *, sync: bool = False) -> bool:
    """True once the platform asked this job to suspend. Cheap enough to call every step.

    ``timeout`` and ``raise_exception`` are the original client's: it reported the receipt to its
    server with a request of that timeout, raising on failure only if asked. Here the flag is a
    local file and nothing is sent, so they are checked and have no effect.

    ``sync=True`` (keyword only) in a torch.distributed job gives every rank the same answer at
    the same call: an all-reduce of the flag, a collective every rank must make at the same step
    (see :func:`hfai.distributed.receive_suspend_command`). Scripts that test the flag on rank 0
    only must not pass it.
    """
    _check_request_args("receive_suspend_command", timeout, raise_exception)
    if sync:
        from hfai.distributed import receive_suspend_command as synced

        return synced()
    return _local_flag()


def _local_flag() -> bool:
    cdir = control_dir()
    if cdir is None:
        return _simulated_suspend_due()
    # Asked once per step: the scheduler's throughput measure counts it (hfai._throughput).
    mark_step("suspend")
    return os.path.exists(os.path.join(cdir, SUSPEND_FILE))


def _check_request_args(fn: str, timeout: object, raise_exception: object) -> None:
    """The original's request arguments: refuse what could not have meant them, such as
    ``receive_suspend_command(True)`` written for ``sync=True``."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise TypeError(f"{fn}(timeout=...) takes a number of seconds >= 0, got {timeout!r}"
                        + (" (for the all-rank flag write sync=True)" if isinstance(timeout, bool) else ""))
    if not isinstance(raise_exception, bool):
        raise TypeError(f"{fn}(raise_exception=...) takes True or False, got {raise_exception!r}")


def go_suspend(timeout: float = 500, raise_exception: bool = False, *, exit: bool = True) -> None:
    """Acknowledge a suspend: the checkpoint is saved, the platform may stop this job now.

    ``timeout`` and ``raise_exception`` are the original client's request arguments, checked and
    without effect here (the acknowledgement is a local file; see :func:`receive_suspend_command`).

    By default the calling process then exits with status 0, as the platform would stop it
    anyway; pass ``exit=False`` to return and let the platform stop it. Off the platform this is
    a no-op, except under ``HFAI_SIMULATE_SUSPEND_S`` where it exits like on the platform.
    """
    _check_request_args("go_suspend", timeout, raise_exception)
    cdir = control_dir()
    if cdir is None:
        if _simulated_suspend_due():
            _save_simulated_suspend()
            if exit:
                print("hfai: simulated suspend acknowledged, exiting", file=sys.stderr, flush=True)
                sys.exit(0)
        return
    # The last word tells the agent whether to wait for the exit (a grace) or stop the job now.
    write_atomic(os.path.join(cdir, ACK_FILE), f"{os.getpid()} {time.time()} {'exit' if exit else 'stop'}\n")
    if exit:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(0)


def get_whole_life_state() -> int:
    """The integer last set with :func:`set_whole_life_state` in this chain (0 if never)."""
    cdir = control_dir()
    if cdir is not None:
        try:
            with open(os.path.join(cdir, WHOLE_LIFE_FILE)) as f:
                return int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            pass  # never set in this chain (or not a number): the value the run was launched with
    return _env_int("HFAI_WHOLE_LIFE_STATE")


def set_whole_life_state(state: int) -> None:
    """Remember ``state`` for the rest of the chain: later runs read it back after a resume."""
    if not isinstance(state, int) or isinstance(state, bool):
        raise TypeError(f"whole-life state must be an int, got {type(state).__name__}")
    os.environ["HFAI_WHOLE_LIFE_STATE"] = str(state)
    cdir = control_dir()
    if cdir is not None:
        write_atomic(os.path.join(cdir, WHOLE_LIFE_FILE), f"{state}\n")


_resume_simulated_chain()
