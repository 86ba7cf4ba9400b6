"""Group setup: the node leader creates the arena, every rank learns its name and attaches,
and the node leaders get their own torch.distributed group for the inter-node step.

Failures reach every rank: a leader that cannot create its arena sends the error instead of a
name, so its peers raise rather than wait.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import torch.distributed as dist

from hfai.reduce import layout as L
from hfai.reduce.errors import ReduceError
from hfai.reduce.shm import Segment
from hfai.reduce.topology import Topology


def open_arena(topo: Topology, lay: L.ArenaLayout, pg) -> Segment:
    """Leader creates, everyone learns the name, the others attach. Errors reach every rank."""
    offer: str | tuple[str, str] | None = None
    segment = None
    if topo.is_leader:
        try:
            segment = Segment.create(lay.total_bytes)
            header = np.frombuffer(segment.mapping(), dtype=np.int64, count=lay.header_words)
            header[[L.G_MAGIC, L.G_VERSION, L.G_NRANKS, L.G_SLOT_BYTES]] = [
                L.MAGIC, L.VERSION, lay.nranks, lay.slot_bytes,
            ]
            offer = segment.name
        except OSError as e:
            offer = ("error", f"node leader could not create {lay.total_bytes} B of shm: {e}")
    offers: list = [None] * topo.world_size
    dist.all_gather_object(offers, offer, group=pg)
    mine = offers[topo.node_members[0]]
    if isinstance(mine, (tuple, list)):
        if segment is not None:
            segment.unlink()
        raise ReduceError(mine[1])
    if segment is None:
        segment = Segment.attach(mine)
        header = np.frombuffer(segment.mapping(), dtype=np.int64, count=L.HEADER_LINES_BEFORE_RANKS * 8)
        if int(header[L.G_MAGIC]) != L.MAGIC or int(header[L.G_SLOT_BYTES]) != lay.slot_bytes:
            raise ReduceError(
                "shared arena header does not match this rank's configuration; every rank must "
                "pass the same ReduceConfig"
            )
    return segment


def leaders_group(topo: Topology, pg, timeout_s: float, backend: str):
    if topo.num_nodes == 1:
        return None
    timeout = timedelta(seconds=timeout_s)
    if pg is dist.group.WORLD:
        # Every rank must call new_group; non-leaders get a non-member handle and ignore it.
        return dist.new_group(list(topo.leaders), timeout=timeout, backend=backend)
    if not topo.is_leader:
        return None
    ranks = [dist.get_global_rank(pg, r) for r in topo.leaders]
    return dist.new_group(
        ranks, timeout=timeout, backend=backend, use_local_synchronization=True
    )
