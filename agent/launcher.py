"""The per-run launcher: ``python -m hfai.agent.launcher RUN_DIR``.

The agent starts this small process (in its own session) instead of the job itself, so that the
job's exit status is written to ``RUN_DIR/exit_code`` even when the agent is not there to reap it
(an agent restarted while a job runs adopts the job and reads its exit status later). The job runs
in a process group of its own (pid written to ``RUN_DIR/child_pid``) that the agent signals.

Who runs as whom: the launcher runs as the agent (usually root) with the agent's own environment,
and reads what to run from ``RUN_DIR/launch`` (a :class:`~hfai.agent.launchspec.LaunchSpec`: argv,
env, cwd, log, limits, and the account to switch to). The run directory is the agent's alone
(0700), so the job can neither change what is launched nor forge ``child_pid`` or ``exit_code``.
Only the job process becomes the submitter; its workdir is entered with that user's permissions
(the launcher borrows the user's effective ids for the chdir alone, see :func:`_spawn`): the job's
environment (LD_PRELOAD, PYTHONPATH, ...) never reaches a process that keeps root.

Self-fencing: while the job runs the launcher also watches the agent's liveness stamp (the file
named by the spec's ``fence.alive``: ``time.monotonic()`` of the agent's last heartbeat that NATS
accepted; CLOCK_MONOTONIC is the same clock in every process of the host). Once it is older than
``fence_s`` the agent is dead, hung or cut off, and the leader will soon declare the node lost and
restart the job elsewhere; an orphan left running would write the same checkpoints as the new run.
So the launcher records ``RUN_DIR/fenced`` (the platform stopped the job: an interruption, not a
failure), SIGTERMs the job's group and SIGKILLs it once the stamp is ``fence_kill_s`` old, which the
leader chose to fall inside its heartbeat timeout. No ``fence`` in the spec: no fencing.

The log watchdog (the spec's ``watchdog``; agent/watchdog.py): a job that writes nothing for
its watchdog time is recorded ``RUN_DIR/hung``, its processes' Python stacks go into the log, and
it is stopped (SIGTERM, SIGKILL ``watchdog.kill_s`` later).

Nothing outlives its run: whichever way the job ends (it exits, the agent stops
it, the launcher fences it), the launcher then SIGKILLs what is left of the job's process group
and every other process the job started, before it records the exit status: a child that
ignored SIGTERM, and one that left the group (``setsid``, a double fork), which the kernel
re-parents to the launcher because it is a child subreaper (``PR_SET_CHILD_SUBREAPER``). So once
the agent reads the status, no process of the run is alive. A process that escapes both (one the
kernel re-parents elsewhere: a subreaper of the job's own) is out of reach; a cgroup per run would
catch it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import time
from typing import Any

from hfai.agent.cgroup import CgroupKind, RunCgroup, Usage, sigkill_each
from hfai.agent.launchspec import LaunchSpec
from hfai.agent.output import Output, open_output
from hfai.agent.sandbox import signal_status
from hfai.agent.statefile import write_state
from hfai.agent.watchdog import RunWatchdog

LAUNCH_FILE = "launch"
ALIVE_FILE = "alive"  # in the agent's state directory (see RunStore.mark_alive)
ALIVE_WIDTH = 24  # characters of every stamp, so that one can overwrite another in place
FENCED_FILE = "fenced"  # in the run directory: the launcher stopped the job (self-fencing)
BLANK_POOL = "l"  # the launcher's blanks in a run directory kept from an earlier run (statefile.py)


class Fence(enum.Enum):
    NONE = "none"
    TERM = "term"
    KILL = "kill"


def fence_action(now: float, last_alive: float, fence_s: float, fence_kill_s: float, termed: bool) -> Fence:
    """What the launcher does to its job now (pure).

    ``last_alive``: the newest liveness stamp seen (the caller freezes it once it sent TERM: a
    fenced job stays fenced even if the agent comes back, as it has been told to stop). Past
    ``fence_kill_s`` the job is killed even if it was never sent TERM (the launcher itself was
    held up, e.g. the host was overloaded): the deadline matters more than a graceful stop, as
    the leader may restart the job elsewhere right after it."""
    if not fence_s > 0:
        return Fence.NONE
    age = now - last_alive
    if age >= fence_kill_s:
        return Fence.KILL
    if age >= fence_s and not termed:
        return Fence.TERM
    return Fence.NONE


def poll_interval(fence_s: float, fence_poll_s: float) -> float:
    """How often the launcher looks at the stamp: as configured, but at least eight times per fence
    bound, so that the polling delay stays well inside the margin the leader leaves between the
    kill deadline and its heartbeat timeout (fence_s / 3 with controller.assignments.fence_bound);
    and not busier than every 10 ms."""
    return max(0.01, min(fence_poll_s, fence_s / 8))


def read_stamp(path: str) -> float | None:
    """The agent's liveness stamp, None if missing or unreadable (the caller keeps the last one).

    On a full disk the agent overwrites the stamp in place (RunStore.mark_alive), so a read may
    meet half of a write: the stamp counts once two reads in a row agree."""
    try:
        with open(path, "rb") as f:
            first = f.read(64)
            for _ in range(8):
                second = os.pread(f.fileno(), 64, 0)
                if second == first:
                    break
                first = second
            else:
                return None
            value = float(first)
    except (OSError, ValueError):
        return None
    return value if math.isfinite(value) else None


def main(argv: list[str], syncer: int | None = None) -> int:
    """``syncer``: the write end of the zygote's pipe that fsyncs files for its launchers (see
    _persist_after_exit), where this launcher was forked by one."""
    if len(argv) != 1:
        print("usage: python -m hfai.agent.launcher RUN_DIR", file=sys.stderr)
        return 2
    run_dir = os.path.abspath(argv[0])  # the launcher may chdir to the job's workdir (_spawn)
    with open(os.path.join(run_dir, LAUNCH_FILE), "rb") as f:
        spec = LaunchSpec.from_json(f.read())
    exit_file = os.path.join(run_dir, "exit_code")
    with open_output(spec.log, spec.log_cap) as out:
        _become_subreaper()
        try:
            cgroup = _enter_cgroup(spec)
        except OSError as e:
            # The node's fault, not the job's: it runs without limits rather than not at all.
            out.write(f"=== hfai: this run has no cgroup (no memory or process limit): {e} ===\n".encode())
            cgroup = None
        # bwrap's monitor tells the container's pid 1 on this pipe (--info-fd) right after making it.
        info = os.pipe2(os.O_CLOEXEC) if spec.limits.contained else None
        try:
            child = _spawn(spec, out.job_fd, info[1] if info is not None else None)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            _close(*(info or ()))
            out.write(f"hfai: cannot start {spec.argv[0]!r}{_as_whom(spec)}: {_reason(e, spec)}\n".encode())
            write_state(exit_file, "127\n", durable=True)
            return 127
        if cgroup is not None:
            _floor_oom_score()  # after the spawn: the job must not inherit it
        out.job_started()
        contained = spec.limits.contained
        # The job's process group: in a container, the session bwrap made for it (led by the
        # container's pid 1, which takes no signal it has no handler for but SIGKILL), so that
        # signals reach the job and not bwrap, whose death ends the container.
        group = [_container_init(child, *info) if info is not None else child.pid]
        write_state(os.path.join(run_dir, "child_pid"), f"{group[0]}\n", pool=BLANK_POOL)  # see statefile.py

        def forward(signum, _frame):
            try:
                os.killpg(group[0], signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        # Not the job's own: the container's processes get no stack dump from the watchdog.
        spare = frozenset({child.pid, group[0]}) if contained else frozenset()
        code = _supervise(child, spec, run_dir, out, group[0], spare)
        if contained:
            code = signal_status(code)
        # The container's pid 1 outlives bwrap's monitor by a moment: not the job's leftover.
        left = end_leftovers(child.pid, uncounted={group[0]} if contained else set())
        usage = _end_cgroup(cgroup, run_dir, spec.limits.memory_bytes)
        if usage is not None:
            left += usage[1]
        out.drain()
        if left:
            out.write(f"=== hfai: killed {left} process(es) the job left running ===\n".encode())
        if usage is not None and usage[0].oom_kills:
            out.write(f"=== hfai: {oom_message(spec.limits.memory_bytes)} ===\n".encode())
        out.write(f"=== hfai: process exited with code {code} at {time.strftime('%H:%M:%S')} ===\n".encode())
    write_state(exit_file, f"{code}\n", pool=BLANK_POOL)
    # The agent wakes when this process exits and reports the status at once; the status and the
    # assignment reach the disk meanwhile, in the zygote or a child (statefile.py).
    _persist_after_exit([exit_file, os.path.join(run_dir, "assignment")], syncer)
    return 0


def _persist_after_exit(paths: list[str], syncer: int | None = None) -> None:
    """fsync ``paths`` elsewhere, so that this launcher can exit (which wakes the agent) without
    waiting for the disk: two fsyncs would otherwise be on every run's path. After a power loss
    the files are whole or missing, never torn (renamed into place), and a missing one reads as a
    run killed with its node (RunStore).

    Handed to the zygote that forked this launcher where there is one (``syncer``, its pipe:
    zygote.py), as a forked child costs more CPU than the fsyncs (its page tables copied, the
    pages it writes copied, its exit). Else, or if the zygote is gone or behind, in a child; and
    without a fork, here."""
    line = b"\0".join(os.fsencode(p) for p in paths) + b"\n"
    if syncer is not None and len(line) <= select.PIPE_BUF:
        try:
            os.write(syncer, line)  # whole or not at all (PIPE_BUF), never blocking (O_NONBLOCK)
            return
        except OSError:
            pass
    try:
        pid = os.fork()
    except OSError:
        _fsync_all(paths)
        return
    if pid == 0:
        try:
            os.setsid()  # not in the launcher's group, which the agent may signal
            _fsync_all(paths)
        finally:
            os._exit(0)


def _fsync_all(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _supervise(child: subprocess.Popen, spec: LaunchSpec, run_dir: str, out: Output, group: int,
               spare: frozenset[int] = frozenset()) -> int:
    """Wait for the job to exit, relaying its output, ending it as hung once silent for its
    watchdog time (agent/watchdog.py), and fencing it (see the module doc) if the agent stops
    confirming its liveness (signalling process group ``group``); returns the job's exit status."""
    fence = spec.fence
    fence_s = fence.fence_s if fence is not None else 0.0
    fencing = fence is not None and fence_s > 0
    fence_kill_s = fence.kill_s if fence is not None else 0.0
    poll = poll_interval(fence_s, fence.poll_s) if fence is not None and fencing else 3600.0
    watch = RunWatchdog.from_spec(spec, run_dir, out.clock)
    if watch is not None:
        poll = min(poll, watch.poll_s)
    # Without a stamp yet (the agent writes one before it starts any run), count from now.
    alive = fence.alive if fence is not None else ""
    last_alive = (read_stamp(alive) or time.monotonic()) if fencing else 0.0
    termed = killed = False
    pidfd = _pidfd(child.pid)
    try:
        while True:
            code = _wait(child, pidfd, min(poll, 0.5) if pidfd is None else poll, out)
            if code is not None:
                break
            if watch is not None:
                watch.check(out, group, spare)
            if not fencing:
                continue
            if not termed:
                last_alive = max(last_alive, read_stamp(alive) or last_alive)
            act = fence_action(time.monotonic(), last_alive, fence_s, fence_kill_s, termed)
            if act is Fence.NONE or killed:
                continue
            age = time.monotonic() - last_alive
            if not termed:
                # Recorded before the signal: whoever sees the exit also sees why.
                write_state(os.path.join(run_dir, FENCED_FILE), f"{age:.3f}\n", durable=True)
                out.write(f"=== hfai: the agent of this node has not confirmed it is alive for {age:.1f}s; "
                          f"stopping the job, which will be requeued, at {time.strftime('%H:%M:%S')} ===\n".encode())
            termed, killed = True, act is Fence.KILL
            _killpg(group, signal.SIGKILL if killed else signal.SIGTERM)
            if killed and group != child.pid:
                _killpg(child.pid, signal.SIGKILL)  # bwrap: its end ends the whole container
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return code


def oom_message(limit: int) -> str:
    """What the log and the job's record say of an out-of-memory kill."""
    return f"out of memory: the run's limit is {_gib(limit)}" if limit > 0 else "out of memory"


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB" if n >= 10 * 2**30 else f"{n / 2**30:.2f} GiB".replace(".00 ", " ")


USAGE_FILE = "usage"  # in the run directory: what the run used (JSON), written as it ends


def _enter_cgroup(spec: LaunchSpec) -> RunCgroup | None:
    """Make the run's cgroup (see cgroup.py) and move this launcher into it, so that all the run's
    processes start inside; None where the agent found no cgroups."""
    cg = spec.limits.cgroup
    if cg is None:
        return None
    run = RunCgroup.create(cg.kind, cg.dirs, spec.limits.memory_bytes, spec.limits.pids_max)
    run.join(os.getpid())
    return run


def _end_cgroup(run: RunCgroup | None, run_dir: str, limit: int) -> tuple[Usage, int] | None:
    """Once the job ended: kill what is left in its cgroup and record what the run used; returns
    the usage and how many processes were killed. The launcher stays in the cgroup until it exits,
    and the agent removes the cgroup as it forgets the run (RunStore.cleanup): moving a process
    between cgroups waits for the kernel's RCU grace period (v1: one per hierarchy), which the
    run's end, and so its node's next run, would wait for."""
    if run is None:
        return None
    killed = run.kill_all(spare=os.getpid())
    usage = run.usage()
    if run.kind is CgroupKind.V1:
        # Every process of the run was this subreaper's child or descendant, reaped along the way.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        usage = dataclasses.replace(usage, cpu_s=children.ru_utime + children.ru_stime)
    try:
        write_state(os.path.join(run_dir, USAGE_FILE), json.dumps({**usage.__dict__, "limit_bytes": limit}) + "\n",
                    pool=BLANK_POOL)
    except OSError:
        pass  # the exit status matters more; the record goes without usage
    return usage, killed


def _floor_oom_score() -> None:
    """An out-of-memory kill in the run's cgroup takes the job, never this launcher (root only)."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, b"-1000")  # os calls, not open(): see _PRCTL
    except OSError:
        pass
    finally:
        os.close(fd)


CONTAINER_FIND_S = 2.0  # how long the launcher looks for the job inside a new container
SESSION_POLL_S = 0.001  # how often it asks whether the container's pid 1 made its session yet


def _container_init(child: subprocess.Popen, info_r: int, info_w: int) -> int:
    """The pid (as this launcher sees it) of the container's pid 1 that bwrap ``child`` made:
    bwrap's monitor -> pid 1 (a session and process group leader: ``--new-session``) -> the job,
    in pid 1's group. ``child.pid`` if it cannot be found in time (a job that ended at once, a
    container that failed to start): signalling bwrap then ends the container, the fallback.

    The monitor writes pid 1's pid on ``info_r``'s pipe (``--info-fd``, JSON) as it makes it,
    before the container is set up; pid 1 makes its session once it is (a few ms later), and
    only then does a signal to the group reach it: until then the launcher asks the kernel for
    pid 1's session (a system call every SESSION_POLL_S). It once looked for pid 1 and its child in
    /proc every millisecond instead: 1.7 ms of CPU per run (docs/performance.md)."""
    os.close(info_w)  # bwrap has its copy: the pipe ends when the monitor closes it
    deadline = time.monotonic() + CONTAINER_FIND_S
    init, ended = _read_init(info_r, deadline)
    if ended:
        os.close(info_r)
    # Else the monitor has yet to write (a host too busy to run it for seconds): the read end stays
    # open until this launcher exits, as bwrap gives up the container if its write finds none.
    if init is None:
        return child.pid
    while time.monotonic() < deadline:
        try:
            if os.getsid(init) == init:
                return init
        except ProcessLookupError:
            return child.pid  # pid 1 is gone already: so is the container
        if child.poll() is not None:
            return child.pid
        time.sleep(SESSION_POLL_S)
    return child.pid


def _read_init(fd: int, deadline: float) -> tuple[int | None, bool]:
    """pid 1's pid from bwrap's --info-fd output (``{"child-pid": N, ...}``) read to its end, and
    whether the end came; None if it did not by ``deadline``, or if the monitor wrote no pid (it
    failed first)."""
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            try:
                pid = json.loads(data)["child-pid"]
            except (ValueError, KeyError, TypeError):
                return None, True
            return (pid if isinstance(pid, int) and pid > 0 else None), True
        data += chunk
    return None, False


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_ROUNDS = 50  # kill-and-reap rounds (each a generation of orphans), 0.1 s apart at most


def _find_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Found once, at import: in the zygote, before it forks the launchers. A CDLL made in each
# launcher builds a class and a function pointer there, whose objects copy pages from the zygote
# on every run's path (docs/performance.md).
_PRCTL = _find_prctl()


def _become_subreaper() -> None:
    """Make the processes the job orphans (a double fork, setsid) children of this launcher, so
    that end_leftovers finds them. Linux >= 3.4; elsewhere the group kill alone remains."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> list[int]:
    """This process's children (single-threaded: the main thread's list is all of them)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: scan the process table
        return _children_by_scan(pid)


def _children_by_scan(parent: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                out.append(int(name))
    return out


def end_leftovers(pgid: int, uncounted: set[int] | frozenset[int] = frozenset()) -> int:
    """After the job (leader of group ``pgid``, already reaped) ended: SIGKILL its group and every
    process it left behind, and reap them. Returns how many processes were killed, but for those
    ``uncounted``. Called before the exit status is written, while the launcher has started
    nothing else."""
    _killpg(pgid, signal.SIGKILL)
    killed: set[int] = set()
    for _ in range(LEFTOVER_ROUNDS):
        kids = _children()
        if not kids:
            break
        killed |= sigkill_each(kids)
        _killpg(pgid, signal.SIGKILL)  # members that had not been re-parented yet
        deadline = time.monotonic() + 0.1
        for pid in kids:  # a killed process's own children come to us once it is gone
            while time.monotonic() < deadline:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    break
                time.sleep(0.002)
    return len(killed - set(uncounted))


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3: poll by sleeping instead
        return None


def _wait(child: subprocess.Popen, pidfd: int | None, timeout: float, out: Output) -> int | None:
    """The child's exit status once it exited, else None after ``timeout`` or once some output
    was relayed (a pidfd turns readable on exit, so an exit is seen at once without waking up
    every few ms)."""
    # Not the pipe once it ended: the job's last writer (in a container, bwrap's init) may close it
    # some milliseconds before the child exits (a PID namespace's teardown).
    watch = [fd for fd in (pidfd, None if out.ended else out.pipe_fd) if fd is not None]
    if watch:
        ready, _, _ = select.select(watch, [], [], timeout)
        if out.pipe_fd is not None and out.pipe_fd in ready:
            out.pump()
    else:
        time.sleep(min(timeout, 0.01) if out.ended else timeout)  # no pidfd: look for the exit often
    return child.poll()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _spawn(spec: LaunchSpec, log: int, info_fd: int | None = None) -> subprocess.Popen:
    """Start the job in a session of its own, in its workdir, as its user; in a container, with
    ``info_fd`` given to bwrap as its --info-fd (see _container_init).

    No ``preexec_fn``: Python runs one in the forked child only after a full fork (no vfork) and
    its own after-fork work, the largest part of a trivial job's cycle. The workdir must still be entered as the
    job's user (so that a job never starts in a directory its user may not enter), while Popen's
    ``cwd`` is entered before the uid switch: so the launcher enters it itself, as that user
    (:func:`_enter_as`), and the job inherits it. Without a switch, ``cwd`` does the same."""
    common: dict[str, Any] = dict(env=spec.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    argv = list(spec.argv)
    if info_fd is not None:
        argv[1:1] = ["--info-fd", str(info_fd)]
        common["pass_fds"] = (info_fd,)
    if spec.switch is None:
        return subprocess.Popen(argv, cwd=spec.cwd, **common)
    uid, gid, groups = spec.switch.uid, spec.switch.gid, list(spec.switch.groups)
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            _enter_as(uid, gid, groups, spec.cwd)
        except OSError as e:
            raise _WorkdirError(e.errno, e.strerror, spec.cwd) from None
        # extra_groups is always given, even empty: otherwise the job keeps root's groups.
        return subprocess.Popen(argv, user=uid, group=gid, extra_groups=groups, **common)
    finally:
        os.fchdir(here)  # the launcher keeps no hold on the job's directory
        os.close(here)


class _WorkdirError(OSError):
    """The job's user may not enter its workdir."""


def _enter_as(uid: int, gid: int, groups: list[int], path: str) -> None:
    """chdir to ``path`` with the permissions of ``uid``/``gid``/``groups`` (the kernel checks
    path access with the effective ids), then take the launcher's own ids back: its real and
    saved uid stay root's throughout, so the job's user can neither signal nor trace it. The
    launcher is single-threaded, so no other code runs meanwhile under the borrowed ids."""
    saved = os.geteuid(), os.getegid(), os.getgroups()
    os.setgroups(groups)
    os.setegid(gid)
    try:
        os.seteuid(uid)
        try:
            os.chdir(path)
        finally:
            os.seteuid(saved[0])
    finally:
        os.setegid(saved[1])
        os.setgroups(saved[2])


def _as_whom(spec: LaunchSpec) -> str:
    return f" as uid {spec.switch.uid}" if spec.switch is not None else ""


def _reason(e: Exception, spec: LaunchSpec) -> str:
    if isinstance(e, _WorkdirError) or (isinstance(e, OSError) and e.filename == spec.cwd):
        return f"cannot enter workdir {spec.cwd}"
    return str(e)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
