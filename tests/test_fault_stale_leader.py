"""No stale writer wins (issue 26 §1), on a real cluster: a leader frozen right before it writes
an assignment, a standby that takes over, the target node cut off NATS (through a TCP proxy of
our own) so that its job is requeued and started on the other node, then the old leader thawed
and the node let back: the old leader's late write must not make the node run the job again
while its new run is alive.

The freeze is deterministic: the leader stops itself at the fault point right before the write
(controller/faults.py), so the test does not depend on a signal hitting a window of microseconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import psutil
import pytest
from spine_cluster import JOBS, Cluster
from test_fault_leader import _kv_job
from test_fault_suite import overlapping, runs_by_job

from hfai.auth.roles import Role
from hfai.controller.assignments import same_work
from hfai.controller.faults import ASSIGNMENT_PUT, FREEZE_ENV, arm
from hfai.protocol.types import ChainState, NodeAssignment, NodeState

RUNLOG = str(JOBS / "runlog.py")
TTL_S = 2.0
JOB_S = 14.0  # long enough that a second run on the first node would overlap the requeued one


class CuttableProxy:
    """A TCP proxy from a local port to ``target``, in a thread of its own: ``cut()`` closes every
    connection through it and refuses new ones until ``restore()`` (a network partition of
    whoever connects through it, here one agent)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._loop = asyncio.new_event_loop()
        self._open = True
        self._pairs: set[asyncio.StreamWriter] = set()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _accept(self, reader, writer) -> None:
        if not self._open:
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._pairs |= {writer, up_w}
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer), return_exceptions=True)
        self._pairs -= {writer, up_w}

    async def _pipe(self, reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def _call(self, fn) -> None:
        done = threading.Event()

        def go():
            fn()
            done.set()

        self._loop.call_soon_threadsafe(go)
        done.wait(10)

    def cut(self) -> None:
        def go():
            self._open = False
            for w in list(self._pairs):
                w.transport.abort()  # no FIN handshake: as if the cable were pulled

        self._call(go)

    def restore(self) -> None:
        self._call(lambda: setattr(self, "_open", True))

    def close(self) -> None:
        self.cut()

        async def stop():
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def _through_proxy(c: Cluster, node: str, proxy: CuttableProxy) -> None:
    """Restart ``node``'s agent so that it reaches NATS through ``proxy`` (no job runs yet)."""
    name = f"agent-{node}"
    before = c.local.pids[name]
    c.local.kill(name, signal.SIGTERM)
    c.local._spawn(name, "hfai.agent", {
        "HFAI_AGENT_NODE": node, "HFAI_AGENT_ADDRESS": "127.0.0.1",
        "HFAI_AGENT_STATE_DIR": str(c.local.root / "agents" / node),
        "HFAI_NATS_URL": f"nats://127.0.0.1:{proxy.port}",
    }, c.local.service_creds(node, Role.AGENT))
    assert c.local.pids[name] != before


def _alive_nodes(c: Cluster) -> set[str]:
    return {n.record.name for n in c.run(lambda api: api.nodes()) if n.state is NodeState.UP and n.age_s < 2.0}


def _retrying(fn, what: str, timeout: float = 30.0):
    """``fn()`` until it answers: while a controller is frozen, API requests sent to it time out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: {e}") from e


def _log_count(c: Cluster, name: str, line: str) -> int:
    return (c.local.root / "logs" / f"{name}.log").read_text(errors="replace").count(line)


@pytest.mark.slow
def test_a_leader_thawed_after_a_takeover_cannot_make_a_node_run_a_job_twice(tmp_path, monkeypatch):
    freeze = tmp_path / "freeze"
    monkeypatch.setenv(FREEZE_ENV, str(freeze))  # the controllers inherit it
    runlog = tmp_path / "runs.log"
    with Cluster(tmp_path, nodes=2, controllers=2, lease_ttl_s=TTL_S) as c:
        target, other = c.local.node_name(0), c.local.node_name(1)
        host, port = c.local.url.removeprefix("nats://").rsplit(":", 1)
        proxy = CuttableProxy((host, int(port)))
        try:
            _through_proxy(c, target, proxy)
            c.wait(lambda: target in _alive_nodes(c), 20, f"{target} to come back through the proxy")
            # The job can only go to the target node.
            c.run(lambda api: api.drain(other, reason="test: the job must start on the target"), user="root")
            old = c.wait(c.leader, 10, "a leader")
            stepped_down = _log_count(c, old, "no longer leading")
            arm(freeze, ASSIGNMENT_PUT, target)
            job = c.submit(["python", RUNLOG, str(runlog), str(JOB_S)], name="once", workdir=tmp_path)
            old_pid = c.local.pids[old]
            c.wait(lambda: not freeze.exists() and _stopped(old_pid), 10, f"{old} to freeze before its write")
            proxy.cut()
            try:
                c.wait(lambda: (h := c.leader()) not in (None, old) and h, 4 * TTL_S, "a standby to take over", 0.05)
                _retrying(lambda: c.run(lambda api: api.drain(other, drain=False), user="root"), "undrain")
                # The target is lost (heartbeat timeout): the job is requeued and runs on the other node.
                moved = c.wait(lambda: (j := _kv_job(c, job.id)).state is ChainState.RUNNING and j.nodes == (other,)
                               and j, 40, "the job to be requeued and started on the other node", 0.2)
                assert moved.run_id == 2, moved
                c.wait(lambda: len(runs_by_job(runlog).get(job.id, ())) >= 1, 20, "the second run to start")
            finally:
                os.kill(old_pid, signal.SIGCONT)
            # Thawed, the old leader sends (or is refused) its late write, then stops leading.
            c.wait(lambda: _log_count(c, old, "no longer leading") > stepped_down, 15, f"{old} to stop leading")
            proxy.restore()
            c.wait(lambda: target in _alive_nodes(c), 20, f"{target} to be back")
            done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
            time.sleep(2.0)  # a run on the target started after the late write would have logged by now
        finally:
            proxy.close()
        runs = runs_by_job(runlog)[job.id]
        assert not overlapping(runs), f"the job ran twice at once: {runs}"
        assert [r.run_id for r in runs] == ["2"], runs
        assert done.run_id == 2, done.history
        # What held was the server refusing the late write, not its timing.
        assert _log_count(c, old, "written by a later leader") == 1


def test_the_proxy_cuts_and_restores(tmp_path):
    """The rig itself: bytes pass, a cut closes live connections and refuses new ones."""
    srv = socket.create_server(("127.0.0.1", 0))
    proxy = CuttableProxy(srv.getsockname())
    try:
        cli = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        proxy.cut()
        assert _closed(cli)  # from the proxy's side
        refused = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert _closed(refused)
        proxy.restore()
        again = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        conn2, _ = srv.accept()
        again.sendall(b"pong")
        assert conn2.recv(4) == b"pong"
        for s in (cli, conn, refused, again, conn2):
            s.close()
    finally:
        proxy.close()
        srv.close()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4) == b""
    except ConnectionResetError:
        return True


def test_an_older_fence_is_never_the_same_work():
    """A new leader's first round rewrites every node held under an older fence (its stamp), even
    when the work is unchanged: an old value left in place is what the old leader's late write
    could replace unseen."""
    old, new = NodeAssignment(node="n0", fence=7), NodeAssignment(node="n0", fence=9)
    assert not same_work(old, new)
    assert same_work(NodeAssignment(node="n0", fence=9), new)
    assert not same_work(None, new)
