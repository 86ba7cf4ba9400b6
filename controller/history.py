"""The telemetry history: a JetStream stream over every node's telemetry subject, kept for
``[web] telemetry_max_age_s`` (one hour by default), so hfai-web shows the last hour after a
restart without a database. The agents already publish each heartbeat on
``hfai.telemetry.<node>``; the stream only keeps them. Agents may not create streams, so the
controllers do (and update the limit when the configuration changes it)."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from hfai.core.config import Config
from hfai.core.nats import is_transient
from hfai.protocol import names


def telemetry_stream_config(config: Config) -> StreamConfig:
    return StreamConfig(
        name=names.TELEMETRY_STREAM, subjects=[names.TELEMETRY_WILDCARD],
        max_age=config.web.telemetry_max_age_s, num_replicas=config.nats.replicas,
        storage=StorageType.FILE, discard=DiscardPolicy.OLD,
    )


async def ensure_telemetry_stream(js: JetStreamContext, config: Config) -> None:
    cfg = telemetry_stream_config(config)
    try:
        info = await js.stream_info(names.TELEMETRY_STREAM)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(cfg)
        except nats.js.errors.APIError as e:
            if is_transient(e):
                raise  # JetStream cannot place it yet: the caller tries again (core.nats.retry_setup)
            await js.stream_info(names.TELEMETRY_STREAM)  # created by another replica meanwhile
        return
    if info.config.max_age != cfg.max_age:
        await js.update_stream(cfg)
