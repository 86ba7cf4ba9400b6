"""The environment a job starts with, as the agent builds it for a job run as its submitter."""

from __future__ import annotations

import os
from pathlib import Path

from hfai.agent.identity import JobIdentity, agent_account
from hfai.agent.jobenv import job_command
from hfai.protocol.types import DesiredRun, RunAssignment


def test_a_submitters_job_learns_where_environments_and_datasets_are(tmp_path, monkeypatch):
    # The agent's own HFAI_* settings are held back from a submitter's job: what a job needs of them
    # (hf_env.set_env's environment root, hfai.datasets' data directory) is handed over by name.
    monkeypatch.setenv("HFAI_CONFIG", str(tmp_path / "agent.toml"))
    ra = RunAssignment(job_id="j1", run_id=1, name="n", user="u", group="default", priority=10, rank=0,
                       world_size=1, master_addr="a", master_port=1, entrypoint=("true",), workdir=str(tmp_path),
                       desired=DesiredRun.RUN)
    _, env = job_command(ra, JobIdentity(agent_account(), switch=False), node="n0",
                         control_dir=str(tmp_path / "control"), run_as="submitter", env_root=Path(tmp_path / "envs"),
                         datasets_dir=str(tmp_path / "datasets"))
    assert "HFAI_CONFIG" not in env
    assert env["HFAI_ENV_ROOT"] == str(tmp_path / "envs")
    assert env["HFAI_DATASETS_DIR"] == str(tmp_path / "datasets")
    assert os.path.isabs(env["HFAI_ENV_ROOT"])
