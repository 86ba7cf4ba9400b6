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

from hfai.cli.common import run_async
from hfai.protocol.limits import MAX_RANK

if TYPE_CHECKING:
    from hfai.protocol.types import ExecRequest, JobRecord

__all__ = ["ChunkOrder", "exec_cmd", "shell", "target"]

# Chunks received beyond a gap before the gap counts as lost (NATS delivers one publisher's
# messages in order, so a gap is a message dropped, not one late).
_GAP_PATIENCE = 8
# How long after the command's end its last chunks may still come.
_END_GRACE_S = 1.0


# ------------------------------------------------------------------------------------ pure parts

def target(job: JobRecord, rank: int) -> str:
    """The node that runs rank ``rank`` of ``job``; a typed error saying why there is none."""
    from hfai.protocol.errors import Conflict, InvalidRequest
    from hfai.protocol.types import ChainState

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


async def _session(job_ref: str, rank: int, argv: tuple[str, ...], tty: bool, term: _Terminal) -> int:
    from hfai.api.client import ApiClient
    from hfai.api.config import cli_config
    from hfai.protocol import decode, encode, names
    from hfai.protocol.errors import Forbidden, Unavailable
    from hfai.protocol.types import ExecExit, ExecInput, ExecOutput, ExecRequest, ExecStarted

    class ExecClient(ApiClient):
        async def start(self, node: str, req: ExecRequest) -> ExecStarted:
            subject = names.agent_op_subject(node, self.user, names.AGENT_OP_EXEC) if self.operator else \
                names.agent_exec_subject(node, self.user)
            try:
                return await self._request(subject, encode(req), ExecStarted)
            except Forbidden as e:
                if not str(e).startswith("the cluster does not let"):
                    raise  # the agent's refusal: not the job's owner
                raise Forbidden(f"the cluster does not let {self.user} run commands in jobs (credentials issued "
                                f"before hfai exec existed? ask an operator for new ones)") from None
            except Unavailable:
                raise Unavailable(f"the agent of node {node} does not answer") from None

    api = ExecClient(cli_config())
    async with api:
        job = await api.status(job_ref)
        node = target(job, rank)
        session = secrets.token_hex(8)
        rows, cols = _size(term.tty_fd)
        req = ExecRequest(job_id=job.id, rank=rank, session=session, argv=argv, tty=tty,
                          stdin=term.stdin_fd is not None, rows=rows, cols=cols,
                          term=os.environ.get("TERM", "xterm") or "xterm")
        nc = api._conn
        inbox: asyncio.Queue = asyncio.Queue()

        async def received(msg) -> None:
            inbox.put_nowait(msg.data)

        sub = await nc.subscribe(names.exec_stream_subject(node, api.user, session, names.EXEC_OUT), cb=received)
        await nc.flush()
        started = await api.start(node, req)
        in_subject = names.exec_stream_subject(node, api.user, session, names.EXEC_IN)

        async def send(**fields) -> None:
            with contextlib.suppress(Exception):  # the session's end tells what matters
                await nc.publish(in_subject, encode(ExecInput(session=session, **fields)))

        order = ChunkOrder()
        loop = asyncio.get_running_loop()
        helpers = [asyncio.create_task(_keepalive(send, order, started.idle_s / 3))]
        if term.typed_ahead:
            await send(data=term.typed_ahead)
        if term.stdin_fd is not None:
            helpers.append(asyncio.create_task(_relay_stdin(loop, term.stdin_fd, send, tty)))
        handled: list[int] = []
        sending: set[asyncio.Task] = set()  # what signal handlers send, kept until sent

        def later(**fields) -> None:
            task = loop.create_task(send(**fields))
            sending.add(task)
            task.add_done_callback(sending.discard)

        def resized() -> None:
            r, c = _size(term.tty_fd)
            later(rows=r, cols=c, acked=order.acked)

        def forward(signum: int) -> None:
            later(signal=signum, acked=order.acked)

        if term.tty_fd is not None:
            loop.add_signal_handler(signal.SIGWINCH, resized)
            handled.append(signal.SIGWINCH)
        if not tty:  # a terminal session sends Ctrl-C as a key
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, forward, int(signum))
                handled.append(signum)
        unacked = 0
        end: ExecExit | None = None
        try:
            while not order.complete:
                wait = _END_GRACE_S if end is not None else started.idle_s
                try:
                    data = await asyncio.wait_for(inbox.get(), wait)
                except TimeoutError:
                    if end is None:
                        raise Unavailable(f"lost the agent of node {node}: nothing from it for "
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
                    await send(acked=order.acked)
        except BaseException:
            await send(close=True)
            raise
        finally:
            for handled_signal in handled:
                loop.remove_signal_handler(handled_signal)
            for h in helpers:
                h.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        assert end is not None
        eol = "\r\n" if tty else "\n"  # a terminal in raw mode moves down a line, not to its start
        if order.lost:
            term.stderr.write(f"hfai: {order.lost} output chunk(s) of the command were lost on the way{eol}".encode())
        if end.reason:
            term.stderr.write(f"hfai: the platform ended the command: {end.reason}{eol}".encode())
        term.stderr.flush()
        return end.exit_code


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
