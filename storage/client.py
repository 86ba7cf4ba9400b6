"""The client of the storage service: :class:`StorageClient`, one request at a time over
``hfai.storage.<user>.<verb>``, and how much one message may carry within the NATS server's
max_payload. What a workspace's push and pull do with it:

- :mod:`hfai.storage.push`: a push, from the walk to the commit (and ``--dry-run``'s question);
- :mod:`hfai.storage.pull`: a pull;
- :mod:`hfai.storage.manifest`: the tree hashed into a manifest, and what of it the cluster lacks;
- :mod:`hfai.storage.transport`: chunks and requests packed into messages, and sent;
- :mod:`hfai.storage.marker`: what a push records in ``.hfai`` (the local index, its journal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Self, TypeVar

from hfai.api.client import ApiClient
from hfai.core.config import Config
from hfai.protocol import encode, names
from hfai.protocol.codec import Encoded
from hfai.protocol.errors import ErrorSub, HfaiError, InvalidRequest, Unavailable
from hfai.protocol.verbs import Verb

#: Room left in a message beside its chunks (the request's other fields, msgpack's framing); at
#: most a quarter of a small max_payload.
ENVELOPE_BYTES = 64 * 1024
#: What one chunk costs a put or fetch beside its bytes: its name in the request, again in
#: ``whole`` and in the reply's list of names (64 hex digits each), and msgpack's framing. A put
#: of many tiny files is bounded by their count as much as by their bytes.
CHUNK_COST = 160
#: A request's fixed fields (workspace, file key, envelope), bounded by the names' limits.
FRAME_BYTES = 4096

Req = TypeVar("Req")
Rep = TypeVar("Rep")


class StorageClient:
    """The storage service's client: its verbs (hfai.protocol.storage's table) sent through an
    API client's public requests, on the service's subjects. Used as ``async with
    StorageClient(config) as client:`` (it opens and closes its own :class:`ApiClient`), or
    around a connected one (``StorageClient(api=...)``), which it leaves open."""

    def __init__(self, config: Config | None = None, user: str | None = None, *, api: ApiClient | None = None):
        if api is None:
            if config is None:
                raise TypeError("StorageClient needs a config or an ApiClient")
            api = ApiClient(config, user)
        self.api = api
        self._owned = config is not None

    @property
    def user(self) -> str:
        return self.api.user

    async def __aenter__(self) -> Self:
        if self._owned:
            await self.api.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        if self._owned:
            await self.api.close()

    async def scall(self, verb: Verb[Req, Rep], request: Req | Encoded, *, timeout_s: float | None = None) -> Rep:
        """One request to the storage service (``verb``: an entry of hfai.protocol.storage's
        table), its typed reply; sent again as the verb's ``repeatable`` allows. ``request``: of
        the verb's type, or one encoded already (a commit's, packed). ``timeout_s``: other than
        ``[nats] request_timeout_s``."""
        verb.check(request)
        subject = names.storage_subject(self.api.user, verb.name, operator=self.api.operator)
        # Here, not at the top: hfai.api.client loads nats-py first, its own way (api/_light_nats.py:
        # without aiohttp); by now it has.
        import nats.errors

        try:
            return await self.api.request(subject, request, verb.reply, timeout=timeout_s,
                                          repeatable=verb.repeatable)
        except Unavailable as e:
            if e.sub is ErrorSub.NO_RESPONDERS:
                raise Unavailable("no storage service answers; is `hfai-storage` running?",
                                  sub=ErrorSub.NO_RESPONDERS) from None
            raise
        except nats.errors.MaxPayloadError:
            raise InvalidRequest(f"a {verb.name} request of {len(encode(request))} bytes is over the NATS server's "
                                 f"max_payload ({self.api.max_payload} bytes); this client should have split it: "
                                 "please report it") from None
        except nats.errors.Error as e:
            raise Unavailable(f"NATS: {e or type(e).__name__} (during {verb.name}); push again") from None

    def room(self) -> int:
        """The most bytes one message may carry beside its envelope, within the max_payload the
        NATS server announced (a larger message is refused): read from the connection, never
        assumed."""
        announced = self.api.max_payload
        return max(1, announced - min(ENVELOPE_BYTES, announced // 4))

    def message_bytes(self) -> int:
        """The most bytes of chunks and their costs (:data:`CHUNK_COST`) one message may carry."""
        return max(1, self.api.max_payload - FRAME_BYTES)

    def request_size(self, configured: int) -> int:
        """The most chunk bytes one put or fetch carries: ``configured`` ([storage] request_bytes),
        within :meth:`room`."""
        return max(1, min(configured, self.room()))


@contextlib.contextmanager
def typed_errors(what: str, verb: str, when: str) -> Iterator[None]:
    """Every failure of a push or pull as an HfaiError (the CLI prints one line, never a
    traceback): a local file's (``verb``: "read", "write") is InvalidRequest naming it."""
    try:
        yield
    except HfaiError:
        raise
    except TimeoutError as e:  # an OSError too: not a file's
        raise Unavailable(f"timed out during the {what} ({e or 'no answer'}); {what} again") from None
    except OSError as e:
        raise InvalidRequest(f"cannot {verb} {e.filename or 'a file of the workspace'} ({e.strerror or e}); "
                             f"{what} again {when}") from None
