"""Wire dialects: one turn, served in the formats clients already read (docs/dialects.md).

Each dialect is a subpackage: its encoder, built on :class:`essessey.dialects.base.DialectEncoder`
(one reading of each event, one dispatch to a hook per kind of event), and its request
parsing and routes, built on the delivery layer's public API. The SSE response delivers
each like the protocol's own SSE (pings, shutdown hand-off, stalled-client timeout,
resume by ``Last-Event-ID`` on any replica). They need the ``server`` extra (Starlette).

- :mod:`essessey.dialects.ui`: the AI SDK's UI message stream (``useChat``).
- :mod:`essessey.dialects.agui`: AG-UI events.
- :mod:`essessey.dialects.chat_completions`: OpenAI Chat Completions chunks.
- :mod:`essessey.dialects.responses`: OpenAI Responses events.
"""

__all__: list[str] = []  # each dialect is imported from its own subpackage
