"""Compare-and-set writes of KV values: read-modify-write that retries lost races."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import nats.js.errors
from nats.js.kv import KeyValue

from hfai.protocol import decode, encode
from hfai.protocol.errors import Conflict, NotFound
from hfai.protocol.types import JobRecord

T = TypeVar("T")


async def cas_update(kv: KeyValue, key: str, change: Callable[[JobRecord], JobRecord | None],
                     attempts: int = 8, cached: tuple[JobRecord, int] | None = None) -> tuple[JobRecord, int, bool]:
    """Read-modify-write one job record with compare-and-set, retrying lost races (see
    :func:`cas_value`). Returns (record, revision, changed); NotFound if there is no such job."""
    return await cas_value(kv, key, JobRecord, change, what="job", attempts=attempts, cached=cached)


async def cas_value(kv: KeyValue, key: str, kind: type[T], change: Callable[[T], T | None], *, what: str,
                    missing: Callable[[], T] | None = None,
                    lost_race: tuple[type[Exception], ...] = (nats.js.errors.KeyWrongLastSequenceError,),
                    attempts: int = 8, cached: tuple[T, int] | None = None) -> tuple[T, int, bool]:
    """Read-modify-write the ``kind`` message at ``key`` with compare-and-set, retrying lost races:
    the one implementation, for job records and the operators' settings.

    A missing key raises NotFound ("no <what> <key>"), unless ``missing`` makes its first value:
    the key is then created (revision 0 in the result if nothing was written). ``lost_race``: the
    write errors that mean another writer came first. Returns (value, revision, changed).
    ``change`` must be pure: it may run several times; returning None changes nothing.

    ``cached``: the value and revision a live copy holds (KVCache). The first attempt writes the
    change of that value without reading the key, and the compare-and-set on its revision makes
    sure it was still current; the leader saves a round trip on nearly every write. A change that
    is None on the cached value is confirmed on a fresh read: a copy that lags (a new leader's,
    say) must not drop an event that the current record would take.
    """
    for _ in range(attempts):
        if cached is not None:
            (current, last), cached = cached, None
            new = change(current)
            if new is not None and last:
                try:
                    return new, await kv.update(key, encode(new), last=last), True
                except lost_race:
                    pass  # the copy was behind: read the key
        try:
            entry = await kv.get(key)
            # nats-py types revision Optional; an entry read from the bucket always has one.
            current, last = decode(entry.value, kind), entry.revision or 0
        except nats.js.errors.KeyNotFoundError:
            if missing is None:
                raise NotFound(f"no {what} {key}") from None
            current, last = missing(), 0
        new = change(current)
        if new is None:
            return current, last, False
        try:
            rev = await (kv.update(key, encode(new), last=last) if last else kv.create(key, encode(new)))
        except lost_race:
            continue
        return new, rev, True
    raise Conflict(f"{what} {key} is changing too fast; try again")
