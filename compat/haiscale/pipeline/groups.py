"""``make_subgroups``: the world cut into data-parallel and pipeline-parallel process groups."""

from __future__ import annotations

import torch.distributed as dist

from haiscale.pipeline.errors import PartitionError


def make_subgroups(pp_size: int, dp_size: int | None = None, group=None):
    """Return ``(dp_group, pp_group)`` for this rank. Collective: every rank of ``group``
    (default: the world) must call it, with the same arguments.

    Pipelines are runs of ``pp_size`` consecutive ranks (on a cluster: the GPUs of one node), so
    rank ``r`` is stage ``r % pp_size`` of pipeline ``r // pp_size``; a data-parallel group holds
    the ranks at the same stage of every pipeline. ``dp_size`` defaults to
    ``world_size // pp_size`` and, if given, must match it.
    """
    if not dist.is_initialized():
        raise PartitionError("make_subgroups needs torch.distributed; call init_process_group(...) first")
    world = dist.get_world_size(group)
    if pp_size < 1 or world % pp_size != 0:
        raise PartitionError(f"pp_size={pp_size} does not divide the world size {world}")
    if dp_size is None:
        dp_size = world // pp_size
    if dp_size * pp_size != world:
        raise PartitionError(f"dp_size={dp_size} * pp_size={pp_size} != world size {world}")
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    me = dist.get_rank()
    pp_group = dp_group = None
    # Every rank creates every group, in the same order: new_group is collective over the world.
    for p in range(dp_size):
        members = ranks[p * pp_size : (p + 1) * pp_size]
        g = dist.new_group(members)
        if me in members:
            pp_group = g
    for s in range(pp_size):
        members = ranks[s::pp_size]
        g = dist.new_group(members)
        if me in members:
            dp_group = g
    return dp_group, pp_group
