"""``hfai exec JOB [-r RANK] -- CMD...`` and ``hfai shell JOB [-r RANK]``: a command, or an
interactive shell under a pseudo-terminal, in a running job's processes on the node of one rank,
as the job's user (agent/exec.py runs it; docs/dev.md "exec and shell").

The command's bytes go to this process's stdout and stderr untouched, and ``hfai exec`` exits
with its status. ``hfai shell`` puts the local terminal in raw mode (every key goes to the remote
shell, Ctrl-C included) and puts it back however the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

import click

from hfai.api.client import ApiClient
from hfai.api.config import cli_config
from hfai.cli.common import run_async
from hfai.protocol import decode, names
from hfai.protocol.errors import Conflict, ErrorSub, Forbidden, InvalidRequest, Unavailable
from hfai.protocol.limits import MAX_RANK
from hfai.protocol.types import ChainState, ExecExit, ExecInput, ExecOutput, ExecRequest, ExecStarted

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription

    from hfai.protocol.types import JobRecord

__all__ = ["ChunkOrder", "exec_cmd", "shell", "target"]

# Chunks received beyond a gap before the gap counts as lost (NATS delivers one publisher's
# messages in order, so a gap is a message dropped, not one late).
_GAP_PATIENCE = 8
# How long after the command's end its last chunks may still come.
_END_GRACE_S = 1.0


# ------------------------------------------------------------------------------------ pure parts

def target(job: JobRecord, rank: int) -> str:
    """The node that runs rank ``rank`` of ``job``; a typed error saying why there is none."""
    if job.state not in (ChainState.RUNNING, ChainState.SUSPENDING) or not job.nodes:
        raise Conflict(f"job {job.id} ({job.spec.name}) is {job.state.value}, not running: no process to run a "
                       f"command in")
    if not 0 <= rank < len(job.nodes):
        raise InvalidRequest(f"rank {rank} is out of range: job {job.id} has {len(job.nodes)} rank(s), "
                             f"0..{len(job.nodes) - 1}")
    return job.nodes[rank]


@dataclass
class ChunkOrder:
    """Output chunks put back in the order sent: ``add`` returns those now in order, ``finish``
    learns how many were sent; a gap that stays is skipped and counted in ``lost``."""

    next: int = 0
    lost: int = 0
    end: int | None = None
    pending: dict[int, object] = field(default_factory=dict)

    def add(self, seq: int, item: object) -> list:
        if seq >= self.next and seq not in self.pending and (self.end is None or seq < self.end):
            self.pending[seq] = item
        out = self._ready()
        if len(self.pending) >= _GAP_PATIENCE:
            out += self.skip()
        return out

    def finish(self, end: int) -> list:
        self.end = end
        return self._ready()

    @property
    def complete(self) -> bool:
        return self.end is not None and self.next >= self.end

    @property
    def acked(self) -> int:
        """The newest chunk received with none missing before it (-1: none)."""
        return self.next - 1

    def skip(self) -> list:
        """Give up on what is missing: the chunks held, in order (and up to ``end``)."""
        out = []
        for seq in sorted(self.pending):
            self.lost += seq - self.next
            out.append(self.pending.pop(seq))
            self.next = seq + 1
        if self.end is not None and self.next < self.end:
            self.lost += self.end - self.next
            self.next = self.end
        return out

    def _ready(self) -> list:
        out = []
        while self.next in self.pending:
            out.append(self.pending.pop(self.next))
            self.next += 1
        return out


# ---------------------------------------------------------------------------------- the client

@dataclass
class _Terminal:
    """Where the session's bytes go and come from."""

    stdout: BinaryIO
    stderr: BinaryIO
    stdin_fd: int | None = None  # relayed when set
    tty_fd: int | None = None  # its size is relayed (SIGWINCH) when set
    typed_ahead: bytes = b""  # keys typed before the session, sent first (see _raw)


class ExecClient:
    """The session's own traffic with the agent of the rank's node, through the API client
    ``api`` (its public requests, publishes and subscriptions): the request that opens it, its
    output stream, and its input stream."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    async def start(self, node: str, req: ExecRequest) -> ExecStarted:
        user = self.api.user
        subject = names.agent_op_subject(node, user, names.AGENT_OP_EXEC) if self.api.operator else \
            names.agent_exec_subject(node, user)
        try:
            return await self.api.request(subject, req, ExecStarted)
        except Forbidden as e:
            if e.sub is not ErrorSub.SUBJECT_DENIED:
                raise  # the agent's refusal: not the job's owner
            raise Forbidden(f"the cluster does not let {user} run commands in jobs (credentials issued "
                            f"before hfai exec existed? ask an operator for new ones)", sub=e.sub) from None
        except Unavailable as e:
            raise Unavailable(f"the agent of node {node} does not answer", sub=e.sub) from None

    async def listen(self, node: str, session: str, inbox: asyncio.Queue) -> Subscription:
        """Put the session's output messages (their bytes) in ``inbox``, from before it starts."""
        return await self.api.subscribe(names.exec_stream_subject(node, self.api.user, session, names.EXEC_OUT),
                                        inbox.put_nowait)

    async def send(self, node: str, message: ExecInput) -> None:
        await self.api.publish(names.exec_stream_subject(node, self.api.user, message.session, names.EXEC_IN),
                               message)


async def _session(job_ref: str, rank: int, argv: tuple[str, ...], tty: bool, term: _Terminal) -> int:
    """Run ``argv`` (a shell when empty) in rank ``rank`` of the job, relaying ``term``; the
    command's exit status."""
    async with ApiClient(cli_config()) as api:
        job = await api.status(job_ref)
        node = target(job, rank)
        req = _request(job, rank, argv, tty, term)
        end, lost = await _Session(ExecClient(api), node, req, term).run()
        _report(term, end, lost, tty)
        return end.exit_code


def _request(job: JobRecord, rank: int, argv: tuple[str, ...], tty: bool, term: _Terminal) -> ExecRequest:
    """The request that opens a new session (its name random) on rank ``rank`` of ``job``."""
    rows, cols = _size(term.tty_fd)
    return ExecRequest(job_id=job.id, rank=rank, session=secrets.token_hex(8), argv=argv, tty=tty,
                       stdin=term.stdin_fd is not None, rows=rows, cols=cols,
                       term=os.environ.get("TERM", "xterm") or "xterm")


class _Session:
    """One session with the agent of ``node``, from its start to the command's exit: the output
    it sends put back in order and written to the terminal, and what the terminal gives (keys,
    its size, signals) sent to it, with acknowledgements of the output received."""

    def __init__(self, api: ExecClient, node: str, req: ExecRequest, term: _Terminal):
        self.api, self.node, self.req, self.term = api, node, req, term
        self.tty = req.tty
        self.order = ChunkOrder()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self._sending: set[asyncio.Task] = set()  # what signal handlers send, kept until sent
        self._handled: list[int] = []  # the signals handled while the session lasts

    async def run(self) -> tuple[ExecExit, int]:
        """The command's end, and how many of its output chunks were lost on the way."""
        sub = await self.api.listen(self.node, self.req.session, self.inbox)
        started = await self.api.start(self.node, self.req)
        helpers = [asyncio.create_task(_keepalive(self.send, self.order, started.idle_s / 3))]
        if self.term.typed_ahead:
            await self.send(data=self.term.typed_ahead)
        if self.term.stdin_fd is not None:
            helpers.append(asyncio.create_task(_relay_stdin(self.loop, self.term.stdin_fd, self.send, self.tty)))
        self._handle_signals()
        try:
            end = await self._receive(started)
        except BaseException:
            await self.send(close=True)
            raise
        finally:
            for handled_signal in self._handled:
                self.loop.remove_signal_handler(handled_signal)
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return end, self.order.lost

    async def send(self, **fields) -> None:
        """An input message of the session (keys, eof, size, signal, acked, close)."""
        with contextlib.suppress(Exception):  # the session's end tells what matters
            await self.api.send(self.node, ExecInput(session=self.req.session, **fields))

    def _later(self, **fields) -> None:
        """Send from a signal handler (it cannot wait)."""
        task = self.loop.create_task(self.send(**fields))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _resized(self) -> None:
        r, c = _size(self.term.tty_fd)
        self._later(rows=r, cols=c, acked=self.order.acked)

    def _forward(self, signum: int) -> None:
        self._later(signal=signum, acked=self.order.acked)

    def _handle_signals(self) -> None:
        """The terminal's size changes are relayed; so are SIGINT and SIGTERM without a terminal
        (a terminal session sends Ctrl-C as a key)."""
        if self.term.tty_fd is not None:
            self.loop.add_signal_handler(signal.SIGWINCH, self._resized)
            self._handled.append(signal.SIGWINCH)
        if not self.tty:
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.loop.add_signal_handler(signum, self._forward, int(signum))
                self._handled.append(signum)

    async def _receive(self, started: ExecStarted) -> ExecExit:
        """Write the output to the terminal in order until all of it before the command's exit
        came (or stayed lost past a grace), acknowledging it every half window."""
        order, term = self.order, self.term
        unacked = 0
        end: ExecExit | None = None
        while not order.complete:
            wait = _END_GRACE_S if end is not None else started.idle_s
            try:
                data = await asyncio.wait_for(self.inbox.get(), wait)
            except TimeoutError:
                if end is None:
                    raise Unavailable(f"lost the agent of node {self.node}: nothing from it for "
                                      f"{started.idle_s:g}s") from None
                chunks = order.skip()
            else:
                msg = decode(data, (ExecOutput, ExecExit))
                if isinstance(msg, ExecExit):
                    end = msg
                    chunks = order.finish(msg.seq)
                else:
                    chunks = order.add(msg.seq, msg)
            for chunk in chunks:
                if chunk.data:
                    out = term.stderr if chunk.stream == 2 else term.stdout
                    out.write(chunk.data)
                    out.flush()
            unacked += len(chunks)
            if unacked >= max(1, started.window // 2) and end is None:
                unacked = 0
                await self.send(acked=order.acked)
        assert end is not None
        return end


def _report(term: _Terminal, end: ExecExit, lost: int, tty: bool) -> None:
    """Say on stderr what the command's output alone would not: chunks lost, the platform's end."""
    eol = "\r\n" if tty else "\n"  # a terminal in raw mode moves down a line, not to its start
    if lost:
        term.stderr.write(f"hfai: {lost} output chunk(s) of the command were lost on the way{eol}".encode())
    if end.reason:
        term.stderr.write(f"hfai: the platform ended the command: {end.reason}{eol}".encode())
    term.stderr.flush()


async def _keepalive(send, order: ChunkOrder, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await send(acked=order.acked)


async def _relay_stdin(loop: asyncio.AbstractEventLoop, fd: int, send, tty: bool) -> None:
    """Send what arrives on ``fd`` as it arrives; its end as eof (a terminal's Ctrl-D is a byte)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        queue.put_nowait(data)
        if not data:
            loop.remove_reader(fd)

    loop.add_reader(fd, readable)
    try:
        while True:
            data = await queue.get()
            if not data:
                if not tty:
                    await send(eof=True)
                return
            await send(data=data)
    finally:
        loop.remove_reader(fd)


def _size(fd: int | None) -> tuple[int, int]:
    if fd is None:
        return 24, 80
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


@contextlib.contextmanager
def _raw(fd: int):
    """The terminal ``fd`` in raw mode, put back however the block ends. Yields what was typed
    ahead as whole lines, for the remote shell (not TCSAFLUSH: keys typed ahead are the user's)."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        ahead = _typed_ahead(fd)
        tty.setraw(fd, termios.TCSADRAIN)
        yield ahead
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# Reads of typed-ahead input at most (a hung-up terminal would read as end-of-file for ever).
_AHEAD_READS = 64


def _typed_ahead(fd: int) -> bytes:
    """The complete lines waiting on the terminal ``fd`` while it is still in canonical mode, an
    end-of-file typed ahead (Ctrl-D; script(1) types one when its own input ends) as the EOF key
    (Ctrl-D) the remote terminal understands. Read now because Linux hands a reader that switched
    to raw mode each pending end-of-file as a NUL byte, which the remote shell would echo as ^@."""
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    out = bytearray()
    try:
        for _ in range(_AHEAD_READS):
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                break
            out += data or b"\x04"
    finally:
        os.set_blocking(fd, blocking)
    return bytes(out)


# ------------------------------------------------------------------------------------ commands

rank_option = click.option("-r", "--rank", type=click.IntRange(0, MAX_RANK), default=0, show_default=True,
                           help="Which rank's node to run on (one rank per node).")


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@rank_option
@click.option("-i", "--stdin", "forward_stdin", is_flag=True, help="Pass this terminal's stdin to the command.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@run_async
async def exec_cmd(job: str, rank: int, forward_stdin: bool, command: tuple[str, ...]):
    """Run COMMAND in the running JOB's environment and workdir, as its user, on the node of RANK.

    \b
    hfai exec mnist -- nvidia-smi
    hfai exec mnist -r 1 -- sh -c 'echo $RANK; ls'
    The command's output comes back as it is written; hfai exec exits with its status.
    """
    stdout, stderr = sys.stdout.buffer, sys.stderr.buffer
    stdin_fd = _stdin_fd() if forward_stdin else None
    code = await _session(job, rank, tuple(command), False, _Terminal(stdout, stderr, stdin_fd=stdin_fd))
    sys.exit(code)


@click.command("shell", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@rank_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def shell(job: str, rank: int, command: tuple[str, ...]):
    """An interactive shell (or COMMAND) under a terminal in the running JOB, on the node of RANK.

    \b
    hfai shell mnist          the job's user's shell, in the job's workdir and environment
    hfai shell mnist -r 1 -- htop
    Every key goes to the remote side (Ctrl-C too); leave the shell to end the session.
    """
    fd = _stdin_fd()
    if fd is None or not os.isatty(fd):
        raise click.ClickException("hfai shell needs a terminal on stdin; use hfai exec JOB -- CMD without one")
    stdout = sys.stdout.buffer
    with _raw(fd) as ahead:
        term = _Terminal(stdout, stdout, stdin_fd=fd, tty_fd=fd, typed_ahead=ahead)
        code = run_async(_session)(job, rank, tuple(command), True, term)
    sys.exit(code)


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return None
