"""Which ranks share a node, and who leads each node.

:func:`from_node_keys` decides (pure); :func:`discover` gathers every rank's node key through
``torch.distributed`` and calls it. Ranks with equal keys share a node; nodes are ordered by their
lowest rank and local ranks by global rank, so every rank derives the same answer.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    """This rank's place in the group. Ranks are ranks *of the process group* used."""

    rank: int
    world_size: int
    node_rank: int
    local_rank: int
    #: group ranks on this node, in local-rank order
    node_members: tuple[int, ...]
    #: group rank of local rank 0 of every node, in node order
    leaders: tuple[int, ...]

    @property
    def local_size(self) -> int:
        return len(self.node_members)

    @property
    def num_nodes(self) -> int:
        return len(self.leaders)

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0


def from_node_keys(keys: Sequence[str], rank: int) -> Topology:
    """Build the topology seen by ``rank`` from every rank's node key (``keys[r]``)."""
    if not 0 <= rank < len(keys):
        raise ValueError(f"rank {rank} out of range for {len(keys)} keys")
    nodes: dict[str, list[int]] = {}
    for r, key in enumerate(keys):
        nodes.setdefault(key, []).append(r)
    ordered = sorted(nodes.values(), key=lambda members: members[0])
    node_rank = next(i for i, m in enumerate(ordered) if rank in m)
    members = tuple(ordered[node_rank])
    return Topology(
        rank=rank,
        world_size=len(keys),
        node_rank=node_rank,
        local_rank=members.index(rank),
        node_members=members,
        leaders=tuple(m[0] for m in ordered),
    )


def default_node_key() -> str:
    """The hostname plus the kernel boot id: equal exactly when two ranks can share /dev/shm."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def discover(process_group, node_key: str | None = None) -> Topology:
    """Collective over ``process_group``: gather node keys and return this rank's topology.

    ``node_key`` overrides the detected key; tests use it to simulate several nodes on one host.
    """
    import torch.distributed as dist

    keys: list[str | None] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(keys, node_key or default_node_key(), group=process_group)
    return from_node_keys([str(k) for k in keys], dist.get_rank(process_group))
