"""A huge number a user types is one line and a non-zero exit, never msgpack's traceback (issue 39
item 5): the CLI bounds every integer option (hfai.protocol.limits) before it connects, the
controller bounds what any client sends, and the Python API turns what the wire cannot carry into
a typed error."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from hfai.api.client import ApiClient
from hfai.cli.main import main
from hfai.controller.validate import check_array, check_spec
from hfai.core.config import load_config
from hfai.protocol import verbs
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.limits import MAX_ARRAY_INDEX, MAX_NODES
from hfai.protocol.types import JobSpec, Priority, SubmitRequest

HUGE = "99999999999999999999"  # > 2**64: what msgpack cannot carry


@pytest.mark.parametrize("args", [
    ["submit", "-n", HUGE, "true"],
    ["submit", "-n", f"1:{HUGE}", "true"],
    ["submit", "-n", str(MAX_NODES + 1), "true"],
    ["submit", "--array", f"0-3%{HUGE}", "true"],
    ["submit", "--array", f"0-{HUGE}", "true"],
    ["submit", "--array", f"{HUGE}", "true"],
    ["submit", "--retry", HUGE, "true"],
    ["update", "some-job", "-n", HUGE],
    ["logs", "some-job", "-r", HUGE],
    ["exec", "some-job", "-r", HUGE, "--", "true"],
    ["shell", "some-job", "-r", HUGE],
    ["dev", "start", "-n", HUGE],
    ["quota", "set", "alice", "HIGH", HUGE],
    ["sim", "gen", "trace.csv", "--jobs", HUGE, "--nodes", "4"],
    ["admin", "fault", "node-0", "--xid", HUGE],
    ["admin", "fault", "node-0", "--xid", "79", "--gpu", HUGE],
    ["data", "convert", "clue", ".", "out", "--max-length", HUGE],
    ["data", "convert", "imagenet", ".", "out", "--nfiles", HUGE],
])
def test_a_huge_number_is_one_line_and_a_non_zero_exit(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    # Nothing to reach: the refusal must come before any connection is tried.
    env = {"HFAI_HOME": str(tmp_path / "home"), "HFAI_NATS_URL": "nats://127.0.0.1:1", "HFAI_USER": "alice"}
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    errors = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    assert "range" in errors[0] or "at most" in errors[0] or "must be" in errors[0] or "go from" in errors[0], r.output


def _spec(**changes) -> JobSpec:
    base = dict(name="j", entrypoint=("true",), workdir="/tmp", nodes=1, priority=Priority.NORMAL, group="default",
                user="alice")
    return JobSpec(**(base | changes))


def test_the_controller_refuses_an_array_limit_or_index_out_of_bounds():
    with pytest.raises(InvalidRequest, match="limit"):
        check_spec(_spec(array_limit=2**63))
    with pytest.raises(InvalidRequest, match=f"0 to {MAX_ARRAY_INDEX}"):
        check_array((0, MAX_ARRAY_INDEX + 1))
    assert check_array((0, MAX_ARRAY_INDEX)) == (0, MAX_ARRAY_INDEX)
    with pytest.raises(InvalidRequest, match=f"at most {MAX_NODES} nodes"):
        check_spec(_spec(nodes=2**63))


def test_the_python_api_says_a_number_is_too_large_to_send(tmp_path):
    config = load_config(None, env={"HFAI_HOME": str(tmp_path), "HFAI_NATS_URL": "nats://127.0.0.1:1"})
    client = ApiClient(config, user="alice")  # never connected: the refusal comes first
    request = SubmitRequest(spec=_spec(nodes=10**20))
    with pytest.raises(InvalidRequest, match="too large to send"):
        asyncio.run(client.call(verbs.SUBMIT, request))
