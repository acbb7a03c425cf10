"""The JetStream store (extra ``essessey[nats]``, on nats-py): :class:`JetStreamEventStore`
keeps streams in a NATS JetStream stream, on the subjects the NATS binding
(:mod:`essessey.bindings.nats`) publishes to, so a reader can resume on any replica. See
docs/nats.md.
"""

from __future__ import annotations

from essessey._public import missing_extra, set_public_module

try:
    from essessey.stores.jetstream._context import CONTROL_EVENT, CONTROL_HEADER
except ModuleNotFoundError as exc:  # the nats extra is not installed
    raise missing_extra(__name__, exc, extra="nats") from None
from essessey.stores.jetstream._store import JetStreamEventStore, JetStreamStoreOptions

__all__ = [
    "CONTROL_EVENT",
    "CONTROL_HEADER",
    "JetStreamEventStore",
    "JetStreamStoreOptions",
]

set_public_module(__name__, globals(), __all__)
