"""Slices of a rank's log for ``hfai logs``, served on ``hfai.agent.<node>.logs``.

The request is checked first (:func:`hfai.agent.trust.check_log_request`), the log opened without
following links (:mod:`hfai.agent.safefs`), and with ``timestamps`` each line's read time comes
from the launcher's side file (:mod:`hfai.agent.logtimes`).
"""

from __future__ import annotations

import os

from nats.aio.client import Client

from hfai.agent import logtimes, safefs
from hfai.agent.runs import RunStore
from hfai.agent.trust import check_log_request
from hfai.core import nats as _nats
from hfai.protocol import decode, names
from hfai.protocol.types import LogChunk, LogRequest


class LogReader:
    def __init__(self, node: str, store: RunStore):
        self.node = node
        self.store = store

    async def serve(self, nc: Client) -> None:
        await nc.subscribe(names.agent_logs_subject(self.node), cb=self._serve)

    async def _serve(self, msg) -> None:
        async def dispatch(_subject: str, data: bytes) -> LogChunk:
            return self.read(decode(data, LogRequest))

        await _nats.answer(msg, dispatch, "agent", local_error=str)

    def read(self, req: LogRequest) -> LogChunk:
        """A slice of one rank's log, at most trust.LOG_CHUNK_MAX bytes (the client pages)."""
        req = check_log_request(req)
        path = self.store.log_path(req.job_id, req.rank)
        try:
            fd = safefs.open_log_for_reading(path)
        except (FileNotFoundError, NotADirectoryError):
            return LogChunk(data=b"", offset=req.offset, size=0, exists=False)
        with open(fd, "rb") as f:
            size = f.seek(0, 2)
            offset = min(req.offset, size)
            f.seek(offset)
            data = f.read(req.max_bytes)
            if not req.timestamps:
                return LogChunk(data=data, offset=offset, size=size)
            at_line_start = offset == 0 or os.pread(f.fileno(), 1, offset - 1) == b"\n"
        data, line_ts = _line_times(path, offset, data, at_line_start)
        return LogChunk(data=data, offset=offset, size=size, line_ts=line_ts)


def _line_times(log_path, offset: int, data: bytes, at_line_start: bool) -> tuple[bytes, tuple[float, ...]]:
    """When each line starting in ``data`` was read from the job (hfai.agent.logtimes)."""
    try:
        fd: int | None = safefs.open_log_for_reading(logtimes.times_path(log_path))
    except (FileNotFoundError, NotADirectoryError):
        fd = None  # a log of a run from before agents kept the times
    try:
        return logtimes.line_times(fd, offset, data, at_line_start)
    finally:
        if fd is not None:
            os.close(fd)
