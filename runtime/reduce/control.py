"""The control block: barriers, abort and liveness over the arena header.

A barrier is a generation counter per rank: a rank stores ``gen + 1`` into its own header word,
then waits until every rank's word reaches that value. A rank never waits forever: each wait has
a deadline (``timeout_s``), checks the shared abort word every poll, and every
``liveness_interval_s`` checks that the peers it waits for are still running processes, so a
killed peer is reported in a fraction of a second rather than at the timeout.

Ordering relies on the store order of x86-64 (TSO): data written before the generation store is
visible to a rank that has seen the store. The Python-level calls between them (numpy, the
interpreter's own locking) act as compiler barriers; on weakly ordered CPUs (aarch64) a real fence
would be needed here, so ``ReduceGroup.create`` refuses to share an arena there (docs/reduce.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from hfai.reduce import layout as L
from hfai.reduce import shm
from hfai.reduce.errors import GroupAbortedError, PeerDiedError, PeerTimeoutError

_ABORT_REASONS = {
    L.ABORT_ERROR: "an error on that rank",
    L.ABORT_SIZE_MISMATCH: "ranks disagreeing on sizes, dtypes or ops",
    L.ABORT_PEER: "a dead or unresponsive peer",
    L.ABORT_INTER_NODE: "a failed inter-node all-reduce",
}


@dataclass(frozen=True)
class WaitPolicy:
    """How a rank waits for its peers. All values are seconds.

    ``timeout_s`` bounds every wait; ``spin_s`` is how long a waiter polls with only a yield
    between polls before it starts sleeping ``sleep_s`` per poll (spinning is right while peers
    are a few microseconds away, wrong when ranks outnumber cores); ``liveness_interval_s`` is the
    period of the peer-process check.
    """

    timeout_s: float = 300.0
    spin_s: float = 0.002
    sleep_s: float = 50e-6
    liveness_interval_s: float = 0.1

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


class Control:
    """Barrier, abort flag and descriptor exchange for one local rank of an arena."""

    def __init__(
        self, header: np.ndarray, lay: L.ArenaLayout, local_rank: int, policy: WaitPolicy
    ) -> None:
        self._h = header
        self._lay = lay
        self.local_rank = local_rank
        self.policy = policy
        self._gen_idx = np.array([lay.rank_word(r, L.R_GEN) for r in range(lay.nranks)])
        self._gen = int(header[lay.rank_word(local_rank, L.R_GEN)])
        self._check_pid_liveness = False

    # --- setup -------------------------------------------------------------------------------

    def publish_identity(self) -> None:
        """Record this process (pid + start time) and mark the rank attached."""
        pid = os.getpid()
        self._set(L.R_PID, pid)
        self._set(L.R_START_TIME, shm.process_start_time(pid))
        self._set(L.R_ATTACHED, 1)

    def wait_attached(self) -> None:
        """Wait until every local rank has published its identity (used before unlinking)."""
        words = [self._lay.rank_word(r, L.R_ATTACHED) for r in range(self._lay.nranks)]
        self._wait(lambda: [r for r, w in enumerate(words) if self._h[w] != 1], "attach")

    def enable_liveness_checks(self) -> bool:
        """Turn on pid checks if every peer's pid is visible from here (same PID namespace)."""
        self._check_pid_liveness = all(
            shm.process_start_time(self._peer_pid(r)) == self._peer_start(r)
            for r in range(self._lay.nranks)
        )
        return self._check_pid_liveness

    # --- collective steps --------------------------------------------------------------------

    def barrier(self, what: str = "barrier", timeout_s: float | None = None) -> None:
        """Wait until every local rank has reached the same barrier (``timeout_s`` overrides
        the policy's timeout for this one wait)."""
        self._gen += 1
        target = self._gen
        self._set(L.R_GEN, target)
        gens = self._gen_idx

        def missing() -> list[int]:
            return np.flatnonzero(self._h[gens] < target).tolist()

        self._wait(missing, what, timeout_s)

    def publish_descriptor(self, desc: tuple[int, ...]) -> None:
        base = self._lay.rank_word(self.local_rank, L.R_DESC_SEQ)
        self._h[base : base + L.DESC_WORDS] = desc

    def descriptors(self) -> list[tuple[int, ...]]:
        """Every rank's descriptor; only meaningful after a barrier that follows publishing."""
        out = []
        for r in range(self._lay.nranks):
            base = self._lay.rank_word(r, L.R_DESC_SEQ)
            out.append(tuple(int(x) for x in self._h[base : base + L.DESC_WORDS]))
        return out

    # --- abort -------------------------------------------------------------------------------

    def abort(self, code: int) -> None:
        """Mark the arena aborted; every waiting or later peer raises ``GroupAbortedError``."""
        if not self._h[L.G_ABORT]:
            self._h[L.G_ABORT_RANK] = self.local_rank
            self._h[L.G_ABORT_CODE] = code
            self._h[L.G_ABORT] = 1

    def check_abort(self) -> None:
        if self._h[L.G_ABORT]:
            rank, code = int(self._h[L.G_ABORT_RANK]), int(self._h[L.G_ABORT_CODE])
            reason = _ABORT_REASONS.get(code, f"code {code}")
            raise GroupAbortedError(
                f"the reduce group was aborted by local rank {rank} because of {reason}; "
                "it cannot be used any more"
            )

    # --- internals ---------------------------------------------------------------------------

    def _set(self, field: int, value: int) -> None:
        self._h[self._lay.rank_word(self.local_rank, field)] = value

    def _peer_pid(self, r: int) -> int:
        return int(self._h[self._lay.rank_word(r, L.R_PID)])

    def _peer_start(self, r: int) -> int:
        return int(self._h[self._lay.rank_word(r, L.R_START_TIME)])

    def _dead(self, ranks: list[int]) -> list[int]:
        return [
            r
            for r in ranks
            if self._peer_pid(r)
            and (
                not shm.pid_alive(self._peer_pid(r))
                or shm.process_start_time(self._peer_pid(r)) != self._peer_start(r)
            )
        ]

    def _wait(self, missing, what: str, timeout_s: float | None = None) -> None:
        p = self.policy
        timeout = p.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        next_liveness = start + p.liveness_interval_s
        while True:
            waiting = missing()
            if not waiting:
                return  # arrived peers win over an abort raised after they arrived
            self.check_abort()
            now = time.monotonic()
            if now >= next_liveness:
                next_liveness = now + p.liveness_interval_s
                dead = self._dead(waiting) if self._check_pid_liveness else []
                if dead:
                    self.abort(L.ABORT_PEER)
                    raise PeerDiedError(
                        f"local rank(s) {dead} exited while local rank {self.local_rank} "
                        f"waited for them at {what!r}"
                    )
            if now - start >= timeout:
                self.abort(L.ABORT_PEER)
                raise PeerTimeoutError(
                    f"local rank(s) {waiting} did not reach {what!r} within {timeout:g} s; "
                    "check that every rank makes the same collective calls, or raise the timeout"
                )
            if now - start < p.spin_s:
                os.sched_yield()
            else:
                time.sleep(p.sleep_s)
