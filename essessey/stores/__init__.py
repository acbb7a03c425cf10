"""Event stores: where a stream's events wait for the clients that resume it.

The contract (what a :class:`~essessey.StreamHub` asks of a store, and the optional
capabilities it looks for once) and the in-memory store live here; the stores that
replicas share are subpackages, each on its extra:

- :class:`InMemoryEventStore`: one process (no extra).
- :mod:`essessey.stores.redis`: ``RedisEventStore`` on Redis Streams (``essessey[redis]``).
- :mod:`essessey.stores.jetstream`: ``JetStreamEventStore`` on NATS JetStream
  (``essessey[nats]``).

To write a store of your own, implement :class:`EventStore` (and
:class:`SharedEventStore` for one that replicas share) and run
:mod:`essessey.testing`'s conformance suite against it; docs/resume.md has the table.
"""

from __future__ import annotations

from essessey._public import set_public_module
from essessey.stores._contract import (
    AppendsWithoutWaiting as AppendsWithoutWaiting,
)
from essessey.stores._contract import (
    DeliversInAppend as DeliversInAppend,
)
from essessey.stores._contract import (
    EventStore,
    SharedEventStore,
)
from essessey.stores._contract import (
    KnowsEventIds as KnowsEventIds,
)
from essessey.stores._contract import (
    StreamAppender as StreamAppender,
)
from essessey.stores._contract import (
    Taker as Taker,
)
from essessey.stores._memory import InMemoryEventStore

# AppendsWithoutWaiting, DeliversInAppend, KnowsEventIds, StreamAppender and Taker are
# imported for the hub and the bindings, not exported: speed capabilities of the stores
# here that a store of yours need not implement, and what the bindings hand them.

__all__ = [
    "EventStore",
    "InMemoryEventStore",
    "SharedEventStore",
]

set_public_module(__name__, globals(), __all__)
