"""Paged API replies (job lists, nodes) built from items encoded once each.

A reply holds at most ``api_reply_bytes`` (NATS refuses a message over its max_payload), so a
long list goes out a page at a time. Each item is packed once (``codec.pack``) and the page is the
items' bytes spliced into the reply: sizing a page by encoding every item and then encoding the
reply again would encode each item twice (2,000 node records for `hfai nodes` at 1,000 nodes).
Items come from an iterator, so those after the page are never built: only the first that does
not fit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hfai.protocol.codec import Encoded, encode_packed, pack_array

# An array header of up to 2**32 items: 5 bytes at most, 1 for the empty array sized below.
_ARRAY_HEADER_GROWTH = 4


def fill_page(items: Iterable[bytes], budget_bytes: int) -> tuple[list[bytes], bool]:
    """The longest run of ``items`` (packed) whose bytes fit in ``budget_bytes``, at least one, so
    a page always makes progress; and whether items are left for another page."""
    page: list[bytes] = []
    used = 0
    for item in items:
        used += len(item)
        if used > budget_bytes and page:
            return page, True
        page.append(item)
    return page, False


def paged_reply(kind: type, field: str, items: Iterable[bytes], budget_bytes: int, **extra: Any) -> Encoded:
    """The encoded reply ``kind(field=<a page of items>, more=<items left>, **extra)`` of at most
    ``budget_bytes`` (unless its one item alone is larger)."""
    overhead = len(_reply(kind, field, [], True, extra).data) + _ARRAY_HEADER_GROWTH
    page, more = fill_page(items, budget_bytes - overhead)
    return _reply(kind, field, page, more, extra)


def _reply(kind: type, field: str, page: list[bytes], more: bool, extra: dict[str, Any]) -> Encoded:
    empty: dict[str, Any] = {field: ()}
    return encode_packed(kind(**empty, more=more, **extra), **{field: pack_array(page)})
