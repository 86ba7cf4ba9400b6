"""What `hfai status` / `hfai ps` print about where a job is, for each kind of state."""

from __future__ import annotations

import dataclasses

import pytest

from hfai.cli import render
from hfai.protocol.types import ChainState, JobRecord, JobSpec

SPEC = JobSpec(name="train", entrypoint=("python", "train.py"), workdir="/w", nodes=2, user="alice")
BASE = JobRecord(id="j1", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0)


def _nodes_line(**changes) -> str:
    text = render.job_details(dataclasses.replace(BASE, **changes))
    return next(line for line in text.splitlines() if line.startswith("nodes"))


@pytest.mark.parametrize("state", [ChainState.RUNNING, ChainState.SUSPENDING, ChainState.STOPPING])
def test_a_job_holding_nodes_shows_them_as_now(state):
    line = _nodes_line(state=state, nodes=("n1", "n2"), last_nodes=("n1", "n2"))
    assert line.endswith("n1, n2 now"), line


@pytest.mark.parametrize("state", [ChainState.FAILED, ChainState.SUCCEEDED, ChainState.SUSPENDED])
def test_a_job_holding_nothing_shows_where_it_last_ran(state):
    line = _nodes_line(state=state, nodes=("n1",), last_nodes=("n1",))
    assert line.endswith("last ran on n1") and "now" not in line, line


def test_a_job_that_never_ran():
    assert _nodes_line().endswith("none yet")


def test_empty_table_message():
    assert render.jobs_table([], empty="no active jobs") == "no active jobs"
    assert "train" in render.jobs_table([BASE], now=2.0)
