"""The Redis backend (extra ``essessey[redis]``, on the ``redis`` package's asyncio
client): :class:`RedisEventStore` keeps streams in Redis Streams, so a reader can resume on
any replica. See docs/redis.md.
"""

from __future__ import annotations

from essessey._public import set_public_module
from essessey.stores.redis._store import RedisEventStore, RedisStoreOptions

__all__ = ["RedisEventStore", "RedisStoreOptions"]

set_public_module(__name__, globals(), __all__)
