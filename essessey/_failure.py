"""The ``error`` event that ends a stream when its producer fails.

Every helper that runs a message for its caller (the turn helper, the round helper, the
provider adapters) ends the stream this way when the body raises, so no client waits
for a message that will never end. One definition, so the event says the same thing
whoever sends it.
"""

from __future__ import annotations

import logging

from essessey.errors import ProviderStreamError
from essessey.publisher import Publisher

__all__ = ["send_failure"]

logger = logging.getLogger("essessey")


async def send_failure(
    publisher: Publisher,
    exc: BaseException,
    *,
    error_type: str = "api_error",
    what: str = "the turn failed",
) -> None:
    """Send the ``error`` event for ``exc``; never raises.

    A :class:`ProviderStreamError` goes out with the provider's own type and message
    (the provider chose to tell its client). Any other exception is named by its class
    only, as ``f"{what}: {ClassName}"``: its message may hold model output or a
    credential. A failure to send is logged by its class and swallowed, so the caller
    can re-raise the exception that matters.
    """
    try:
        if isinstance(exc, ProviderStreamError):
            await publisher.send_error(exc.error_type, exc.message, request_id=exc.request_id)
        else:
            await publisher.send_error(error_type, f"{what}: {type(exc).__name__}")
    except Exception as send_exc:
        logger.error("could not send the error event: %s", type(send_exc).__name__)
