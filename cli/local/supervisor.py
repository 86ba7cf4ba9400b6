"""The local cluster's supervisor: the process `hfai local up` leaves running to keep its daemons
alive, as systemd does on a production cluster (``python -m hfai.cli.local.supervisor ROOT``).

Something must run while no CLI does, so `up` starts this one process (detached, its log in
``logs/supervisor.log``). Every ``tick_s`` it looks at each daemon of ``cluster.json`` and
restarts the dead ones with a backoff and a bound (hfai.cli.local.supervision); it probes the NATS
store as the controllers do and restarts nats-server, on the same port, when the store refuses
writes while its disk has room. From the moment `up` hands over it is the only writer of
``cluster.json``: the daemons' pids, each one's restarts, the store's health. `hfai local down`
stops it first (SIGTERM: it exits, leaving the daemons as they are) and then the daemons, so
nothing it would restart is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hfai._proc import pid_alive
from hfai.cli.local.cluster import LocalCluster
from hfai.cli.local.daemons import terminate
from hfai.cli.local.layout import Layout
from hfai.cli.local.nats_server import start_nats
from hfai.cli.local.supervision import Step, SupervisePolicy, Track, store_restart_due

log = logging.getLogger("hfai.cli.local.supervisor")

#: How long it waits at its start for `up` to record it in cluster.json.
HANDOVER_S = 30.0


class LocalSupervisor:
    def __init__(self, cluster: LocalCluster, policy: SupervisePolicy):
        self.cluster = cluster
        self.policy = policy
        now = time.time()
        # A joined NATS server (pid 0: not ours) is not supervised.
        self.tracks = {name: Track(started=now) for name, pid in cluster.pids.items() if pid}
        # Daemon checks run in a thread (a restart blocks until the daemon is ready) and store
        # restarts in another: one at a time touches the pids, the tracks and cluster.json.
        self._lock = threading.RLock()
        self.store_writable = True
        self.store_detail = ""
        self.store_restarted = 0.0
        # Set by the store probe when nats-server must be restarted for its store (what failed);
        # the daemons' check restarts it, under the one restart policy.
        self.store_fault = ""
        self._store_judged_afresh = False
        self._stopping = asyncio.Event()

    # ---------------------------------------------------------------------------- daemons

    def starter(self, name: str) -> Callable[[], int]:
        """The function that starts daemon ``name`` again and returns its pid."""
        c = self.cluster
        if name == "nats":
            return self._start_nats
        if name.startswith("controller-"):
            return lambda: c.start_controller(int(name.split("-", 1)[1])).pid
        if name.startswith("agent-node-"):
            return lambda: c.start_agent(int(name.rsplit("-", 1)[1])).pid
        if name == "storage":
            return lambda: c.start_storage().pid
        if name == "web":
            return lambda: c.start_web().pid
        raise KeyError(f"no way to start daemon {name!r}")

    def _start_nats(self) -> int:
        c = self.cluster
        port = int(c.url.rsplit(":", 1)[1])
        conf = c.layout.nats_conf
        proc, _url = start_nats(c.layout.nats_store, c.layout.log_path("nats"), port=port,
                                config_file=conf if conf.exists() else None)
        c._procs["nats"] = proc
        return proc.pid

    def exit_text(self, name: str) -> str:
        """How daemon ``name`` ended, if it was this process's child (else unknown here)."""
        proc = self.cluster._procs.get(name)
        if proc is None or proc.poll() is None:
            return "it ended; how is unknown (not the supervisor's child)"
        code = proc.returncode
        if code >= 0:
            return f"exited with status {code}"
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"

    def check_daemons(self, now: float) -> bool:
        """One look at every daemon; returns whether cluster.json must be written again."""
        with self._lock:
            return self._check_daemons(now)

    def _check_daemons(self, now: float) -> bool:
        changed = False
        for proc in self.cluster._procs.values():
            proc.poll()  # reap the ones that ended
        for name, track in self.tracks.items():
            if self._stopping.is_set():
                break
            alive = pid_alive(self.cluster.pids.get(name))
            fault = self.store_fault if name == "nats" and alive else ""
            if fault:
                step = track.fault(now, self.policy, f"its store refused writes ({fault})")
            else:
                if alive and track.down_since is not None:
                    track.well()  # a store fault that passed by itself
                step = track.see(alive, now, self.policy, "" if alive else self.exit_text(name))
            if step is Step.RESTART:
                if fault:
                    self._restart_for_store(track)
                else:
                    self.restart(name, track)
                changed = True
            elif step is Step.GIVE_UP:
                log.error("%s was restarted %d times within %gs and is due again (%s): not restarting it again "
                          "(`hfai local down` then `hfai local up`); see %s", name, len(track.restarts),
                          self.policy.window_s, track.last_exit, self.cluster.layout.log_path(name))
                changed = True
        return changed

    def restart(self, name: str, track: Track) -> None:
        log.warning("restarting %s (restart %d): %s", name, track.total + 1, track.last_exit)
        try:
            self.cluster.pids[name] = self.starter(name)()
        except Exception as e:  # noqa: BLE001 - a failed start is one more death, retried with backoff
            log.error("could not restart %s: %s", name, e)
            self.cluster.pids[name] = 0
        track.restarted(time.time())

    # ------------------------------------------------------------------------------ store

    def free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.cluster.layout.nats_store).free
        except OSError:
            return None

    async def probe_store(self) -> None:
        """Probe the store every ``store_probe_s`` until stopped; restart nats-server when due."""
        from hfai.auth.roles import Role
        from hfai.controller.store_health import StoreProbe
        from hfai.core import nats as _nats

        c, p = self.cluster, self.policy
        creds = str(c.service_creds("supervisor", Role.CONTROLLER)) if c.auth else None
        nc = await _nats.connect(c.config(), "hfai-local-supervisor", creds=creds)
        try:
            probe = StoreProbe(nc.jetstream(), "supervisor", c.replicas, p.store_probe_s, p.store_probe_timeout_s,
                               p.store_probe_failures)
            while not self._stopping.is_set():
                health = await probe.check()
                if (health.writable, health.detail) != (self.store_writable, self.store_detail):
                    self.store_writable, self.store_detail = health.writable, health.detail
                    self.save()
                now = time.time()
                # A server (re)started for any reason is judged afresh: a probe that failed while
                # it was down must not restart the new one.
                nats = self.tracks.get("nats")
                with self._lock:
                    if self._store_judged_afresh:  # restarted for its store: judge the new server afresh
                        self._store_judged_afresh = False
                        probe.watch = type(probe.watch)(p.store_probe_failures)
                        continue
                    due = nats is not None and store_restart_due(health.writable, self.free_bytes(), p,
                                                                 max(self.store_restarted, nats.started), now)
                    self.store_fault = health.detail if due else ""
                free = self.free_bytes()
                if not health.writable and free is not None and free < p.store_free_bytes:
                    log.warning("the NATS store refuses writes; its disk has %d bytes free: waiting for %d",
                                free, p.store_free_bytes)
                try:
                    await asyncio.wait_for(self._stopping.wait(), p.store_probe_s)
                except TimeoutError:
                    pass
        finally:
            await nc.close()

    def _restart_for_store(self, track: Track) -> None:
        """Stop nats-server and start it again on the same port and store: it reopens the streams
        it kept broken after a write error. Called with the lock held, as the policy said."""
        log.critical("the NATS store refuses writes and its disk has room: restarting nats-server")
        terminate(self.cluster.pids.get("nats"), self.cluster._procs.get("nats"))
        self.restart("nats", track)
        self.store_restarted = time.time()
        self.store_fault = ""
        self._store_judged_afresh = True

    # ------------------------------------------------------------------------------- loop

    def save(self) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        self.cluster.supervision = {
            "pid": os.getpid(),
            "daemons": {name: t.summary() for name, t in self.tracks.items()},
            "store": {"writable": self.store_writable, "detail": self.store_detail,
                      "restarted": self.store_restarted},
        }
        self.cluster.save()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("supervising %s under %s", ", ".join(sorted(self.tracks)), self.cluster.root)
        self.save()
        store = asyncio.create_task(self._probe_forever(), name="store-probe")
        try:
            while not self._stopping.is_set():
                # Restarts block (a start waits for readiness): off the loop, so the probe goes on.
                if await asyncio.to_thread(self.check_daemons, time.time()):
                    self.save()
                try:
                    await asyncio.wait_for(self._stopping.wait(), self.policy.tick_s)
                except TimeoutError:
                    pass
        finally:
            store.cancel()
            await asyncio.gather(store, return_exceptions=True)
        log.info("supervisor stopping (the daemons stay as they are)")

    async def _probe_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.probe_store()
            except asyncio.CancelledError:
                raise
            except Exception:  # the connection failed: the daemons' check goes on; try again
                log.exception("store probe failed; connecting again")
                await asyncio.sleep(self.policy.store_probe_s)


def wait_for_handover(root: Path, timeout_s: float = HANDOVER_S) -> LocalCluster | None:
    """The cluster `up` recorded with this process as its supervisor (None if it never did)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster = LocalCluster.load(root)
        if cluster is not None and cluster.supervision.get("pid") == os.getpid():
            return cluster
        time.sleep(0.05)
    return None


def spawn(root: Path, policy: SupervisePolicy) -> subprocess.Popen:
    """Start the supervisor of the cluster under ``root`` (detached; `up` then records its pid)."""
    logf = open(Layout(root).log_path("supervisor"), "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "hfai.cli.local.supervisor", str(root), "--policy", json.dumps(policy.to_json())],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    finally:
        logf.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hfai.cli.local.supervisor", description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--policy", default="{}", help="SupervisePolicy fields, as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = wait_for_handover(args.root)
    if cluster is None:
        log.error("the cluster under %s never recorded this supervisor: exiting", args.root)
        return 1
    asyncio.run(LocalSupervisor(cluster, SupervisePolicy.from_json(json.loads(args.policy))).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
