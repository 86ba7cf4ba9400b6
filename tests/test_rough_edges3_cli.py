"""What a new user hit in the CLI (issue 39): a missing ./program accepted at submit (item 6), the
estimate blind to jobs that finished in one run (item 7), and the smaller ones (item 12): an array
member's wait naming more running members than run, `hfai stop` on a finished job saying
"stopped", `--name ""` renamed silently, `workspace pull nosuch` drawing a bar before its error.
No cluster: the CLI runs in this process against a stand-in client where it needs one."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from hfai.cli import common
from hfai.cli.main import main
from hfai.controller import transitions
from hfai.controller.estimate import Guess, guess_from_history
from hfai.controller.plan import PlanNode, PlanSettings, plan_once
from hfai.controller.policy import PolicyConfig, Start
from hfai.protocol.errors import NotFound
from hfai.protocol.types import ChainState, JobRecord, JobSpec

NOW = 1_000_000.0


def _cli(tmp_path, monkeypatch, *args: str):
    monkeypatch.chdir(tmp_path)
    # Nothing to reach: what needs no cluster must not try one.
    env = {"HFAI_HOME": str(tmp_path / "home"), "HFAI_NATS_URL": "nats://127.0.0.1:1", "HFAI_USER": "alice"}
    return CliRunner().invoke(main, list(args), env=env)


def _queued(id: str, submit: float = 0.0, **kw) -> JobRecord:
    spec = JobSpec(name=kw.pop("name", id), entrypoint=("true",), workdir="/", user="alice", **kw)
    return JobRecord(id=id, spec=spec, state=ChainState.QUEUED, submit_ts=submit, reason="queued")


def _running(id: str, started: float = NOW - 60, **kw) -> JobRecord:
    return transitions.apply_start(_queued(id, **kw), Start(id, ("n0",)), started, "10.0.0.1", 20001)


# ---------------------------------------------------------------------------------- item 6

@pytest.mark.parametrize("program", ["./nosuchbinary", "bin/train", "{cwd}/nosuchbinary"])
def test_submit_of_a_program_missing_from_the_workdir_is_refused(tmp_path, monkeypatch, program):
    r = _cli(tmp_path, monkeypatch, "submit", program.format(cwd=tmp_path), "--lr", "1")
    assert r.exit_code == 2, r.output
    assert "does not exist" in r.output and str(tmp_path) in r.output


def test_a_program_the_nodes_alone_may_have_is_not_checked_here(tmp_path):
    from hfai.cli.submit import names_workdir_file

    # An absolute path outside the workdir (an environment on the nodes) or a name on PATH.
    assert not names_workdir_file("/opt/conda/bin/torchrun") and not names_workdir_file("torchrun")
    assert names_workdir_file("./run") and names_workdir_file("tools/run")


# ---------------------------------------------------------------------------------- item 7

def test_the_estimate_counts_the_jobs_that_finished_in_one_run():
    # Nine jobs of 0-80 s, each finished in its first run (nothing in run_s, the earlier runs).
    done = [dataclasses.replace(_running(f"d{i}", started=NOW - 100), state=ChainState.SUCCEEDED,
                                ended_ts=NOW - 100 + 10 * i) for i in range(9)]
    assert [j.run_s for j in done] == [0.0] * 9
    assert guess_from_history(done) == Guess(45.0)  # the median of 10..80 s (a job of 0 s tells nothing)
    # One suspended once (30 s) and then finished (50 s more) ran 80 s in all.
    twice = dataclasses.replace(done[1], run_s=30.0, started_ts=NOW - 50, ended_ts=NOW)
    assert guess_from_history([twice]) == Guess(80.0)


# ---------------------------------------------------------------------------------- item 12

def test_an_array_member_s_wait_counts_the_members_that_run():
    members = [_queued(f"m{i}", array_id="arr", array_index=i, array_limit=2, submit=float(i)) for i in range(4)]
    members[0] = _running("m0", array_id="arr", array_index=0, array_limit=2)
    # One node: m1 may start (one of the two places is free) but finds no node; m2, m3 wait behind it.
    settings = PlanSettings(policy=PolicyConfig(slice_s=1800.0))
    actions = plan_once(members, [PlanNode("n0", address="10.0.0.1")], settings, NOW)
    why = {a.job_id: a.reason for a in actions if type(a).__name__ == "Explain"}
    assert why["m2"] == ("its job array arr runs at most 2 member(s) at once (--array ...%2): 1 running, "
                         "1 waiting ahead of this one")
    members[1] = _running("m1", array_id="arr", array_index=1, array_limit=2)
    actions = plan_once(members, [PlanNode(f"n{i}", address="10.0.0.1") for i in range(4)], settings, NOW)
    why = {a.job_id: a.reason for a in actions if type(a).__name__ == "Explain"}
    assert why["m2"] == "its job array arr already runs 2 member(s) (--array ...%2)"


class _Client:
    """Stands in for ApiClient behind `hfai.cli.common.api()`: one job, stop recorded."""

    user = "alice"

    def __init__(self, job: JobRecord):
        self.job, self.stopped = job, []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def status(self, ref):
        return self.job

    async def stop(self, job_id):
        self.stopped.append(job_id)
        return self.job


def test_stop_of_a_finished_job_says_it_had_ended_and_fails(monkeypatch):
    done = dataclasses.replace(_queued("j1", name="train"), state=ChainState.SUCCEEDED, reason="all ranks exited 0")
    client = _Client(done)
    monkeypatch.setattr(common, "api", lambda: client)
    r = CliRunner().invoke(main, ["stop", "j1"])
    assert r.exit_code == 1, r.output
    assert "job train (j1): not stopped: it has already ended (succeeded, all ranks exited 0)" in r.output
    assert "stopped: succeeded" not in r.output and client.stopped == []


def test_stop_of_a_waiting_job_still_stops_it(monkeypatch):
    client = _Client(_queued("j2", name="train"))
    monkeypatch.setattr(common, "api", lambda: client)
    r = CliRunner().invoke(main, ["stop", "j2"])
    assert r.exit_code == 0 and client.stopped == ["j2"], r.output


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_name_is_refused_not_replaced(tmp_path, monkeypatch, name):
    (tmp_path / "train.py").write_text("")
    r = _cli(tmp_path, monkeypatch, "submit", "--name", name, "python", "train.py")
    assert r.exit_code == 2 and "--name needs a name" in r.output, r.output


class _Storage:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None


def test_a_pull_refused_at_once_prints_its_error_alone(tmp_path, monkeypatch):
    import hfai.cli.workspace as ws
    import hfai.storage.pull as storage_pull

    async def refused(client, name, dest, request_bytes, on_bytes=None):
        raise NotFound(f"no workspace {name!r}")

    monkeypatch.setattr(ws, "_client", _Storage)
    monkeypatch.setattr(storage_pull, "pull", refused)
    r = _cli(tmp_path, monkeypatch, "workspace", "pull", "nosuch")
    assert r.exit_code == 1 and r.output == "Error: no workspace 'nosuch'\n", r.output


def test_a_pull_that_moves_bytes_draws_its_bar(tmp_path, monkeypatch):
    import hfai.cli.workspace as ws
    import hfai.storage.pull as storage_pull

    async def pulled(client, name, dest, request_bytes, on_bytes=None):
        on_bytes(1000)
        return 1

    monkeypatch.setattr(ws, "_client", _Storage)
    monkeypatch.setattr(storage_pull, "pull", pulled)
    r = _cli(tmp_path, monkeypatch, "workspace", "pull", "mine")
    assert r.exit_code == 0 and "pulling" in r.output and "pulled mine into" in r.output, r.output
