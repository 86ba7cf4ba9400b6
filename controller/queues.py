"""The live jobs as the policy reads them, kept between scheduling rounds.

A round must not cost O((W + R) log(W + R)) for W waiting and R running jobs, as rebuilding and
sorting every job would (an overloaded trace's replay, whose queue grows to tens of thousands,
would crawl). So :class:`JobIndex` is updated per changed job
(:meth:`JobIndex.put`, :meth:`JobIndex.discard`) and keeps, per node group:

* waiting jobs per *effective* priority level (a waiting job's level cannot change while it
  waits: ABOVE_NORMAL decays only with running time), each level split by the fewest nodes a job
  can run on, every list in the policy's queue order (``key``, then id). A round then
  looks only at the jobs that could get nodes at all (a level whose jobs all need more nodes than
  could be freed for them is skipped in O(1) per size) — the cost follows what changes, not the
  length of the queue;
* running jobs and jobs in their interrupt window (R is at most the number of nodes);
* who holds each node, and nodes held per (user, declared priority, group) for quotas.

It holds no clock and does no I/O: the same index serves the leader, which feeds it the records
that changed, and the simulator. ``tests/test_plan.py`` checks that an index kept up to date over
many rounds decides exactly what one built from scratch does.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from hfai.protocol.types import ChainState, Priority

if TYPE_CHECKING:
    from hfai.controller.policy.views import JobView, NodeView

Key = tuple[float, str]  # queue order: (the ordering's key, job id)
#: A list's place in a walk: (its key there, size, user, the list, index of that key); the keys
#: are unique, so these order by the key alone.
_Head = tuple[Key, int, str, list[Key], int]

_ABOVE_NORMAL, _NORMAL = Priority.ABOVE_NORMAL.value, Priority.NORMAL.value
_QUEUED, _SUSPENDED, _RUNNING = ChainState.QUEUED, ChainState.SUSPENDED, ChainState.RUNNING
_SUSPENDING, _STOPPING = ChainState.SUSPENDING, ChainState.STOPPING


class Level:
    """Waiting jobs of one group and one effective priority, in lists per (size, user): a round
    passes over the jobs that cannot get nodes, and those of a user who may not go ahead, a list
    at a time rather than a job at a time."""

    def __init__(self) -> None:
        self.views: dict[str, JobView] = {}
        self.lists: dict[tuple[int, str], list[Key]] = {}  # (job.lo, user) -> keys in queue order
        self.by_user: dict[str, list[Key]] = {}  # user -> keys in queue order
        # The lists' heads per size, each sorted (so already a heap): a walk starts from these
        # instead of going over every list (a list's head changes far less often than rounds run).
        self.heads: dict[int, list[_Head]] = {}

    def __len__(self) -> int:
        return len(self.views)

    def add(self, key: Key, view: JobView) -> None:
        self.views[view.id] = view
        size, user = view.lo, view.user
        keys = self.lists.get((size, user))
        if keys is None:
            keys = self.lists[size, user] = [key]
            bisect.insort(self.heads.setdefault(size, []), (key, size, user, keys, 0))
        else:
            head = keys[0]
            bisect.insort(keys, key)
            if key < head:
                self._new_head(head, size, user, keys)
        bisect.insort(self.by_user.setdefault(user, []), key)

    def remove(self, key: Key, view: JobView) -> None:
        del self.views[view.id]
        size, user = view.lo, view.user
        keys = self.lists[size, user]
        head = keys[0]
        _remove(self.lists, (size, user), key)
        if key == head:
            self._new_head(head, size, user, keys)
        _remove(self.by_user, user, key)

    def _new_head(self, old: Key, size: int, user: str, keys: list[Key]) -> None:
        """The list of (``size``, ``user``) had head ``old``: its entry in ``heads`` follows its
        new head (or leaves with the list, if it is empty now)."""
        heads = self.heads[size]
        del heads[bisect.bisect_left(heads, (old,))]  # (old,) sorts just before (old, size, ...)
        if keys:
            bisect.insort(heads, (keys[0], size, user, keys, 0))
        elif not heads:
            del self.heads[size]

    def keys_in_order(self) -> Iterator[Key]:
        """Every job's key, in queue order (a merge of the sorted lists)."""
        return heapq.merge(*self.lists.values())

    def in_order(self) -> Iterator[JobView]:
        for _, job_id in self.keys_in_order():
            yield self.views[job_id]

    def fitting(self, cap: Callable[[], int],
                drops: Callable[[JobView, Key], int | None] | None = None) -> Iterator[tuple[JobView | None, bool]]:
        """The jobs in queue order that could get nodes, each with whether a job left out was
        passed over ahead of it; last ``(None, passed)`` for the rest.

        Without ``drops``, the jobs that need at most ``cap()`` nodes (asked again when a job's
        turn comes; it may only shrink). With it, ``drops(job, key)`` decides when the job's turn
        comes (``cap()`` only filters the lists at the start): None lets the job through, a number
        ``k`` leaves out the user's jobs of at least ``k`` nodes from then on (``k <= job.lo``; 0:
        all of the user's jobs) — the caller answers for their being left out at their turn too.

        The lists' heads sit in a heap: each step looks only at the earliest head, and a list
        left out is dropped for good. Heads come off in queue order, so every list dropped so far
        was ahead of whatever is found next: O(log lists) a step, whatever the number of users
        and sizes."""
        if drops is None:
            yield from self._fitting_by_size(cap)
            return
        c = cap()
        heap: list[_Head] = []
        ahead: Key | None = None  # the earliest head of the lists left out from the start
        for size, heads in self.heads.items():
            if size <= c:
                heap += heads
            elif ahead is None or heads[0][0] < ahead:
                ahead = heads[0][0]
        heapq.heapify(heap)
        views = self.views
        passed = False  # a list was dropped on the way (its head was ahead of all that follow)
        out_from: dict[str, int] = {}  # user -> their lists of at least this size are left out
        while heap:
            key, size, user, keys, i = heap[0]
            out = out_from.get(user)
            if out is None or size < out:
                k = drops(views[key[1]], key)
                if k is None:  # it goes through
                    if i + 1 < len(keys):
                        heapq.heapreplace(heap, (keys[i + 1], size, user, keys, i + 1))
                    else:
                        heapq.heappop(heap)
                    yield views[key[1]], passed or (ahead is not None and ahead < key)
                    continue
                if out is None or k < out:
                    out_from[user] = k
            heapq.heappop(heap)  # left out
            passed = True
        yield None, passed or ahead is not None

    def _fitting_by_size(self, cap: Callable[[], int]) -> Iterator[tuple[JobView | None, bool]]:
        """:meth:`fitting` without ``drops``: the lists' heads in one heap per size, so when the
        cap falls below a size all of its lists leave at once (the cap only shrinks: each would
        be left out at its turn), and a step is a minimum over the few sizes still in."""
        c = cap()
        by_size: dict[int, list[_Head]] = {}  # copies: the walk pops them
        ahead: Key | None = None  # the earliest head of the lists left out
        for size, heads in self.heads.items():
            if size <= c:
                by_size[size] = heads.copy()  # sorted: a heap already
            elif ahead is None or heads[0][0] < ahead:
                ahead = heads[0][0]
        sizes = sorted(by_size)
        views = self.views
        while True:
            c = cap()
            while sizes and sizes[-1] > c:
                top = by_size.pop(sizes.pop())[0][0]
                if ahead is None or top < ahead:
                    ahead = top
            if not sizes:
                break
            heap = min(by_size.values())  # lists compare by their first entries: the earliest head's
            key, size, user, keys, i = heap[0]
            if i + 1 < len(keys):
                heapq.heapreplace(heap, (keys[i + 1], size, user, keys, i + 1))
            else:
                heapq.heappop(heap)
                if not heap:
                    del by_size[size]
                    sizes.remove(size)
            # A list left out was passed over if its head is ahead of this job.
            yield views[key[1]], ahead is not None and ahead < key
        yield None, ahead is not None

    def user_head(self, user: str) -> Key | None:
        """The key of the user's first job in line at this level."""
        keys = self.by_user.get(user)
        return keys[0] if keys else None


def _remove(lists: dict, k, key: Key) -> None:
    keys = lists[k]
    i = bisect.bisect_left(keys, key)
    if i < len(keys) and keys[i] == key:
        del keys[i]
    if not keys:
        del lists[k]


@dataclass
class GroupJobs:
    """The live jobs of one node group, by what they mean to the scheduler."""

    levels: dict[int, Level] = field(default_factory=dict)  # effective priority -> waiting jobs
    running: dict[str, JobView] = field(default_factory=dict)
    leaving: dict[str, JobView] = field(default_factory=dict)  # suspending or stopping
    growable: int = 0  # running elastic jobs below their maximum size

    @property
    def waiting(self) -> int:
        return sum(len(level) for level in self.levels.values())


class _Where(NamedTuple):  # one per put: a tuple is built several times faster than a frozen dataclass
    view: JobView
    group: str
    kind: str  # "waiting", "running", "leaving"
    level: int = 0
    key: Key = (0.0, "")


class NodeLayout:
    """A node list as a round reads it: the names of the schedulable nodes per group, sorted
    (every group with a node has an entry, maybe empty)."""

    def __init__(self, nodes: Iterable[NodeView]):
        self.nodes = nodes
        self.usable: dict[str, list[str]] = {}
        for n in nodes:
            names = self.usable.setdefault(n.group, [])
            if n.schedulable:
                names.append(n.name)
        for names in self.usable.values():
            names.sort()


class Ordering:
    """How a policy lines up waiting jobs: ``level(view)`` (higher levels go first) and
    ``key(view)`` (earlier first within a level). Both may depend only on what cannot change
    while the job waits. ``signature`` names the ordering and its settings: an index built for
    another signature is rebuilt, never misread."""

    def __init__(self, signature: tuple, level: Callable[[JobView], int], key: Callable[[JobView], float]):
        self.signature = signature
        self.level = level
        self.key = key


def priority_ordering(above_normal_s: float, key: Callable[[JobView], float], signature: tuple) -> Ordering:
    """Levels by effective priority (ABOVE_NORMAL that ran ``above_normal_s`` counts as NORMAL),
    ``key`` within a level (the policy's)."""

    def level(v: JobView) -> int:
        return _NORMAL if v.priority == _ABOVE_NORMAL and v.run_s >= above_normal_s else v.priority

    return Ordering(("priority", above_normal_s, *signature), level, key)


class JobIndex:
    """See the module docstring; ``ordering`` decides the levels and the queue order."""

    def __init__(self, ordering: Ordering):
        self.ordering = ordering
        self.signature = ordering.signature
        self.groups: dict[str, GroupJobs] = {}
        self._where: dict[str, _Where] = {}
        self.holder: dict[str, str] = {}  # node -> id of the job holding it (running or leaving)
        self.used: dict[tuple[str, int, str], int] = {}  # (user, declared priority, group) -> nodes held
        self._holders_changed = 0  # bumps whenever ``holder`` changes: the free-node cache's key
        # A policy's own memos of what depends only on the jobs holding nodes and the clock (keyed
        # by holders_changed, which also bumps when such a job's view changes).
        self.memo: dict[object, tuple] = {}
        self._layout: NodeLayout | None = None
        self._free: tuple[NodeLayout, int, dict[str, list[str]]] | None = None

    @classmethod
    def of(cls, views: Iterable[JobView], ordering: Ordering) -> JobIndex:
        index = cls(ordering)
        for v in views:
            index.put(v)
        return index

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._where

    def get(self, job_id: str) -> JobView | None:
        w = self._where.get(job_id)
        return w.view if w is not None else None

    def views(self) -> Iterator[JobView]:
        return (w.view for w in self._where.values())

    def __iter__(self) -> Iterator[JobView]:
        """The live jobs, like the list a simple policy takes."""
        return self.views()

    @property
    def holders_changed(self) -> int:
        """A count that changes whenever a job holding nodes comes, goes or changes."""
        return self._holders_changed

    def layout(self, nodes: Iterable[NodeView]) -> NodeLayout:
        """The usable nodes per group; worked out again only for another node list (the simulator, and
        the planner while the nodes do not change, pass the same list object every round)."""
        if self._layout is None or self._layout.nodes is not nodes:
            self._layout = NodeLayout(nodes)
        return self._layout

    def free_nodes(self, nodes: Iterable[NodeView]) -> dict[str, list[str]]:
        """Schedulable nodes no job holds, per group, sorted by name. Kept until the node list
        or a holder changes, and shared: callers read these lists, never change them."""
        layout = self.layout(nodes)
        cached = self._free
        if cached is not None and cached[0] is layout and cached[1] == self._holders_changed:
            return cached[2]
        holder = self.holder
        free = {group: [n for n in names if n not in holder] for group, names in layout.usable.items()}
        self._free = (layout, self._holders_changed, free)
        return free

    def put(self, view: JobView) -> None:
        """Add the job or replace what the index knew of it; a job in no live state leaves."""
        self.discard(view.id)
        s = view.state
        if s is _QUEUED or s is _SUSPENDED:
            kind = "waiting"
        elif s is _RUNNING:
            kind = "running"
        elif s is _SUSPENDING or s is _STOPPING:
            kind = "leaving"
        else:
            return
        g = self.groups.get(view.group)
        if g is None:
            g = self.groups[view.group] = GroupJobs()
        if kind == "waiting":
            p = self.ordering.level(view)
            key = (self.ordering.key(view), view.id)
            level = g.levels.get(p)
            if level is None:
                level = g.levels[p] = Level()
            level.add(key, view)
            self._where[view.id] = _Where(view, view.group, kind, p, key)
            return
        if kind == "running":
            g.running[view.id] = view
            if view.max_nodes > len(view.held):
                g.growable += 1
        else:
            g.leaving[view.id] = view
        for n in view.held:
            self.holder[n] = view.id
        self._holders_changed += 1
        ukey = (view.user, view.priority, view.group)
        self.used[ukey] = self.used.get(ukey, 0) + len(view.held)
        self._where[view.id] = _Where(view, view.group, kind)

    def discard(self, job_id: str) -> None:
        w = self._where.pop(job_id, None)
        if w is None:
            return
        g = self.groups[w.group]
        v = w.view
        if w.kind == "waiting":
            level = g.levels[w.level]
            level.remove(w.key, v)
            if not level:
                del g.levels[w.level]
        else:
            if w.kind == "running":
                del g.running[job_id]
                if v.max_nodes > len(v.held):
                    g.growable -= 1
            else:
                del g.leaving[job_id]
            for n in v.held:
                if self.holder.get(n) == job_id:
                    del self.holder[n]
            self._holders_changed += 1
            ukey = (v.user, v.priority, v.group)
            left = self.used[ukey] - len(v.held)
            if left:
                self.used[ukey] = left
            else:
                del self.used[ukey]
        if not g.levels and not g.running and not g.leaving:
            del self.groups[w.group]
