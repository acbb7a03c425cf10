"""The Redis backend (extra ``essessey[redis]``, on the ``redis`` package's asyncio
client): :class:`RedisEventStore` keeps streams in Redis Streams, so a reader can resume on
any replica. See docs/redis.md.
"""

from __future__ import annotations

from essessey.bindings.redis._store import RedisEventStore, RedisUnavailable

__all__ = ["RedisEventStore", "RedisUnavailable"]
