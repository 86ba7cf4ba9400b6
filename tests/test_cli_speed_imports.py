"""What an `hfai ps` or `hfai status ID` leaves out on its way to an answer, and that what it left
out is still there for whoever needs it: aiohttp, importlib.metadata and the JetStream client
(nats.js runs only at its first use) are not loaded, nor the daemons' helpers (argparse) and
getpass; TLS connections work from a process that loaded nats-py that way; no message class is
made for a reply the command only prints. Each check is a real process: this one has loaded all
of it long ago."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from spine_cluster import Cluster, cli_env

from hfai.protocol.types import ChainState

#: Loaded by an `hfai ps` before these changes, and needed by none of its steps.
NOT_NEEDED = ("argparse", "getpass", "termios", "hfai.core.daemon", "aiohttp", "importlib.metadata", "nats.js.api")

PROBE = f"""
import json, sys
from hfai.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit as e:
    assert not e.code, e.code
from hfai.protocol import _lazy
from hfai.protocol.types import MESSAGE_TYPES
print(json.dumps({{"loaded": [m for m in {NOT_NEEDED!r} if m in sys.modules],
                  "made": sorted(c.__name__ for c in MESSAGE_TYPES.values() if not _lazy.is_pending(c))}}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("speed"), nodes=1) as c:
        c.creds("tester")
        yield c


@pytest.mark.parametrize("args", [("ps",), ("ps", "-a"), ("status", "JOB")])
def test_a_query_loads_no_aiohttp_no_jetstream_no_daemon_helpers_and_makes_no_message_class(cluster, tmp_path, args):
    job = cluster.submit([sys.executable, "-c", "pass"], "speed", workdir=tmp_path)
    cluster.wait_state(job.id, ChainState.SUCCEEDED)
    args = tuple(job.id if a == "JOB" else a for a in args)
    r = subprocess.run([sys.executable, "-c", PROBE, *args], env=cli_env(cluster), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out, probe = r.stdout.rsplit("\n", 2)[0], json.loads(r.stdout.splitlines()[-1])
    assert job.id in out or args == ("ps",)  # it answered (a plain ps lists active jobs only)
    assert probe == {"loaded": [], "made": []}


def make_tls(root: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl command."""
    root.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key = root / "ca.pem", root / "ca-key.pem", root / "server.pem", root / "server-key.pem"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=hfai-test-ca")
    openssl("req", *ec, "-keyout", str(key), "-out", str(root / "server.csr"), "-subj", "/CN=127.0.0.1")
    (root / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(root / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(root / "ext.cnf"))
    return {"ca": ca, "cert": cert, "key": key}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
def test_tls_connections_after_the_light_import(tmp_path):
    """A tls:// URL with [nats] tls_ca, a nats:// URL to a server that requires TLS (nats-py
    upgrades it), and a plain asyncio TLS connection, all from a process that loaded nats-py as a
    query does; and a server certificate nobody vouches for is still refused."""
    from hfai.cli.local.nats_server import start_nats

    tls = make_tls(tmp_path / "tls")
    conf = tmp_path / "nats.conf"
    conf.write_text(f'tls {{ cert_file: "{tls["cert"]}", key_file: "{tls["key"]}" }}\n')
    proc, url = start_nats(tmp_path / "js", tmp_path / "nats.log", config_file=conf)
    port = int(url.rsplit(":", 1)[1])
    code = f"""
import sys
import hfai.api.client  # nats-py, as `hfai ps` loads it
import asyncio
assert "aiohttp" not in sys.modules and "nats.js.client" not in sys.modules
import nats
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol.errors import Unavailable

async def main():
    for url in ("tls://127.0.0.1:{port}", "nats://127.0.0.1:{port}"):
        config = Config(nats=NatsConfig(url=url, tls_ca={str(tls["ca"])!r}, connect_timeout_s=5))
        nc = await _nats.connect(config, "t", reconnect=False, creds="")
        print(url.split(":")[0], nc._transport._io_writer.get_extra_info("ssl_object") is not None)
        await nc.close()
    import ssl
    context = ssl.create_default_context(cafile={str(tls["ca"])!r})
    reader, writer = await asyncio.open_connection("127.0.0.1", {port})
    await reader.readline()  # the server's INFO, in the clear; TLS starts after it
    await writer.start_tls(context, server_hostname="127.0.0.1")
    print("start_tls", writer.get_extra_info("ssl_object") is not None)
    writer.close()
    try:
        await nats.connect("tls://127.0.0.1:{port}", allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=5)
    except ssl.SSLCertVerificationError:
        print("unknown CA refused")

asyncio.run(main())
"""
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["tls True", "nats True", "start_tls True", "unknown CA refused"]


def test_the_collector_pauses_while_a_command_module_first_loads_and_runs_again_after():
    code = """
import gc, json, sys
import click
from hfai.cli.main import main
seen = []
gc.callbacks.append(lambda phase, info: seen.append(phase))
cmd = main.get_command(click.Context(main), "ps")
during, frozen = len(seen), gc.get_freeze_count() > 0
again = main.get_command(click.Context(main), "ps")  # loaded already: nothing to pause for
try:
    main(["--help"], standalone_mode=False)
except SystemExit:
    pass
thawed = gc.get_freeze_count() == 0  # the command ended: a process that goes on collects as before
garbage = [[]]
garbage[0].append(garbage)
del garbage
print(json.dumps([cmd.name, during, frozen, again is cmd, thawed, gc.isenabled(), gc.collect() > 0]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == ["ps", 0, True, True, True, True, True]
