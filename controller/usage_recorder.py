"""Copies every ended run from the job records to the bucket ``hfai_usage`` and answers usage
requests from it (the I/O around :mod:`hfai.controller.usage`).

Every replica records (not only the leader): ``kv.create`` of the run's key is idempotent across
replicas, and a replica that missed a run while it was down finds it in the record's history as
long as the record is kept (``finished_retention_s``, 30 days by default)."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from hfai.controller.usage import merge, runs_of, usage_rows
from hfai.core import nats as _nats
from hfai.core.config import Config
from hfai.core.daemon import raise_if_cancelled
from hfai.kv import KVCache
from hfai.protocol import encode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import JobRecord, UsageEntry, UsageReply, UsageRequest, run_key

log = logging.getLogger(__name__)


async def usage_bucket(js: JetStreamContext, config: Config) -> KeyValue:
    """The usage bucket, created if missing (no TTL: usage is kept for good)."""
    return await _nats._bucket(js, names.BUCKET_USAGE, config.nats.replicas)


class UsageRecorder:
    def __init__(self, kv: KeyValue, jobs: KVCache[JobRecord], config: Config):
        self._kv = kv
        self._jobs = jobs
        self._config = config
        self.entries: KVCache[UsageEntry] = KVCache(kv, UsageEntry)
        # Keys known to be stored (written here or seen in the bucket), and records already looked at.
        self._looked: dict[str, tuple[int, str]] = {}

    async def start(self) -> None:
        await self.entries.start()

    async def run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.record_once()
            except (TimeoutError, nats.errors.Error) as e:
                log.warning("could not record usage now: %s", e or type(e).__name__)
            await asyncio.sleep(self._config.controller.usage_interval_s)

    async def record_once(self, now: float | None = None) -> int:
        """Store the ended runs not stored yet; returns how many were written."""
        now = time.time() if now is None else now
        written = 0
        for job in list(self._jobs.values.values()):
            seen = (job.run_id, job.state.value)
            if self._looked.get(job.id) == seen:
                continue
            for entry, ended in runs_of(job, now):
                key = run_key(entry.job_id, entry.run_id)
                if ended and key not in self.entries.values:
                    written += await self._store(key, entry)
            self._looked[job.id] = seen
        return written

    async def _store(self, key: str, entry: UsageEntry) -> int:
        try:
            rev = await self._kv.create(key, encode(entry))
        except nats.js.errors.KeyWrongLastSequenceError:
            return 0  # another replica stored it first
        self.entries.put_local(key, entry, rev)
        return 1

    def reply(self, req: UsageRequest, reply_bytes: int) -> UsageReply:
        now = time.time()
        until = req.until_ts or now
        if until <= req.since_ts:
            raise InvalidRequest("the usage period ends before it begins")
        entries = merge(self.entries.values.values(), self._jobs.values.values(), now)
        reply = UsageReply(rows=tuple(usage_rows(entries, req.since_ts, until)))
        if len(encode(reply)) > reply_bytes:
            raise InvalidRequest(f"{len(reply.rows)} usage rows do not fit in one reply; ask for fewer days")
        return reply

    async def stop(self) -> None:
        await self.entries.stop()
