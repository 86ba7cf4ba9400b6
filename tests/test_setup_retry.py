"""A controller started together with its NATS cluster waits for JetStream to place what it makes
beyond the buckets (the telemetry stream, the usage bucket: core.nats.retry_setup), instead of
dying on "no suitable peers for placement" as a peer is still joining (seen in CI under load:
the local cluster then never came up)."""

from __future__ import annotations

import asyncio
import dataclasses

import nats.js.errors
import pytest

from hfai.controller import history
from hfai.core import nats as _nats
from hfai.core.config import Config

CONFIG = Config()
FAST = dataclasses.replace(CONFIG, nats=dataclasses.replace(CONFIG.nats, setup_retry_s=0.01))


def _no_peers() -> nats.js.errors.APIError:
    return nats.js.errors.BadRequestError(code=400, err_code=10005,
                                          description="no suitable peers for placement, peer offline")


def test_a_transient_refusal_is_tried_again_and_anything_else_raises():
    calls = []

    async def step():
        calls.append(1)
        if len(calls) < 3:
            raise _no_peers()
        return "made"

    assert asyncio.run(_nats.retry_setup(step, FAST, "a test stream")) == "made" and len(calls) == 3

    async def refused():
        raise nats.js.errors.BadRequestError(code=400, err_code=10052, description="replicas > 1 not supported")

    with pytest.raises(nats.js.errors.APIError):
        asyncio.run(_nats.retry_setup(refused, FAST, "a test stream"))


class _JS:
    """JetStream as a cluster still placing its peers answers the telemetry stream's creation."""

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.made = False

    async def stream_info(self, name):
        if not self.made:
            raise nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found")
        return None

    async def add_stream(self, cfg):
        if self.refusals:
            self.refusals -= 1
            raise _no_peers()
        self.made = True


def test_the_telemetry_stream_waits_for_placement():
    js = _JS(refusals=2)
    asyncio.run(_nats.retry_setup(lambda: history.ensure_telemetry_stream(js, FAST), FAST, "the telemetry stream"))
    assert js.made
