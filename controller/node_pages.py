"""`hfai nodes` reply pages, each node's heartbeat record encoded once.

A node's record (a kilobyte and more, costly to encode) changes only with its heartbeat, while its
state, age and jobs change with time: the record's bytes are kept while it is the node's current
record and spliced into each page (codec.pack), and only a page's own nodes are looked at.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable

from hfai.controller.nodes import NodeTracker, jobs_on_nodes
from hfai.controller.paging import paged_reply
from hfai.protocol.codec import Encoded, pack
from hfai.protocol.types import JobRecord, NodeRecord, NodesReply, StoreHealth


class NodePages:
    def __init__(self, tracker: NodeTracker):
        self._tracker = tracker
        # KV key -> (its record, that record packed). The record object itself is the key: the
        # heartbeat cache makes a new one for every revision it takes, and holding it keeps its
        # identity from being reused.
        self._packed: dict[str, tuple[NodeRecord, bytes]] = {}
        self.records_packed = 0  # how many records were encoded (tests count them)

    def page(self, after: str, jobs: Iterable[JobRecord], budget_bytes: int,
             store: StoreHealth | None = None) -> Encoded:
        """The encoded ``NodesReply`` of the nodes named after ``after``, by name, as many as fit,
        with the NATS store's health ``store``."""
        t = self._tracker
        records = t.cache.values
        if len(self._packed) > len(records):  # nodes were forgotten
            self._packed = {k: v for k, v in self._packed.items() if k in records}
        now = time.monotonic()
        on_node = jobs_on_nodes(jobs)
        drained = t.drained()
        # By the name in the record, as the client asks for the page after a record's name (an
        # agent writes its record at its own name's key, but a key is not the record's word).
        entries = sorted(records.items(), key=lambda kv: kv[1].name)
        start = bisect.bisect_right([r.name for _, r in entries], after)
        items = (pack(t.info(r, now, on_node, drained), record=self._record(key, r)) for key, r in entries[start:])
        return paged_reply(NodesReply, "nodes", items, budget_bytes, store=store)

    def _record(self, key: str, record: NodeRecord) -> bytes:
        kept = self._packed.get(key)
        if kept is not None and kept[0] is record:
            return kept[1]
        data = pack(record)
        self._packed[key] = (record, data)
        self.records_packed += 1
        return data
