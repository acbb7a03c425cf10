"""What a WebSocket endpoint does about a client that stops reading: the connection reset
when a send stalls, not held with its unsent bytes until the client leaves."""

from __future__ import annotations

from collections.abc import Callable

from essessey.bindings._uvicorn import connection_aborter, limit_unacknowledged

__all__ = ["stall_guard"]


def stall_guard(send_timeout: float | None) -> Callable[[], bool]:
    """Prepare the current WebSocket connection for a send that stalls; call it from the
    endpoint's own task, when the connection opens.

    Returns the function to call once a send has stalled past ``send_timeout``: it resets
    the connection when the server lets essessey reach it (uvicorn) and it still holds
    bytes the client has not taken, and says whether it did. Then send no close frame: it
    would wait behind the frames the client is not reading, and the server would hold the
    socket, its buffers and those frames until the client reads or leaves. Also has the
    kernel end the connection when what it sent stays unacknowledged a few seconds past
    ``send_timeout`` (a client whose network went away without a word). Under another
    server the function resets nothing and returns False: close the connection as usual.
    """
    abort = connection_aborter()
    limit_unacknowledged(send_timeout)
    return abort
