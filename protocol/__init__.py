"""hfai.protocol: the wire contract between CLI, controller and agents. No I/O lives here.

* :mod:`hfai.protocol.types`    - every enum and frozen message dataclass (each has a ``kind`` tag) by
  name, from the modules of their domains: ``messages`` (the registry, ``message``, ``ErrorReply``),
  ``jobs``, ``nodes``, ``runs``, ``settings``, ``storage``
* :mod:`hfai.protocol.codec`    - the one msgpack codec, with a versioned envelope
* :mod:`hfai.protocol.reasons`  - why a job is where it is, as a typed value, and its words
* :mod:`hfai.protocol.names`    - every subject, stream, bucket and consumer name
* :mod:`hfai.protocol.errors`   - the typed error tree shared by all components
"""

from hfai.protocol.codec import PROTOCOL_VERSION, decode, encode
from hfai.protocol.errors import ProtocolError

__all__ = ["PROTOCOL_VERSION", "ProtocolError", "decode", "encode"]
