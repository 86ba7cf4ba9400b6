"""KV writes per job on a real cluster (issue 11): rewriting every waiting job's reason whenever its
wording changes, every round, would cost hundreds of writes per job (docs/performance.md, "Write
amplification"). A job's life is a handful of writes: submitted, (explained,) started, finished —
and its nodes' assignments. Throughput itself is measured by bench/bench_throughput.py, never
asserted here."""

from __future__ import annotations

import asyncio

import pytest
from spine_cluster import Cluster
from waits import until

from hfai.core import nats as _nats
from hfai.protocol import names
from hfai.protocol.types import ChainState, JobSpec

JOBS = 100
# Per job: submit, a wait reason, start, exit (a few more if a wait reason changes its gist).
MAX_RECORD_WRITES_PER_JOB = 6.0
# Per job: its node's assignment gains the run, then loses it (often merged with the next one).
MAX_ASSIGNMENT_WRITES_PER_JOB = 3.0


async def _revisions(c: Cluster) -> dict[str, int]:
    nc = await _nats.connect(c.config, "test-writes", reconnect=False, creds=str(c.service_creds()))
    try:
        js = nc.jetstream()
        return {b: (await js.stream_info(f"KV_{b}")).state.last_seq for b in (names.BUCKET_JOBS, names.BUCKET_ASSIGN)}
    finally:
        await nc.close()


@pytest.mark.slow
def test_a_batch_of_trivial_jobs_costs_a_few_kv_writes_each(tmp_path):
    with Cluster(tmp_path, nodes=3) as c:
        before = asyncio.run(_revisions(c))

        async def batch(api):
            ids = [(await api.submit(JobSpec(name=f"t{i}", entrypoint=("true",), workdir=str(tmp_path)))).id
                   for i in range(JOBS)]
            for job_id in ids:  # FIFO: waiting for each in turn costs one status call per poll
                async def ended(job_id=job_id):
                    return (j := await api.status(job_id)).state.final and j

                j = await until(ended, 120, f"{job_id} to end", poll=0.2)
                assert j.state is ChainState.SUCCEEDED and j.run_id == 1, j

        c.run(batch)
        after = asyncio.run(_revisions(c))
    records = (after[names.BUCKET_JOBS] - before[names.BUCKET_JOBS]) / JOBS
    assignments = (after[names.BUCKET_ASSIGN] - before[names.BUCKET_ASSIGN]) / JOBS
    print(f"KV writes per job: {records:.2f} job records, {assignments:.2f} assignments")
    assert records <= MAX_RECORD_WRITES_PER_JOB
    assert assignments <= MAX_ASSIGNMENT_WRITES_PER_JOB
