"""What a stream id and an event id taken from a request may be: one rule for the SSE
routes, the WebSocket endpoint and the NATS subjects, so that an id one of them accepts is
one the others accept too.

- A **stream id** (and any NATS subject token: a prefix token, an event name) is 1 to
  :data:`MAX_ID_LENGTH` printable characters, none of them whitespace, ``.``, ``*`` or
  ``>``. Whitespace ends a NATS subject, ``.`` splits it, ``*`` and ``>`` are wildcards;
  unprintable characters (controls, NUL) have no business in a URL or a log line. This
  also refuses ``..`` and anything holding ``%00`` once decoded.
- A **last event id** is opaque: 1 to :data:`MAX_ID_LENGTH` printable characters.
- A **message id** essessey makes itself (a continuation's, a framework run's) is
  ``msg_`` and 24 random hex digits: :func:`new_message_id`.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

__all__ = [
    "MAX_ID_LENGTH",
    "check_token",
    "is_event_id",
    "is_stream_id",
    "is_token",
    "new_message_id",
    "parse_event_id",
]

MAX_ID_LENGTH: Final = 256
"""The longest stream id or last event id accepted from a request, in characters (and the
longest NATS subject token: nats-server closes a connection whose command line passes its
``max_control_line``, 4 KiB by default)."""

_NOT_IN_A_TOKEN: Final = re.compile(r"[\s.*>]")


def is_token(value: str) -> bool:
    """Whether ``value`` can be one NATS subject token (a prefix token, an event name)."""
    return (
        0 < len(value) <= MAX_ID_LENGTH
        and value.isprintable()
        and _NOT_IN_A_TOKEN.search(value) is None
    )


def is_stream_id(value: str) -> bool:
    """Whether ``value`` is a valid stream id: one subject token, so every backend can
    carry it (see above)."""
    return is_token(value)


def is_event_id(value: str) -> bool:
    """Whether ``value`` is a valid last event id for a request."""
    return 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()


def parse_event_id(event_id: str, epoch: str) -> int | None:
    """The sequence in an id ``<epoch>-<seq>`` as the stores issue them, when ``event_id``
    is spelled exactly so for ``epoch``, else None: ASCII digits only (``str.isdigit``
    also accepts digits ``int()`` refuses, such as "²"), no sign, no leading zero, at most
    18 digits. Every store reads ids with this one rule, so none accepts an id another
    would refuse."""
    id_epoch, _, seq_text = event_id.rpartition("-")
    if (
        id_epoch != epoch
        or not seq_text.isascii()
        or not seq_text.isdigit()
        or len(seq_text) > 18
        or seq_text[0] == "0"
    ):
        return None
    return int(seq_text)


def is_first_event_id(event_id: str | None) -> bool | None:
    """Whether ``event_id`` is a stream's first event's, as the stores issue ids
    (``<epoch>-1``); None when it is not spelled as they issue them (another store's),
    which says nothing."""
    if not event_id:
        return None
    epoch, _, _ = event_id.rpartition("-")
    seq = parse_event_id(event_id, epoch) if epoch else None
    return None if seq is None else seq == 1


def check_token(value: str, what: str = "token") -> str:
    """Return ``value`` when it can be one NATS subject token, else raise ``ValueError``.

    A token is 1 to 256 (``MAX_ID_LENGTH``) printable characters, none of them ``.``,
    ``*``, ``>`` or whitespace: the rule the SSE and WebSocket endpoints apply to stream ids
    too. ``what`` names the value in the error ("stream id", "event name").
    """
    if not isinstance(value, str):
        raise TypeError(f"a {what} must be a str, not {type(value).__name__}")
    if not is_token(value):
        shown = value if len(value) <= 80 else value[:80] + "…"
        raise ValueError(
            f"invalid {what} {shown!r} ({len(value)} characters): a NATS subject token must "
            f"be 1 to {MAX_ID_LENGTH} printable characters, with no '.', '*', '>' or "
            "whitespace"
        )
    return value


def new_message_id() -> str:
    """A fresh message id, as the Anthropic API's are shaped (``msg_`` and random hex)."""
    return "msg_" + secrets.token_hex(12)
