"""`hfai ps --mine` among 20,000 queued jobs of others (issue 38 §6): the API finds the caller's
jobs by user, without going through everyone's records, and shows the leader's wait reasons."""

from __future__ import annotations

from fakes import FakeKV

from hfai.controller.api import ApiService, Caller
from hfai.controller.nodes import NodeTracker
from hfai.kv import KVCache
from hfai.protocol import decode, encode, reasons
from hfai.protocol.types import ChainState, JobList, JobRecord, JobRequest, JobSpec, ListRequest, NodeRecord


def job(i: int, user: str) -> JobRecord:
    spec = JobSpec(name=f"{user}-{i}", entrypoint=("true",), workdir="/w", nodes=1, user=user)
    return JobRecord(id=f"{user}{i:05d}", spec=spec, state=ChainState.QUEUED, submit_ts=float(i), reason="queued")


class Watched(dict):
    """The jobs copy's values, counting the records read and whole scans."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = 0
        self.scans = 0

    def values(self):
        self.scans += 1
        return super().values()

    def get(self, key, default=None):
        self.read += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.read += 1
        return super().__getitem__(key)


async def test_mine_reads_only_my_records_once_the_user_index_is_built():
    kv = FakeKV()
    jobs = KVCache(kv, JobRecord)
    for r in [*(job(i, "bob") for i in range(2000)), *(job(i, "alice") for i in range(3))]:
        jobs.put_local(r.id, r, kv._put(r.id, encode(r)))
    api = ApiService(kv, jobs, None)
    mine = ListRequest(all_users=False, include_finished=False)
    first = decode((await api.list(Caller("alice"), mine)).data, JobList)
    assert [j.id for j in first.jobs] == ["alice00000", "alice00001", "alice00002"]
    newer = job(2000, "bob")
    jobs.put_local(newer.id, newer, kv._put(newer.id, encode(newer)))
    jobs.values = watched = Watched(jobs.values)
    again = decode((await api.list(Caller("alice"), mine)).data, JobList)
    assert [j.id for j in again.jobs] == [j.id for j in first.jobs]
    assert watched.scans == 0 and watched.read <= 3 + 1, (watched.scans, watched.read)


async def test_a_list_and_status_show_the_reason_the_leader_noted():
    from hfai.controller.waits import WaitBoard

    kv = FakeKV()
    jobs = KVCache(kv, JobRecord)
    w = job(1, "alice")
    jobs.put_local(w.id, w, kv._put(w.id, encode(w)))
    board = WaitBoard(jobs.revisions)
    why = reasons.no_nodes(reserved=False)
    board.note(w.id, jobs.revisions[w.id], why)
    api = ApiService(kv, jobs, NodeTracker(KVCache(FakeKV(), NodeRecord), 10.0), waits=board)
    [listed] = decode((await api.list(Caller("bob"), ListRequest())).data, JobList).jobs
    assert listed.reason == why.text() and listed.why == why
    assert (await api.status(Caller("bob"), JobRequest(job=w.id))).job.reason == why.text()
