"""The shape every provider adapter's ``publish`` and ``stream_round`` share.

A ``publish`` reads the provider's stream into a message: the preamble and the content
go out as the stream is read (the adapter knows when the preamble can, once the model
is named), then the message ends with its epilogue or with the provider's error, and
an exception on the way ends the stream with an ``error`` event before it propagates,
so no client waits for a message that will never end. :func:`publish_message` is that
skeleton; an adapter passes in only how it reads its provider's stream and how that
stream ended (:class:`Ending`). :func:`require_round` is the guard of every
``stream_round``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from essessey._failure import send_failure
from essessey.adapters.rounds import RoundStream
from essessey.errors import ProviderStreamError, RoundOrderError
from essessey.publisher import Publisher

__all__ = ["Ending", "publish_message", "require_round"]

R = TypeVar("R")


def require_round(rounds: RoundStream) -> None:
    """Refuse a ``stream_round`` outside a started round, before its stream is read.

    Checked first, so a misuse costs nothing of the provider's stream (a network stream
    cannot be read twice) and publishes nothing.
    """
    if not rounds.in_round:
        raise RoundOrderError("stream_round needs a started round: call round_start first")


@dataclass(frozen=True, slots=True)
class Ending:
    """How a provider's message ends, once its stream is read.

    ``stop_reason`` and ``usage`` (the provider's token counts) go into the epilogue.
    With ``error`` (the provider's, in its stream) the message ends with that ``error``
    event instead of ``message_stop``; ``delta_before_error`` sends the
    ``message_delta`` (stop reason and usage so far) before it.
    """

    stop_reason: str | None
    usage: Mapping[str, int]
    error: ProviderStreamError | None = None
    delta_before_error: bool = False


def _never() -> bool:
    return False


async def publish_message(
    publisher: Publisher,
    read: Callable[[], Awaitable[tuple[R, Ending | None]]],
    *,
    rounds: RoundStream | None = None,
    complete: Callable[[], bool] = _never,
    what: str = "the turn failed",
) -> R:
    """Read a provider's stream into one message and end it; return what ``read`` did.

    ``read`` reads the whole stream, publishing the preamble and the content as they
    come, and returns its result and how the message ends; None when the stream carried
    the message's end itself (a proxy that passes the provider's frame events on). A
    round of ``rounds`` still open then ends without answering its calls: their results
    belong to the next message. If anything raises, an ``error`` event naming only the
    exception's class (``f"{what}: ..."``) ends the stream, unless ``complete()`` says
    the message already ended for its clients, and the exception propagates.
    """
    try:
        result, ending = await read()
        if ending is not None:
            if rounds is not None and rounds.in_round:
                await rounds.round_end(answer_missing=False)
            # Inside the try: a failed epilogue must still end the stream for its clients.
            await _end(publisher, ending)
    except Exception as exc:
        if not complete():
            await send_failure(publisher, exc, what=what)
        raise
    return result


async def _end(publisher: Publisher, ending: Ending) -> None:
    # Any: mypy cannot tell these keyword arguments from stop_sequence.
    usage: dict[str, Any] = {k: v for k, v in ending.usage.items() if k != "output_tokens"}
    output_tokens = ending.usage.get("output_tokens", 0)
    if ending.error is None:
        await publisher.send_stream_epilogue(ending.stop_reason, output_tokens, **usage)
        return
    if ending.delta_before_error:
        await publisher.send_message_delta(ending.stop_reason, output_tokens, **usage)
    await send_failure(publisher, ending.error)
