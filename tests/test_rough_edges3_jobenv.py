"""A job sees every variable of the original platform's list with the original's meaning (issue 39
item 1): scripts read MASTER_IP with no fallback, hfai-platform's own code reads MARSV2_USER_ROLE."""

from __future__ import annotations

import os
from pathlib import Path

from hfai.agent.devsession import ENTRYPOINT as DEV_ENTRYPOINT
from hfai.agent.identity import JobIdentity, agent_account
from hfai.agent.jobenv import job_command
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, RunAssignment

#: hai-platform docs/_sources/misc/env_var.md, less MARSV2_USER_TOKEN and the scheduler's debug log.
ORIGINAL = ("MASTER_IP", "MASTER_PORT", "WORLD_SIZE", "RANK", "MARSV2_UID", "MARSV2_USER", "MARSV2_USER_ROLE",
            "MARSV2_NB_NAME", "MARSV2_TASK_TYPE", "MARSV2_TASK_ID", "MARSV2_WHOLE_LIFE_STATE", "MARSV2_LOG_DIR",
            "MARSV2_LOG_FILE_PATH", "MARSV2_RANK", "MARSV2_NODE_NAME")


def _assignment(workdir: Path, entrypoint: tuple[str, ...] = ("true",)) -> RunAssignment:
    return RunAssignment(job_id="ab12cd34ef", run_id=2, name="resnet", user="alice", group="default", priority=10,
                         rank=1, world_size=2, master_addr="10.0.0.7", master_port=29510, entrypoint=entrypoint,
                         workdir=str(workdir), desired=DesiredRun.RUN, whole_life_state=5)


def _env(tmp_path: Path, ra: RunAssignment) -> tuple[dict[str, str], RunStore]:
    store = RunStore(tmp_path / "state", "node-3", tmp_path / "envs")
    who = JobIdentity(agent_account(), switch=False)
    control = store.control_root.resolve() / ra.key
    _, env = job_command(ra, who, node="node-3", control_dir=str(control), run_as="agent",
                         env_root=tmp_path / "envs")
    return env, store


def test_a_job_gets_every_variable_of_the_original_list(tmp_path):
    env, store = _env(tmp_path, _assignment(tmp_path))
    assert [k for k in ORIGINAL if k not in env] == []
    assert env["MASTER_IP"] == env["MASTER_ADDR"] == "10.0.0.7"  # rank 0's address
    assert (env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"], env["MARSV2_RANK"]) == ("29510", "2", "1", "1")
    assert env["MARSV2_UID"] == str(os.getuid())  # the account the job runs as
    assert (env["MARSV2_USER"], env["MARSV2_USER_ROLE"]) == ("alice", "internal")
    assert (env["MARSV2_NB_NAME"], env["MARSV2_TASK_ID"], env["MARSV2_TASK_TYPE"]) == ("resnet", "ab12cd34ef",
                                                                                       "training")
    assert (env["MARSV2_WHOLE_LIFE_STATE"], env["MARSV2_NODE_NAME"]) == ("5", "node-3")
    assert not [k for k in env if "TOKEN" in k]


def test_the_log_variables_name_the_file_the_agent_writes_the_rank_s_output_to(tmp_path):
    env, store = _env(tmp_path, _assignment(tmp_path))
    assert env["MARSV2_LOG_FILE_PATH"] == str(store.log_path("ab12cd34ef", 1))
    assert env["MARSV2_LOG_DIR"] == str(store.log_path("ab12cd34ef", 1).parent)


def test_a_development_session_is_a_jupyter_task(tmp_path):
    env, _ = _env(tmp_path, _assignment(tmp_path, DEV_ENTRYPOINT))
    assert env["MARSV2_TASK_TYPE"] == "jupyter"
