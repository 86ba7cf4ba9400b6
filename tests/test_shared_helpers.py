"""One implementation each (issue 12): compare-and-set with retries (job records and settings),
CLI error wrapping, config discovery, pid liveness, atomic writes."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap

import click
import nats
import nats.js.errors
import psutil
import pytest
from click.testing import CliRunner
from waits import wait_for

from hfai._atomic import write_atomic
from hfai._proc import pid_alive
from hfai.cli.errors import user_errors
from hfai.kv import cas_update, cas_value
from hfai.protocol import decode, encode
from hfai.protocol.errors import Conflict, InvalidRequest, NotFound
from hfai.protocol.types import DrainedNodes

# ---------------------------------------------------------------------------- compare-and-set


def test_cas_value_creates_updates_retries_and_gives_up(nats_url):
    async def go(url):
        nc = await nats.connect(url)
        kv = await nc.jetstream().create_key_value(bucket="t", history=1)

        def drain(node):
            return lambda d: DrainedNodes(nodes={**d.nodes, node: "r"})

        # A missing key: NotFound, or created from its first value.
        with pytest.raises(NotFound, match="no setting drained"):
            await cas_value(kv, "drained", DrainedNodes, drain("n1"), what="setting")
        value, rev, changed = await cas_value(kv, "drained", DrainedNodes, drain("n1"), what="setting",
                                              missing=DrainedNodes)
        assert changed and value.nodes == {"n1": "r"} and rev == (await kv.get("drained")).revision

        # No change: nothing written, the current value and revision.
        same, rev2, changed = await cas_value(kv, "drained", DrainedNodes, lambda d: None, what="setting")
        assert (same, rev2, changed) == (value, rev, False)

        # A lost race is retried on the value the other writer left.
        calls = []
        real_update = kv.update

        async def update_after_another_writer(key, value, last=None):
            if len(calls) == 1:  # the other writer lands between our first read and our write
                other = decode((await kv.get(key)).value, DrainedNodes)
                await kv.put(key, encode(DrainedNodes(nodes={**other.nodes, "other": "x"})))
            return await real_update(key, value, last=last)

        def add_n2(d):
            calls.append(d)
            return DrainedNodes(nodes={**d.nodes, "n2": "r"})

        kv.update = update_after_another_writer
        value, _, changed = await cas_value(kv, "drained", DrainedNodes, add_n2, what="setting")
        assert changed and len(calls) == 2 and value.nodes == {"n1": "r", "other": "x", "n2": "r"}
        assert decode((await kv.get("drained")).value, DrainedNodes) == value

        # Always beaten: Conflict after the attempts, naming what.
        async def always_beaten(key, value, last=None):
            await kv.put(key, (await kv.get(key)).value)
            return await real_update(key, value, last=last)

        kv.update = always_beaten
        with pytest.raises(Conflict, match="setting drained is changing too fast"):
            await cas_value(kv, "drained", DrainedNodes, drain("n3"), what="setting", attempts=3)
        kv.update = real_update

        # Job records keep their wording.
        with pytest.raises(NotFound, match="no job j1"):
            await cas_update(kv, "j1", lambda r: r)

        # Two first writers of a setting: the loser's create is refused, and it retries as an update.
        a, b = await asyncio.gather(
            cas_value(kv, "fresh", DrainedNodes, drain("a"), what="setting", missing=DrainedNodes,
                      lost_race=(nats.js.errors.APIError,)),
            cas_value(kv, "fresh", DrainedNodes, drain("b"), what="setting", missing=DrainedNodes,
                      lost_race=(nats.js.errors.APIError,)))
        assert a[2] and b[2]
        assert decode((await kv.get("fresh")).value, DrainedNodes).nodes == {"a": "r", "b": "r"}
        await nc.close()

    asyncio.run(go(nats_url))


# ------------------------------------------------------------------------------ CLI errors

def _command(body):
    @click.command()
    @user_errors()
    def cmd():
        return body()

    return cmd


def test_user_errors_are_one_clean_line():
    def fail():
        raise InvalidRequest("job \x1b[2Jname is bad")

    result = CliRunner().invoke(_command(fail))
    assert result.exit_code == 1 and result.output == "Error: job \\x1b[2Jname is bad\n"

    @click.command()
    @user_errors()
    async def acmd():
        await asyncio.sleep(0)
        raise NotFound("no job x")

    result = CliRunner().invoke(acmd)
    assert result.exit_code == 1 and result.output == "Error: no job x\n"


def test_user_errors_let_other_errors_through_and_ctrl_c_is_130():
    def bug():
        raise ValueError("a bug, with its traceback")

    result = CliRunner().invoke(_command(bug))
    assert isinstance(result.exception, ValueError)

    def interrupted():
        raise KeyboardInterrupt

    assert CliRunner().invoke(_command(interrupted)).exit_code == 130


def test_user_errors_kinds_are_named_lazily():
    looked_up = []

    def kinds():
        looked_up.append(True)
        return (OSError,)

    @click.command()
    @user_errors(kinds)
    def cmd():
        open("/nonexistent/file")

    assert not looked_up, "named only when an error comes"
    result = CliRunner().invoke(cmd)
    assert result.exit_code == 1 and "No such file" in result.output and looked_up


def test_a_reader_that_left_ends_the_command_quietly(tmp_path):
    script = tmp_path / "cmd.py"
    script.write_text(textwrap.dedent("""
        import click
        from hfai.cli.errors import user_errors

        @click.command()
        @user_errors()
        def cmd():
            raise BrokenPipeError(32, "Broken pipe")

        cmd()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (141, "")


# ------------------------------------------------------------------------ config discovery

def test_config_file_and_the_clis_local_cluster(tmp_path, monkeypatch):
    from hfai.api.config import cli_config
    from hfai.cli.local import LocalCluster
    from hfai.core import config

    missing = tmp_path / "etc-hfai.toml"
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", missing)
    assert config.config_file({}) is None
    assert config.config_file({"HFAI_CONFIG": "/x.toml"}) == "/x.toml"
    missing.write_text('[nats]\nurl = "nats://etc:4222"\n')
    assert config.config_file({}) == missing
    assert config.load_config(env={}).nats.url == "nats://etc:4222"

    for k in [k for k in os.environ if k.startswith("HFAI_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HFAI_HOME", str(tmp_path / "home"))
    assert cli_config().nats.url == "nats://etc:4222"  # /etc/hfai/hfai.toml first
    missing.unlink()
    assert cli_config().nats.url == config.NatsConfig().url  # nothing: defaults
    local = LocalCluster(root=LocalCluster.default_root(), url="nats://local:4222")
    local.root.mkdir(parents=True)
    local.config_path.write_text('[nats]\nurl = "nats://local:4222"\n')
    local.save()
    assert cli_config().nats.url == "nats://local:4222"  # a running `hfai local`
    other = tmp_path / "other.toml"
    other.write_text('[nats]\nurl = "nats://other:4222"\n')
    monkeypatch.setenv("HFAI_CONFIG", str(other))
    assert cli_config().nats.url == "nats://other:4222"  # $HFAI_CONFIG before all


# ---------------------------------------------------------------------------- pid liveness

def test_pid_alive():
    me = psutil.Process()
    assert pid_alive(os.getpid()) and pid_alive(os.getpid(), me.create_time())
    assert not pid_alive(os.getpid(), me.create_time() - 10), "a recycled pid is another process"
    assert not pid_alive(None) and not pid_alive(0) and not pid_alive(-1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 10, "the child to exit", poll=0.05)
    assert not pid_alive(child.pid), "an exited, unreaped child is not alive"
    child.wait()
    assert not pid_alive(child.pid)


# ---------------------------------------------------------------------------- atomic writes

def test_write_atomic_mode_and_no_leftovers(tmp_path):
    secret = tmp_path / "s.creds"
    write_atomic(secret, "seed", mode=0o600)
    assert secret.read_text() == "seed" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    blocked = tmp_path / "fence"
    blocked.mkdir()
    (blocked / "x").write_text("")
    with pytest.raises(OSError):
        write_atomic(blocked, "7")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fence", "s.creds"]


def test_local_up_takes_the_usual_web_port_or_a_free_one():
    import socket

    from hfai.cli.local.daemons import free_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        other = free_port("127.0.0.1", taken)
        assert other not in (taken, 0)
    assert free_port("127.0.0.1", taken) == taken  # free again once nobody listens
