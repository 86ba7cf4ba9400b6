"""Three routed JetStream servers on loopback whose routes all pass through TCP proxies of the test's
own, so that one server can be cut off from the other two (a partition) while it stays up and
keeps its clients: :meth:`PartitionableCluster.cut` blackholes every route of that server (the
bytes are read and dropped, the connections stay open, new ones are held), as a network that
drops packets does. SIGSTOP of a server is no partition: its clients would lose it too.

One proxy per ordered pair (server i dialling server j), listed as i's routes; each server
advertises an address nobody listens on, so route gossip cannot open a route around the proxies.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

from waits import wait_for

from hfai.cli.local.nats_server import nats_server_binary

#: Advertised as every server's route address: nothing listens there (gossiped routes fail).
NOWHERE = "127.0.0.1:9"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class RouteGate:
    """The route proxies, on an event loop of their own (a thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.cut_off: set[int] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._writers: set[asyncio.StreamWriter] = set()

    def _is_cut(self, a: int, b: int) -> bool:
        return a in self.cut_off or b in self.cut_off

    def open(self, frm: int, to: int, target_port: Callable[[], int]) -> int:
        """A proxy for server ``frm``'s route to server ``to`` (at port ``target_port()``); returns its port."""
        async def start() -> int:
            server = await asyncio.start_server(lambda r, w: self._serve(r, w, frm, to, target_port()), "127.0.0.1", 0)
            self._servers.append(server)
            return server.sockets[0].getsockname()[1]
        return asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    async def _serve(self, reader, writer, frm: int, to: int, target_port: int) -> None:
        self._writers.add(writer)
        try:
            if self._is_cut(frm, to):
                await self._drain(reader)  # held: the dialler sees a connection that never talks
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
            self._writers.add(up_writer)
            await asyncio.gather(self._pump(reader, up_writer, frm, to), self._pump(up_reader, writer, frm, to),
                                 return_exceptions=True)
        except OSError:
            pass
        finally:
            writer.close()

    async def _pump(self, reader, writer, a: int, b: int) -> None:
        while data := await reader.read(65536):
            if self._is_cut(a, b):
                continue  # dropped on the floor
            writer.write(data)
            await writer.drain()
        writer.close()

    @staticmethod
    async def _drain(reader) -> None:
        while await reader.read(65536):
            pass

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            for w in self._writers:
                w.close()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


class PartitionableCluster:
    """``auth``: the config block of an hfai issuer, given a server's resolver directory (as
    tests/test_spine_nats_cluster.py's NatsCluster). Each server serves its monitoring pages on
    ``monitor_ports[i]`` (:meth:`clients` reads who is connected where)."""

    def __init__(self, root: Path, size: int = 3, auth=None):
        self.root, self.size, self.auth = root, size, auth
        self.gate = RouteGate()
        # The proxies first: bound, their ports cannot be among the free ones picked next.
        self.route_ports: list[int] = []
        self.proxies = {(i, j): self.gate.open(i, j, lambda j=j: self.route_ports[j])
                        for i in range(size) for j in range(size) if i != j}
        ports = _free_ports(3 * size)
        self.client_ports, self.route_ports, self.monitor_ports = ports[:size], ports[size:2 * size], ports[2 * size:]
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    def index_of(self, netloc: str) -> int:
        return self.client_ports.index(int(netloc.rsplit(":", 1)[1]))

    def log(self, i: int) -> Path:
        return self.root / f"nats-{i}.log"

    def _start(self, i: int) -> None:
        routes = ", ".join(f"nats://127.0.0.1:{self.proxies[i, j]}" for j in range(self.size) if j != i)
        conf = self.root / f"nats-{i}.conf"
        conf.write_text(
            f"server_name: nats-{i}\nlisten: 127.0.0.1:{self.client_ports[i]}\n"
            f"http: 127.0.0.1:{self.monitor_ports[i]}\n"
            f"jetstream {{\n  store_dir: {self.root / f'js-{i}'}\n}}\n"
            f"cluster {{\n  name: hfai\n  listen: 127.0.0.1:{self.route_ports[i]}\n"
            f"  advertise: \"{NOWHERE}\"\n  routes: [{routes}]\n}}\n"
            + (self.auth(self.root / f"accounts-{i}") if self.auth else "")
        )
        with open(self.log(i), "ab") as logf:
            self.procs.append(subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=logf,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_formed(self, timeout_s: float = 60.0) -> None:
        def formed() -> bool:
            logs = [self.log(i).read_text(errors="replace") for i in range(self.size)]
            return all("Server is ready" in t for t in logs) and any(
                re.search(r"JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader", t)
                for t in logs)

        wait_for(formed, timeout_s, f"the NATS cluster to form; see {self.root}")

    def clients(self, i: int) -> set[str]:
        """The names of the clients connected to server ``i`` (its /connz page)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[i]}/connz?limit=1000", timeout=5) as r:
            return {c.get("name", "") for c in json.load(r).get("connections") or []}

    def server_of(self, client: str) -> int | None:
        """The server client ``client`` is connected to (None: none now)."""
        return next((i for i in range(self.size) if client in self.clients(i)), None)

    def cut(self, i: int) -> None:
        """Partition server ``i`` from the others; it stays up with its clients."""
        self.gate.cut_off.add(i)

    def __enter__(self) -> PartitionableCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.size):
                self._start(i)
            self._wait_formed()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.gate.close()
