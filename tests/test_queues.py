"""The job index's walk over waiting jobs (controller/queues.py) against a plain reference."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hfai.controller.policy import JobView
from hfai.controller.queues import Level
from hfai.protocol.types import ChainState


def _reference(jobs: list[JobView], budget: int) -> list[tuple[str | None, bool]]:
    """Every job in queue order: taken if it fits what is left (which it then uses up), each
    with whether a job was left out ahead of it; last (None, anything left out)."""
    out: list[tuple[str | None, bool]] = []
    passed = False
    for j in sorted(jobs, key=lambda j: (j.submit_ts, j.id)):
        if j.lo <= budget:
            out.append((j.id, passed))
            budget -= j.lo
        else:
            passed = True
    out.append((None, passed))
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 40))
def test_walk_by_cap_takes_what_fits_in_queue_order(seed, budget):
    rng = random.Random(seed)
    level = Level()
    jobs = [JobView(f"j{i}", rng.choice("abc"), 20, rng.choice((1, 2, 4, 8)), float(rng.randrange(50)),
                    ChainState.QUEUED) for i in range(rng.randrange(30))]
    for j in jobs:
        level.add((j.submit_ts, j.id), j)
    left = [budget]
    got: list[tuple[str | None, bool]] = []
    for job, passed in level.fitting(lambda: left[0]):
        got.append((job.id if job is not None else None, passed))
        if job is not None:
            left[0] -= job.lo  # the cap shrinks as jobs are taken, as the LAS baseline's does
    assert got == _reference(jobs, budget)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000))
def test_heads_follow_the_lists_through_adds_and_removes(seed):
    """Level.heads (each list's head, per size, sorted) stays what the lists say, whatever order
    jobs come and go in; the walk reads the heads, never the lists, to start."""
    rng = random.Random(seed)
    level = Level()
    live: dict[str, JobView] = {}
    for i in range(rng.randrange(60)):
        if live and rng.random() < 0.4:
            j = live.pop(rng.choice(sorted(live)))
            level.remove((j.submit_ts, j.id), j)
        else:
            j = JobView(f"j{i}", rng.choice("abc"), 20, rng.choice((1, 2, 4)), float(rng.randrange(20)),
                        ChainState.QUEUED)
            live[j.id] = j
            level.add((j.submit_ts, j.id), j)
        expected: dict[int, list] = {}
        for (size, user), keys in level.lists.items():
            expected.setdefault(size, []).append((keys[0], size, user, keys, 0))
        assert {size: sorted(heads) for size, heads in expected.items()} == level.heads
    budget = rng.randrange(12)
    left = [budget]
    got = []
    for job, passed in level.fitting(lambda: left[0]):
        got.append((job.id if job is not None else None, passed))
        if job is not None:
            left[0] -= job.lo
    assert got == _reference(list(live.values()), budget)
