"""Job arrays as a whole, for the CLI and the web page: ``hfai status/stop/hold/release/update``
take an array's id (``HFAI_ARRAY_ID``) or its name (``sweep`` for the members ``sweep[0]``, ...)
wherever they take a job, and several jobs at once.

A reference is looked up as the controller looks up a job first (an id, else a name); only when
no job has it is it matched against the arrays of the listed jobs, so a plain id costs what it
always did. Members come in index order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import InvalidRequest, NotFound
from hfai.protocol.types import JobRecord


@frozen_dataclass  # made at first use (hfai.protocol._lazy), not at every command's import
class Target:
    """What one reference on the command line means: one job, or an array's members."""

    ref: str
    jobs: tuple[JobRecord, ...]
    array_id: str = ""  # set when ``ref`` named a job array

    @property
    def is_array(self) -> bool:
        return bool(self.array_id)


def array_name(job: JobRecord) -> str:
    """The name the array was submitted with: a member ``sweep[3]`` belongs to ``sweep``."""
    name = job.spec.name
    return name.rsplit("[", 1)[0] if job.spec.array_id and name.endswith("]") and "[" in name else name


def in_order(jobs: Iterable[JobRecord]) -> list[JobRecord]:
    """Jobs as listings show them: by submit time; an array's members (submitted at once) by index."""
    return sorted(jobs, key=lambda j: (j.submit_ts, j.spec.array_id, j.spec.array_index, j.id))


def find_array(jobs: Iterable[JobRecord], ref: str, me: str) -> Target | None:
    """The array ``ref`` names among ``jobs`` (pure): by array id, else by name, preferring the
    caller's own arrays and, of several of that name, the one with active members; several active
    ones are ambiguous (refused with their ids, never a guess). None: no array is called that."""
    arrays: dict[str, list[JobRecord]] = {}
    for j in jobs:
        if j.spec.array_id and (j.spec.array_id == ref or array_name(j) == ref):
            arrays.setdefault(j.spec.array_id, []).append(j)
    if not arrays:
        return None
    if ref in arrays:
        return Target(ref, tuple(in_order(arrays[ref])), ref)
    mine = {a: m for a, m in arrays.items() if m[0].spec.user == me} or arrays
    active = sorted((a for a, m in mine.items() if any(not j.state.final for j in m)),
                    key=lambda a: (min(j.submit_ts for j in mine[a]), a))
    if len(active) > 1:
        raise InvalidRequest(f"{len(active)} active job arrays are named {ref!r}: {', '.join(active[:10])}; "
                             "name one by its array id")
    chosen = active[0] if active else max(mine, key=lambda a: (max(j.submit_ts for j in mine[a]), a))
    return Target(ref, tuple(in_order(mine[chosen])), chosen)


async def resolve(client, refs: Sequence[str]) -> list[Target]:
    """Each reference as a job (the controller's lookup) or, if no job has it, a job array.
    Raises NotFound naming what matched nothing."""
    from hfai.api.client import JobFilter

    targets: list[Target] = []
    listed: tuple[JobRecord, ...] | None = None
    for ref in refs:
        try:
            targets.append(Target(ref, (await client.status(ref),)))
            continue
        except NotFound:
            pass
        if listed is None:  # once, for every reference that is not a job
            listed = await client.jobs(JobFilter.of(finished=True))
        found = find_array(listed, ref, client.user)
        if found is None:
            raise NotFound(f"no job or job array with id or name {ref!r}")
        targets.append(found)
    return targets


def summary(target: Target) -> str:
    """One line about an array: its name, id, and how many members are in which state."""
    counts: dict[str, int] = {}
    for j in target.jobs:
        counts[j.state.value] = counts.get(j.state.value, 0) + 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    first = target.jobs[0]
    return (f"job array {array_name(first)} ({target.array_id}) of {first.spec.user}: "
            f"{len(target.jobs)} member(s): {states}")
