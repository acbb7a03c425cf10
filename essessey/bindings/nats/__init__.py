"""The NATS binding (extra ``essessey[nats]``, on nats-py): events on subjects
``<prefix>.<stream_id>.<event>``, the payload as the message body unchanged and the event
id in the ``Essessey-Event-Id`` header. Core NATS (:class:`NATSSink`, :class:`NATSSource`)
is live fan-out without replay; the JetStream store
(:mod:`essessey.stores.jetstream`) keeps streams on the same subjects so a reader can
resume on any replica.
"""

from __future__ import annotations

from essessey._public import missing_extra, set_public_module

try:
    from essessey.bindings.nats._core import (
        DEFAULT_PREFIX,
        HEADER_EVENT_ID,
        MAX_PREFIX_BYTES,
        NATSSink,
        NATSSource,
        check_token,
        event_subject,
        parse_subject,
        subscribe_all,
        subscribe_stream,
    )
except ModuleNotFoundError as exc:  # the nats extra is not installed
    raise missing_extra(__name__, exc, extra="nats") from None


__all__ = [
    "DEFAULT_PREFIX",
    "HEADER_EVENT_ID",
    "MAX_PREFIX_BYTES",
    "NATSSink",
    "NATSSource",
    "check_token",
    "event_subject",
    "parse_subject",
    "subscribe_all",
    "subscribe_stream",
]

set_public_module(__name__, globals(), __all__)
