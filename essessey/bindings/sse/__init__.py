"""The SSE binding: the WHATWG event stream format, an ASGI response that streams a turn
to browsers, and a Source that reads any SSE stream back into events.

``encode``/``format_message`` write the format and ``SSEDecoder`` reads it (no
dependencies). ``EventStreamResponse`` needs the ``server`` extra (Starlette);
``connect`` needs httpx.
"""

from __future__ import annotations

from essessey.bindings.sse._writer import encode, encode_many, format_message

__all__ = ["encode", "encode_many", "format_message"]
