"""Names, reasons, users and node names reach the terminal escaped: a job named with escape sequences
must not repaint the screen of whoever runs `hfai ps` (nor hide text with a bidi override)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from hfai.cli import common, render
from hfai.cli import main as cli_main
from hfai.protocol.errors import NotFound
from hfai.protocol.types import (
    ChainState,
    DrainedNodes,
    GpuStat,
    JobEvent,
    JobRecord,
    JobReply,
    JobSpec,
    NodeInfo,
    NodeRecord,
    NodeState,
    QuotaEntry,
    QuotaTable,
    SettingsReply,
    StoreHealth,
)

EVIL = "x\x1b[2J\x1b[31mred\x07\r\n\x9b1m\u202eevil\x00\x7f"
EVIL_SPEC = JobSpec(name=EVIL, entrypoint=("python", EVIL), workdir="/w" + EVIL, user="u" + EVIL,
                    group="g" + EVIL, env_name="e" + EVIL)
EVIL_JOB = JobRecord(id="j" + EVIL, spec=EVIL_SPEC, state=ChainState.RUNNING, submit_ts=1.0, reason="why" + EVIL,
                     nodes=("n" + EVIL,), last_nodes=("n" + EVIL,),
                     history=(JobEvent(ts=1.0, state=ChainState.QUEUED, reason="hist" + EVIL),))
EVIL_NODE = NodeInfo(record=NodeRecord(name="n" + EVIL, group="g" + EVIL, address="a", ts=1.0, seq=1,
                                       gpus=(GpuStat(index=0, name="H", utilization=1.0, memory_used=1, memory_total=2,
                                                     temperature=30.0, power_w=10.0),),
                                       gpu_source="sim" + EVIL),
                     state=NodeState.UP, age_s=0.1, jobs=("j" + EVIL,))


def assert_inert(text: str) -> None:
    """Nothing a terminal would act on: no C0/C1 control (but the table's own newlines), no DEL, no
    format characters; and the escape shows up visibly instead."""
    for line in text.split("\n"):
        bad = [c for c in line if not c.isprintable() and c != " "]
        assert not bad, (bad, line)
    assert "\\x1b" in text


def test_clean_makes_controls_visible_and_keeps_the_rest():
    assert render.clean(EVIL) == "x\\x1b[2J\\x1b[31mred\\x07\\r\\n\\x9b1m\\u202eevil\\x00\\x7f"
    for fine in ("mnist", "训练 résumé", "a b", "ideographic\u3000space", "emoji 🚀", "back\\slash"):
        assert render.clean(fine) == fine
    assert render.clean("\U000e0001tag") == "\\U000e0001tag"
    assert render.clean("zero\u200bwidth") == "zero\\u200bwidth"


@pytest.mark.parametrize("text", [
    render.jobs_table([EVIL_JOB], now=2.0),
    render.job_details(EVIL_JOB),
    render.job_details(dataclasses.replace(EVIL_JOB, state=ChainState.FAILED)),
    render.nodes_table([EVIL_NODE]),
    render.quotas_table(QuotaTable(entries=(QuotaEntry(user="u" + EVIL, priority=10, group="g" + EVIL, nodes=1),))),
])
def test_every_table_escapes_what_others_named(text):
    assert_inert(text)


def test_tables_stay_aligned_with_escaped_names():
    ok = dataclasses.replace(EVIL_JOB, id="j2", spec=dataclasses.replace(EVIL_SPEC, name="plain"), reason="r")
    lines = render.jobs_table([EVIL_JOB, ok], now=2.0).splitlines()
    assert len(lines) == 3  # the raw \r\n in the name did not break the table into more lines
    assert lines[1].index("RUNNING".lower()) == lines[2].index("running")


class FakeClient:
    """Stands in for ApiClient behind `hfai.cli.common.api()`."""

    def __init__(self, fail: Exception | None = None):
        self.fail = fail

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def _answer(self, value):
        if self.fail is not None:
            raise self.fail
        return value

    user = EVIL_SPEC.user

    async def call(self, verb, request, *, timeout=None):  # submit (job arrays go through it)
        return await self._answer(JobReply(job=EVIL_JOB))

    async def list(self, all_users=True, include_finished=True, request=None):
        return await self._answer((EVIL_JOB,))

    async def jobs(self, only):
        return tuple(j for j in await self.list() if only.match(j))

    async def status(self, job):
        return await self._answer(dataclasses.replace(EVIL_JOB, state=ChainState.QUEUED, nodes=(), last_nodes=()))

    async def stop(self, job):
        return await self._answer(EVIL_JOB)

    async def submit(self, spec, force=False):
        return await self._answer(EVIL_JOB)

    async def nodes(self):
        return await self._answer((EVIL_NODE,))

    async def nodes_and_store(self):
        # A store that refuses writes, with a detail the server's error text may carry.
        return await self._answer(((EVIL_NODE,), StoreHealth(writable=False, failures=3, detail="full" + EVIL)))

    async def drain(self, node, drain=True, reason=""):
        return await self._answer(SettingsReply(quotas=QuotaTable(), drained=DrainedNodes()))

    async def settings(self):
        return await self._answer(SettingsReply(
            quotas=QuotaTable(entries=(QuotaEntry(user="u" + EVIL, priority=10, group="*", nodes=1),)),
            drained=DrainedNodes()))


@pytest.mark.parametrize("args", [
    ["ps"], ["ps", "-a"], ["status", "j"], ["stop", "j"], ["nodes"], ["quota", "ls"], ["logs", "j"],
    ["node", "drain", "n" + EVIL], ["node", "undrain", "n" + EVIL],
    ["submit", "--name", "ok", "true"],
    ["ps", "-a", "-w", "-o", ",".join(render.JOB_COLUMNS)], ["quota"],
])
def test_cli_output_is_escaped(monkeypatch, args):
    monkeypatch.setattr(common, "api", lambda: FakeClient())
    result = CliRunner().invoke(cli_main.main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert_inert(result.output)


@pytest.mark.parametrize("args", [["ps", "--json"], ["status", "j", "--json"], ["nodes", "--json"],
                                  ["quota", "--json"], ["quota", "ls", "--json"]])
def test_json_output_is_escaped_too(monkeypatch, args):
    monkeypatch.setattr(common, "api", lambda: FakeClient())
    result = CliRunner().invoke(cli_main.main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "\\u001b" in result.output and result.output.isascii()
    assert_inert(result.output.replace("\\u001b", "\\x1b"))


@pytest.mark.parametrize("args", [["status", "j"], ["stop", "j"], ["ps"]])
def test_error_messages_are_escaped(monkeypatch, args):
    monkeypatch.setattr(common, "api", lambda: FakeClient(fail=NotFound(f"no job with id or name {EVIL}")))
    result = CliRunner().invoke(cli_main.main, args, catch_exceptions=False)
    assert result.exit_code != 0
    assert "no job with id or name" in result.output
    assert_inert(result.output)
