"""Wire dialects: one turn, served in the formats clients already read (docs/dialects.md).

Each dialect is one module: an encoder from the protocol's events to its own frames (a
:class:`~essessey.bindings.sse.FrameEncoder`, delivered by the SSE response like the
protocol's own SSE: pings, shutdown hand-off, stalled-client timeout, resume by
``Last-Event-ID`` on any replica) and the routes its clients call. They need the
``server`` extra (Starlette).

- :mod:`essessey.dialects.chat_completions`: OpenAI Chat Completions chunks.

The AI SDK's UI message stream is :mod:`essessey.dialects.ui`.
"""

__all__: list[str] = []  # each dialect is imported from its own module
