"""The API's reply pages: bounded in encoded bytes, never empty while items remain."""

from __future__ import annotations

from hfai.controller.api import first_page
from hfai.protocol import encode
from hfai.protocol.types import ChainState, JobRecord, JobSpec

SPEC = JobSpec(name="j", entrypoint=("python", "t.py"), workdir="/w", nodes=2, user="alice")


def test_first_page_fits_the_budget_and_always_progresses():
    jobs = [JobRecord(id=f"j{i}", spec=SPEC, state=ChainState.QUEUED, submit_ts=float(i)) for i in range(10)]
    size = len(encode(jobs[0]))
    page, more = first_page(jobs, 3 * size + 1)
    assert [j.id for j in page] == ["j0", "j1", "j2"] and more
    assert first_page(jobs, 1) == ((jobs[0],), True)  # one item even over the budget
    assert first_page(jobs, 10**9) == (tuple(jobs), False)
    assert first_page([], 100) == ((), False)
