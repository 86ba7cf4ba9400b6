"""What the agent deletes on its own node: the logs of jobs gone long enough, and the trash.

Two loops, each owned by the agent's supervisor: the log clean-up every ``[agent]
log_gc_interval_s`` (which logs go is :func:`hfai.agent.plan.stale_logs`, pure), and the trash,
woken whenever :meth:`RunStore.cleanup` moved a run's directories aside, which empties it in a
thread so the event loop goes on starting and reporting runs meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from hfai.agent.plan import stale_logs
from hfai.agent.runs import RunStore
from hfai.core.clock import Clock
from hfai.core.daemon import raise_if_cancelled

log = logging.getLogger(__name__)


class Cleanup:
    def __init__(self, store: RunStore, clock: Clock, log_retention_s: float, log_gc_interval_s: float):
        self.store = store
        self.clock = clock
        self.log_retention_s = log_retention_s
        self.log_gc_interval_s = log_gc_interval_s
        self._trash = asyncio.Event()  # set when a run's directories were moved to the trash

    def trashed(self) -> None:
        """A run's directories were moved to the trash: empty it soon."""
        self._trash.set()

    async def log_loop(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                self.collect_old_logs()
            except OSError as e:
                log.warning("log clean-up failed: %s", e)
            await self.clock.sleep(self.log_gc_interval_s)

    def collect_old_logs(self, now: float | None = None) -> list[str]:
        """Delete the log folders :func:`stale_logs` picks; returns their job ids."""
        jobs_here = {run.assignment.job_id for run in self.store.snapshot().values()}
        gone = stale_logs(self.store.log_last_writes(), jobs_here, self.clock.time() if now is None else now,
                          self.log_retention_s)
        for job_id in gone:
            self.store.remove_logs(job_id)
            log.info("removed the logs of job %s (nothing written for %gs)", job_id, self.log_retention_s)
        return gone

    async def trash_loop(self) -> None:
        """Delete the directories of forgotten runs in a thread; first what an earlier agent left there."""
        while True:
            raise_if_cancelled()
            try:
                await asyncio.to_thread(self.store.empty_trash)
            except OSError as e:
                log.warning("emptying the trash failed: %s", e)
            await self._trash.wait()
            self._trash.clear()
