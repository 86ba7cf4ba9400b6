"""Why waiting jobs wait, as the leader publishes it to the API replicas: no I/O.

A wait reason is not kept in the job record (a change of reason for 20,000 waiting jobs would be
20,000 compare-and-set writes, and every replica would decode each): the leader keeps the current
ones in memory and publishes the changes, in batches, on the non-durable subject
:data:`hfai.protocol.names.WAITS_SUBJECT` (controller/waits.py). Only controller replicas send and
read these messages; importing this module registers them with the codec.
"""

from __future__ import annotations

from typing import ClassVar

from hfai.protocol.reasons import Reason
from hfai.protocol.types import message


@message("wait_note")
class WaitNote:
    """Why job ``job_id`` waits, worked out on its record at revision ``rev``: it holds while the
    record is at that revision or older (a newer record, a state change, says why itself)."""

    KIND: ClassVar[str]
    job_id: str
    rev: int
    why: Reason


@message("wait_notes")
class WaitNotes:
    """A batch of notes from the leader of term ``term`` (a replica ignores an older term's)."""

    KIND: ClassVar[str]
    term: int
    notes: tuple[WaitNote, ...] = ()
