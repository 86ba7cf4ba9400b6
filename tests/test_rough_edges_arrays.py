"""Issue 24 item 2: job arrays handled as a whole (status, stop, hold, release, update by the
array's id or name), several jobs per command, members listed in index order, `hfai ps --sort`.
The pure parts here; the commands against a real local cluster in test_rough_edges_arrays_live.py."""

from __future__ import annotations

import pytest

from hfai.api import arrays
from hfai.cli import render
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import ChainState, JobRecord, JobSpec, Priority


def member(array_id: str, i: int, *, name: str = "sweep", user: str = "ana", submit: float = 100.0,
           state: ChainState = ChainState.QUEUED, id: str | None = None, prio: int = 10) -> JobRecord:
    spec = JobSpec(name=f"{name}[{i}]", entrypoint=("true",), workdir="/", user=user, priority=prio,
                   array_id=array_id, array_index=i)
    # Ids are random (uuid): members of one array sort by index, never by id.
    return JobRecord(id=id or f"z{9 - i}{array_id}", spec=spec, state=state, submit_ts=submit)


def test_members_are_listed_in_index_order():
    """Issue 24 item 2: `sweep[4], sweep[0], ...` (the ids' order: members share a submit time)."""
    jobs = [member("a1", i) for i in (4, 0, 3, 1, 2)]
    assert [j.spec.name for j in arrays.in_order(sorted(jobs, key=lambda j: (j.submit_ts, j.id)))] == [
        f"sweep[{i}]" for i in range(5)]
    # Sorting by name keeps indices numeric: sweep[10] after sweep[9].
    named = render.sort_jobs([member("a1", 10), member("a1", 9)], render.parse_sort("name"), 0.0)
    assert [j.spec.name for j in named] == ["sweep[9]", "sweep[10]"]


def test_an_array_is_found_by_its_id_or_its_name():
    a = [member("a1", i) for i in (1, 0)]
    b = [member("b2", i, user="bob", id=f"y{i}") for i in range(2)]
    by_id = arrays.find_array([*a, *b], "b2", "ana")
    assert by_id is not None and by_id.array_id == "b2" and [j.spec.array_index for j in by_id.jobs] == [0, 1]
    by_name = arrays.find_array([*a, *b], "sweep", "ana")  # the caller's own array first
    assert by_name is not None and by_name.array_id == "a1"
    assert arrays.find_array([*a, *b], "sweep", "bob").array_id == "b2"
    assert arrays.find_array(a, "nothing", "ana") is None
    assert arrays.find_array(a, "sweep[0]", "ana") is None  # a member's name is a job, not an array
    # Two active arrays of one name: ambiguous, refused with their ids.
    c = [member("c3", 0, id="x0", submit=200.0)]
    with pytest.raises(InvalidRequest, match="a1, c3"):
        arrays.find_array([*a, *c], "sweep", "ana")
    # One of them finished: the active one.
    done = [member("c3", 0, id="x0", submit=200.0, state=ChainState.SUCCEEDED)]
    assert arrays.find_array([*a, *done], "sweep", "ana").array_id == "a1"
    summary = arrays.summary(arrays.find_array([*a, member("a1", 2, state=ChainState.RUNNING, id="w")], "a1", "x"))
    assert summary == "job array sweep (a1) of ana: 3 member(s): 2 queued, 1 running"


def test_ps_sort_takes_columns_with_a_direction_and_refuses_unknown_ones():
    jobs = [member("a", 0, prio=Priority.LOW.value, submit=1.0, id="j1"),
            member("a", 1, prio=Priority.HIGH.value, submit=2.0, id="j2"),
            member("a", 2, prio=Priority.HIGH.value, submit=3.0, id="j3")]
    assert [j.id for j in render.sort_jobs(jobs, render.parse_sort("-priority,age"), 10.0)] == ["j3", "j2", "j1"]
    assert [j.id for j in render.sort_jobs(jobs, render.parse_sort("-PRIORITY,-age"), 10.0)] == ["j2", "j3", "j1"]
    for bad in ("colour", "", "-"):
        with pytest.raises(InvalidRequest, match="sort"):
            render.parse_sort(bad)
