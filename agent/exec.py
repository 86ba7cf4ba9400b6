"""Commands in a running job's processes (``hfai exec``, ``hfai shell``), served by each node's agent.

A caller asks on ``hfai.agent.<node>.exec.<user>`` (a user) or ``hfai.agent.<node>.op.<user>.exec``
(an operator); NATS lets only ``<user>`` publish there, and only operators on the second, so the
subject proves who asks. The agent admits the owner of the job (or an operator), never a name
the payload claims (:func:`authorize`), and starts the command as the job's user, in its workdir,
with the environment the job itself got (agent/jobenv.py), next to the rank that runs here.

The command runs under a pseudo-terminal (``tty``: its own session with the terminal as its
controlling one) or with pipes, in a session of its own either way. Its output goes to the
caller on the session's ``.out`` subject in numbered chunks (at most ``[agent] exec_chunk_bytes``,
below NATS's max_payload), the end as :class:`ExecExit` with the exit status; the caller's
stdin, terminal size, signals, acknowledgements and keepalives come on ``.in``. No more than
``exec_window`` chunks go unacknowledged: beyond that the agent stops reading, and the command
blocks on its own output, instead of NATS dropping what a slow caller cannot take.

Nothing of it survives the job: a session, and whatever it left running in the background, is
killed once the job's run on this node has ended (checked every ``exec_poll_s``; the sessions of
each run are recorded under ``<state_dir>/exec/``, so an agent restarted meanwhile still kills
them). A caller that sent nothing for ``exec_idle_s`` has its session killed, and so does an
agent that stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import pty
import pwd
import signal
import struct
import sys
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from nats.aio.client import Client

from hfai.agent.contain import ContainmentError, enter_argv
from hfai.agent.identity import Account, job_identity, lookup_account
from hfai.agent.jobenv import check_command, job_command
from hfai.agent.plan import LocalRun, RunPhase
from hfai.agent.runs import RunStore
from hfai.agent.trust import short
from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.core.daemon import raise_if_cancelled
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from hfai.protocol.types import ExecExit, ExecInput, ExecOutput, ExecRequest, ExecStarted

log = logging.getLogger(__name__)

__all__ = ["ExecService", "authorize", "exit_status", "session_members", "window_open"]

# What the agent starts, already as the job's user and leader of a new session: it takes the
# terminal as its controlling one, enters the workdir with the user's own permissions (so exec
# never starts where the user may not go), and becomes the command. -I -S: nothing of the job's
# environment (PYTHONPATH, ...) or site reaches this interpreter; the command gets all of it.
_CHILD = r"""
import os, sys
cwd, mode, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
def fail(code, text):
    os.write(2, ("hfai exec: " + text + "\r\n").encode(errors="replace"))
    os._exit(code)
if mode == "tty":
    import fcntl, termios
    if os.getsid(0) != os.getpid():
        # Forked by nsenter into the job's container: a session of its own there, so that the
        # terminal's process groups are ones its shell can see and restore.
        os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
try:
    os.chdir(cwd)
except OSError as e:
    fail(126, "cannot enter the workdir %s: %s" % (cwd, e.strerror))
try:
    os.execvp(argv[0], argv)
except OSError as e:
    fail(127 if isinstance(e, FileNotFoundError) else 126, "cannot run %r: %s" % (argv[0], e.strerror))
"""

RUN_ENDED = "its job's run on this node ended"

# Signals a caller may send to its command's process group (Ctrl-C and friends of a pipe session).
_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL})
# Longest command line and terminal name accepted (a request is one NATS message anyway).
_MAX_ARGV = 4096
_MAX_TERM = 64


# ------------------------------------------------------------------------------------ pure parts

def authorize(caller: str, operator: bool, job_id: str, rank: int, local: dict[str, LocalRun], node: str) -> LocalRun:
    """The run next to which ``caller`` may run a command: the newest alive run of ``job_id`` on
    this node, if it is ``rank`` and the caller owns the job or is an operator (``operator`` comes
    from the subject, which NATS checked). NotFound when no such rank runs here, Forbidden when
    the job is someone else's."""
    runs = [r for r in local.values() if r.assignment.job_id == job_id and r.phase is RunPhase.ALIVE]
    if not runs:
        raise NotFound(f"job {job_id} has no running rank on node {node} (has it ended?)")
    run = max(runs, key=lambda r: r.assignment.run_id)
    owner = run.assignment.user
    if not operator and owner != caller:
        raise Forbidden(f"{caller} may not run commands in job {job_id}: it is {owner}'s, and only its owner "
                        f"and operators may")
    if run.assignment.rank != rank:
        raise NotFound(f"rank {rank} of job {job_id} does not run on node {node} (rank {run.assignment.rank} does)")
    return run


def window_open(next_seq: int, acked: int, window: int) -> bool:
    """Whether another chunk may be sent: chunks ``acked+1 .. next_seq-1`` are unacknowledged."""
    return next_seq - acked - 1 < max(1, window)


def exit_status(returncode: int) -> int:
    """A process's status as a shell reports it: its exit code, or 128+N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


def session_members(procs: list[tuple[int, int, float]], sid: int, since: float) -> list[int]:
    """The pids of ``procs`` ((pid, session id, creation time)) that belong to session ``sid``
    started at ``since``: a process created before it carries a recycled number, not ours."""
    return [pid for pid, s, created in procs if s == sid and created >= since - 1.0]


# -------------------------------------------------------------------------------- the service

@dataclass
class _Session:
    id: str
    user: str
    run: str
    proc: asyncio.subprocess.Process
    out_subject: str
    started: float  # wall time, to tell its processes from recycled pids
    heard: float  # clock.monotonic() of the caller's last message
    master: int | None = None  # the terminal (output and input), or
    stdout: int | None = None  # the pipes
    stderr: int | None = None
    stdin: int | None = None
    seq: int = 0
    acked: int = -1
    reason: str = ""
    window: asyncio.Event = field(default_factory=asyncio.Event)
    writes: asyncio.Queue = field(default_factory=asyncio.Queue)
    tasks: list[asyncio.Task] = field(default_factory=list)
    sub: object = None

    leader: int = 0  # in a container under a terminal: the command's own session (see _CHILD)
    container: int = 0  # the pid of the job's container's pid 1 the command runs in (0: none)

    @property
    def sid(self) -> int:
        return self.leader or self.proc.pid  # it leads the session it made


class ExecService:
    """The exec sessions of the agent of ``node`` (its runs in ``store``); timings from ``[agent]``."""

    def __init__(self, node: str, store: RunStore, *, idle_s: float = 30.0, drain_s: float = 0.5,
                 chunk_bytes: int = 64 * 1024, window: int = 64, poll_s: float = 1.0, clock: Clock = SYSTEM):
        self.node = node
        self.store = store
        self.idle_s = max(0.1, idle_s)
        self.drain_s = max(0.0, drain_s)
        self.chunk_bytes = max(1024, min(chunk_bytes, 512 * 1024))
        self.window = max(1, window)
        self.poll_s = max(0.05, poll_s)
        self.clock = clock
        self.dir = store.root / "exec"
        self.sessions: dict[tuple[str, str], _Session] = {}  # (user, session id)
        self._nc: Client | None = None
        self._closing = False

    @property
    def _conn(self) -> Client:
        if self._nc is None:
            raise InvalidRequest(f"the agent of node {self.node} is not serving exec sessions yet")
        return self._nc

    async def serve(self, nc) -> None:
        """Answer exec requests on ``nc``: users' and operators'."""
        self._nc = nc
        self.dir.mkdir(mode=0o700, exist_ok=True)
        await nc.subscribe(names.agent_exec_wildcard(self.node), cb=self._on_request)
        await nc.subscribe(names.agent_op_wildcard(self.node, names.AGENT_OP_EXEC), cb=self._on_request)

    async def watch(self) -> None:
        """Kill sessions of runs that ended and of callers gone silent, and what ended sessions of
        ended runs left behind (a task of the agent, until cancelled)."""
        while True:
            raise_if_cancelled()
            try:
                self.sweep()
            except OSError as e:
                log.warning("checking the exec sessions failed: %s", e)
            await self.clock.sleep(self.poll_s)

    def sweep(self) -> None:
        records = sorted(self.dir.iterdir()) if self.dir.is_dir() else []
        if not records and not self.sessions:
            return
        alive = {k for k, r in self.store.snapshot().items() if r.phase is RunPhase.ALIVE}
        now = self.clock.monotonic()
        for s in list(self.sessions.values()):
            if s.reason:
                continue
            if s.run not in alive:
                self._end(s, RUN_ENDED)
            elif now - s.heard > self.idle_s:
                self._end(s, f"its caller sent nothing for {self.idle_s:g}s")
        for record in records:
            if record.name not in alive:
                for sid, since in _read_record(record):
                    killed = _kill_session(sid, since)
                    if killed:
                        log.info("killed %d process(es) an exec session left in run %s, which ended", killed,
                                 record.name)
                record.unlink(missing_ok=True)

    async def close(self) -> None:
        """Kill every session (their callers' streams go with this agent) and wait for their ends."""
        self._closing = True
        for s in list(self.sessions.values()):
            self._end(s, "the node's agent stopped")
        tasks = [t for s in self.sessions.values() for t in s.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    # ---------------------------------------------------------------------------- requests

    async def _on_request(self, msg) -> None:
        await _nats.answer(msg, self._dispatch, "agent exec")

    async def _dispatch(self, subject: str, data: bytes) -> ExecStarted:
        node, user, operator = names.parse_agent_exec_subject(subject)
        if node != self.node:
            raise InvalidRequest(f"no exec on node {short(node)} here")
        return await self.open(user, operator, decode(data, ExecRequest))

    async def open(self, user: str, operator: bool, req: ExecRequest) -> ExecStarted:
        """Start ``req`` for ``user`` (an operator if ``operator``); raises the typed refusal."""
        if self._closing:
            raise InvalidRequest(f"the agent of node {self.node} is stopping")
        names.check_token("exec session", req.session)
        if (user, req.session) in self.sessions:
            raise Conflict(f"exec session {req.session} is already running")
        if len(req.argv) > _MAX_ARGV or len(req.term) > _MAX_TERM:
            raise InvalidRequest("the command line or terminal name is too long")
        run = authorize(user, operator, req.job_id, req.rank, self.store.snapshot(), self.node)
        ra = run.assignment
        who = job_identity(ra.user, self.store.run_as, self.store.agent, lookup_account)
        _, env = job_command(ra, who, node=self.node, control_dir=str(self.store.control_dir(run.key)),
                             run_as=self.store.run_as, env_root=self.store.env_root,
                             datasets_dir=self.store.datasets_dir)
        argv = list(req.argv) or [_shell(who.account)]
        check_command(argv, env, ra.workdir)
        if req.tty:
            env["TERM"] = req.term or "xterm"
        enter: list[str] = []
        pid1 = self.store.container_pid(run.key)
        if pid1 is not None and self.store.containment is not None:
            # Into the job's container: the command sees what the job sees, and no more.
            self.store.containment.inside_env(env, ra.user)
            try:
                enter = enter_argv(pid1, userns=who.switch or os.geteuid() != 0)
            except ContainmentError as e:
                raise Unavailable(str(e)) from None
        s = await self._spawn(user, req, run.key, argv, env, who.account if who.switch else None, ra.workdir, enter,
                              pid1 if enter else None)
        log.info("%s%s runs %s in job %s rank %d (session %s, pid %d)", "operator " if operator else "", user,
                 short(argv[0]), ra.job_id, ra.rank, req.session, s.proc.pid)
        return ExecStarted(session=req.session, node=self.node, run=run.key, pid=s.proc.pid, idle_s=self.idle_s,
                           window=self.window)

    async def _spawn(self, user: str, req: ExecRequest, run: str, argv: list[str], env: dict[str, str],
                     account: Account | None, workdir: str, enter: list[str], pid1: int | None = None) -> _Session:
        ids = {} if account is None else {"user": account.uid, "group": account.gid,
                                          "extra_groups": list(account.groups)}
        mine: list[int] = []  # the agent's ends
        theirs: list[int] = []  # the child's ends, closed here once it has them
        try:
            if req.tty:
                master, slave = pty.openpty()
                mine.append(master)
                theirs.append(slave)
                _set_size(master, req.rows, req.cols)
                stdio = {"stdin": slave, "stdout": slave, "stderr": slave}
            else:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                mine += [out_r, err_r]
                theirs += [out_w, err_w]
                stdio = {"stdout": out_w, "stderr": err_w, "stdin": asyncio.subprocess.DEVNULL}
                if req.stdin:
                    in_r, in_w = os.pipe()
                    mine.append(in_w)
                    theirs.append(in_r)
                    stdio["stdin"] = in_r
            for fd in mine:
                os.set_blocking(fd, False)
                os.set_inheritable(fd, False)
            cmd = [*enter, sys.executable, "-I", "-S", "-c", _CHILD, workdir, "tty" if req.tty else "pipe", *argv]
            proc = await asyncio.create_subprocess_exec(
                cmd[0], *cmd[1:], env=env, cwd="/", start_new_session=True, close_fds=True, **stdio, **ids)  # type: ignore[arg-type]
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        now = self.clock.monotonic()
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:  # already gone: nothing of it can be younger than now
            started = time.time()
        s = _Session(id=req.session, user=user, run=run, proc=proc, started=started, heard=now,
                     out_subject=names.exec_stream_subject(self.node, user, req.session, names.EXEC_OUT))
        if req.tty:
            s.master = s.stdin = mine[0]
        else:
            s.stdout, s.stderr = mine[0], mine[1]
            s.stdin = mine[2] if req.stdin else None
        s.window.set()
        s.container = pid1 or 0
        if enter and req.tty:
            # nsenter forked the command into the container, where it made a session of its own.
            s.leader = await _forked_child(proc.pid)
            with contextlib.suppress(psutil.Error):
                started = s.started = psutil.Process(s.leader).create_time() if s.leader else started
        try:
            _append_record(self.dir / run, s.sid, started)
        except OSError as e:  # the session still dies with the run while this agent lives
            log.warning("could not record exec session %s of run %s: %s", s.id, run, e)
        self.sessions[(user, s.id)] = s

        async def received(msg) -> None:
            await self._on_input(s, msg)

        s.sub = await self._conn.subscribe(names.exec_stream_subject(self.node, user, s.id, names.EXEC_IN), cb=received)
        s.tasks.append(asyncio.create_task(self._run(s), name=f"exec-{s.id}"))
        return s

    # ---------------------------------------------------------------------------- a session

    async def _run(self, s: _Session) -> None:
        pumps = [asyncio.create_task(self._pump(s, fd, stream))
                 for fd, stream in ((s.master, 1), (s.stdout, 1), (s.stderr, 2)) if fd is not None]
        helpers = [asyncio.create_task(self._tick(s)), asyncio.create_task(self._write(s))]
        code = -1
        try:
            code = exit_status(await s.proc.wait())
            if not s.reason and s.container and code == 128 + signal.SIGKILL and await _gone(s.container):
                # The job's container ended (its run did), and took the command with it.
                s.reason = RUN_ENDED
            if pumps:
                _, late = await asyncio.wait(pumps, timeout=self.drain_s)
                for p in late:
                    p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            for fd in {s.master, s.stdout, s.stderr, s.stdin} - {None}:
                with contextlib.suppress(OSError):
                    os.close(fd)  # type: ignore[arg-type]
            with contextlib.suppress(Exception):
                await s.sub.unsubscribe()  # type: ignore[attr-defined]
            self.sessions.pop((s.user, s.id), None)
            with contextlib.suppress(Exception):
                await self._publish(s, ExecExit(session=s.id, seq=s.seq, exit_code=code, reason=s.reason))
        log.info("exec session %s of %s in run %s ended with %d%s", s.id, s.user, s.run, code,
                 f" ({s.reason})" if s.reason else "")

    async def _pump(self, s: _Session, fd: int, stream: int) -> None:
        """Relay what the command writes on ``fd`` until it is closed."""
        loop = asyncio.get_running_loop()
        while True:
            await s.window.wait()
            try:
                data = os.read(fd, self.chunk_bytes)
            except BlockingIOError:
                await _ready(loop, fd, write=False)
                continue
            except OSError:  # EIO: every end of the terminal is closed
                return
            if not data:
                return
            await self._send(s, data, stream)

    async def _tick(self, s: _Session) -> None:
        """Say the agent is there while the command is quiet (the caller gives up on silence)."""
        while True:
            await self.clock.sleep(self.idle_s / 3)
            await self._send(s, b"", 1)

    async def _write(self, s: _Session) -> None:
        """Feed the caller's bytes to the command's stdin, in order; None closes it."""
        loop = asyncio.get_running_loop()
        while True:
            data = await s.writes.get()
            if s.stdin is None:
                continue
            if data is None:
                if s.master is None:
                    os.close(s.stdin)
                    s.stdin = None
                continue
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(s.stdin, view):]
                except BlockingIOError:
                    await _ready(loop, s.stdin, write=True)
                except OSError:  # the command closed its stdin
                    break

    async def _send(self, s: _Session, data: bytes, stream: int) -> None:
        seq, s.seq = s.seq, s.seq + 1
        if not window_open(s.seq, s.acked, self.window):
            s.window.clear()
        await self._publish(s, ExecOutput(session=s.id, seq=seq, data=data, stream=stream))

    async def _publish(self, s: _Session, message) -> None:
        await self._conn.publish(s.out_subject, encode(message))

    async def _on_input(self, s: _Session, msg) -> None:
        try:
            inp = decode(msg.data, ExecInput)
        except Exception as e:
            log.warning("ignoring an undecodable input of exec session %s: %s", s.id, e)
            return
        s.heard = self.clock.monotonic()
        if inp.acked > s.acked:
            s.acked = min(inp.acked, s.seq - 1)
            if window_open(s.seq, s.acked, self.window):
                s.window.set()
        if s.master is not None and inp.rows > 0 and inp.cols > 0:
            with contextlib.suppress(OSError):
                _set_size(s.master, inp.rows, inp.cols)
        if inp.data:
            s.writes.put_nowait(inp.data)
        if inp.eof:
            s.writes.put_nowait(None)
        if inp.signal in _SIGNALS:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(s.proc.pid, inp.signal)
        if inp.close:
            self._end(s, "its caller left")

    def _end(self, s: _Session, reason: str) -> None:
        """Kill the session and everything in it (its task then reports the end)."""
        if not s.reason:
            s.reason = reason
        log.info("killing exec session %s of %s: %s", s.id, s.user, reason)
        _kill_session(s.sid, s.started)


# --------------------------------------------------------------------------- the system side
# These wait for the kernel (a process to end, a fork to show), on real time whatever the agent's
# clock: nothing else moves them.

async def _gone(pid: int, within_s: float = 1.0) -> bool:
    """Does process ``pid`` end (exit, or be a zombie left to reap) within ``within_s``? A
    container's pid 1 dies a moment after the processes its end killed."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)


async def _forked_child(pid: int, within_s: float = 2.0) -> int:
    """The child ``pid`` forked (nsenter's command), 0 if none came within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            return 0
        if kids:
            return kids[0]
        await asyncio.sleep(0.002)
    return 0


def _shell(account: Account) -> str:
    try:
        shell = pwd.getpwuid(account.uid).pw_shell
    except KeyError:
        shell = ""
    return shell if shell and os.path.isabs(shell) and not shell.endswith(("nologin", "false")) else "/bin/sh"


def _set_size(fd: int, rows: int, cols: int) -> None:
    rows, cols = max(1, min(rows, 10000)), max(1, min(cols, 10000))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    fut = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, ready)
    try:
        await fut
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


def _kill_session(sid: int, since: float) -> int:
    """SIGKILL every process of session ``sid`` (started at ``since``); how many there were."""
    procs = []
    for p in psutil.process_iter(["create_time"]):
        try:
            procs.append((p.pid, os.getsid(p.pid), p.info["create_time"] or 0.0))
        except (OSError, psutil.Error):
            continue
    members = session_members(procs, sid, since)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(members)


def _append_record(path: Path, sid: int, since: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (json.dumps([sid, since]) + "\n").encode())
    finally:
        os.close(fd)


def _read_record(path: Path) -> list[tuple[int, float]]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            sid, since = json.loads(line)
            out.append((int(sid), float(since)))
        except (ValueError, TypeError):
            continue
    return out
