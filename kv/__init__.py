"""The KV layer (folder kv/): live copies of JetStream KV buckets and compare-and-set writes.

Below the controller, the agent and storage, above ``hfai.protocol`` (docs/architecture.md, "Layers").
"""

from hfai.kv.cache import KVCache
from hfai.kv.cas import cas_update, cas_value

__all__ = ["KVCache", "cas_update", "cas_value"]
