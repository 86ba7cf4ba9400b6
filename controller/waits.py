"""Why each waiting job waits, kept in memory by every controller replica, never in the job record.

The leader works the reasons out each explaining round (controller/plan.py ``Explain``) and
notes them here (:meth:`WaitBoard.note`); it publishes what changed in batches on a non-durable
subject, and everything it holds every ``full_every_s`` so a replica that started (or missed a
batch) meanwhile catches up (:meth:`WaitBoard.batches`). The other replicas take them in
(:meth:`WaitBoard.receive`) and every replica shows them in ``hfai ps`` and ``status``
(:meth:`WaitBoard.shown`). So a change of reason for 20,000 waiting jobs costs a few messages, not
20,000 compare-and-set writes that every replica would then decode.

A note holds for the record revision it was worked out on, or an older one: once the record
changes (it started, was held, updated, suspended again), the record's own reason, written with
that change, is shown until the leader notes a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hfai.protocol import decode
from hfai.protocol import waits as _waits  # noqa: F401  (registers the messages)
from hfai.protocol.codec import Encoded, encode_packed, pack, pack_array
from hfai.protocol.errors import ProtocolError
from hfai.protocol.reasons import Reason
from hfai.protocol.types import JobRecord, evolve
from hfai.protocol.waits import WaitNote, WaitNotes

log = logging.getLogger(__name__)

#: Bytes a batch's header and array length take beyond its notes, at most.
_BATCH_OVERHEAD = 64


class WaitBoard:
    """job id -> (record revision, reason). ``revisions`` is the replica's live map of job record
    revisions (its jobs KV copy's): notes of jobs gone or changed since are dropped as they pile up."""

    def __init__(self, revisions: Mapping[str, int]):
        self._revisions = revisions
        self.notes: dict[str, tuple[int, Reason]] = {}
        self.term = 0  # the newest term whose notes this board holds
        self._dirty: set[str] = set()  # noted since the last take() (the leader's side)
        self._prune_at = 1024

    # -- the leader's side

    def note(self, job_id: str, rev: int, why: Reason) -> None:
        """``why`` is why the job waits, worked out on its record at revision ``rev``."""
        self.notes[job_id] = (rev, why)
        self._dirty.add(job_id)

    def restamp(self, job_id: str, old_rev: int, new_rev: int) -> None:
        """The record at ``old_rev`` was rewritten at ``new_rev`` without changing why it waits
        (a new term's stamp): a note that held for it holds for the new revision."""
        held = self.notes.get(job_id)
        if held is not None and held[0] >= old_rev:
            self.note(job_id, new_rev, held[1])

    def take(self, full: bool = False) -> list[tuple[str, int, Reason]]:
        """The notes made since the last call (``full``: every note that still holds), as
        (job id, revision, reason): a snapshot :func:`pack_batches` may pack in another thread."""
        self._prune()
        dirty, self._dirty = self._dirty, set()
        notes = self.notes
        keys = notes.keys() if full else (k for k in dirty if k in notes)
        return [(k, *notes[k]) for k in keys]

    def batches(self, term: int, budget_bytes: int, full: bool = False) -> list[Encoded]:
        """:meth:`take`, packed as ``WaitNotes`` messages of at most ``budget_bytes`` each."""
        return pack_batches(term, self.take(full), budget_bytes)

    # -- every replica's side

    def receive(self, data: bytes) -> int:
        """Take in a batch the leader published; returns how many notes it applied (an older
        term's batch, or an unreadable one, none)."""
        try:
            batch = decode(data, WaitNotes)
        except ProtocolError as e:
            log.warning("ignoring an unreadable batch of wait reasons: %s", e)
            return 0
        if batch.term < self.term:
            return 0  # a deposed leader's, late
        self.term = batch.term
        for n in batch.notes:
            held = self.notes.get(n.job_id)
            if held is None or n.rev >= held[0]:
                self.notes[n.job_id] = (n.rev, n.why)
        if len(self.notes) >= self._prune_at:
            self._prune()
        return len(batch.notes)

    def why(self, job_id: str, rev: int) -> Reason | None:
        """The noted reason of the job whose record is at revision ``rev``; None: none holds."""
        held = self.notes.get(job_id)
        return held[1] if held is not None and held[0] >= rev else None

    def shown(self, job: JobRecord, rev: int | None = None) -> JobRecord:
        """``job`` with its noted reason, if one holds for it (``rev``: its record's revision,
        by default the one this replica's copy holds)."""
        if not job.state.waiting:
            return job
        why = self.why(job.id, self._revisions.get(job.id, 0) if rev is None else rev)
        return job if why is None or why == job.why else evolve(job, why=why, reason=why.text())

    def _prune(self) -> None:
        """Forget notes that hold no more (their job gone, or its record changed since)."""
        revs = self._revisions
        stale = [k for k, (rev, _) in self.notes.items() if rev < revs.get(k, 1 << 62)]
        for k in stale:
            del self.notes[k]
        self._prune_at = max(1024, 2 * len(self.notes))


def pack_batches(term: int, notes: list[tuple[str, int, Reason]], budget_bytes: int) -> list[Encoded]:
    """``notes`` as ``WaitNotes`` messages of term ``term``, each of at most ``budget_bytes``
    (pure: the leader runs it in a thread). A reason many jobs share is packed once."""
    shared: dict[tuple, bytes] = {}
    out: list[Encoded] = []
    page: list[bytes] = []
    used = _BATCH_OVERHEAD
    for job_id, rev, why in notes:
        key = (why.code, *why.params.items())
        packed_why = shared.get(key)
        if packed_why is None:
            packed_why = shared[key] = pack(why)
        item = pack(WaitNote(job_id=job_id, rev=rev, why=why), why=packed_why)
        if page and used + len(item) > budget_bytes:
            out.append(_batch(term, page))
            page, used = [], _BATCH_OVERHEAD
        page.append(item)
        used += len(item)
    if page:
        out.append(_batch(term, page))
    return out


def _batch(term: int, page: list[bytes]) -> Encoded:
    return encode_packed(WaitNotes(term=term), notes=pack_array(page))
