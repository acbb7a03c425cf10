"""The Redis backend (extra ``essessey[redis]``, on the ``redis`` package's asyncio
client): :class:`RedisEventStore` keeps streams in Redis Streams, so a reader can resume on
any replica. See docs/redis.md.
"""

from __future__ import annotations

from essessey._public import missing_extra, set_public_module

try:
    from essessey.stores.redis._store import RedisEventStore, RedisStoreOptions
except ModuleNotFoundError as exc:  # the redis extra is not installed
    raise missing_extra(__name__, exc, extra="redis") from None

__all__ = ["RedisEventStore", "RedisStoreOptions"]

set_public_module(__name__, globals(), __all__)
