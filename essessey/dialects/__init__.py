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

This package itself holds what reads a request of any dialect the same way
(:func:`conversation`, :func:`user_text`) and :func:`dialect_routes`, which serves one turn
factory to all four (docs/dialects.md); each dialect's own names are imported from its
subpackage.
"""

from typing import TYPE_CHECKING, Any, Final

from essessey._public import import_lazily, public_dir

if TYPE_CHECKING:
    from essessey.dialects._conversation import ConversationMessage as ConversationMessage
    from essessey.dialects._conversation import DialectRequest as DialectRequest
    from essessey.dialects._conversation import DialectTurnFactory as DialectTurnFactory
    from essessey.dialects._conversation import Role as Role
    from essessey.dialects._conversation import conversation as conversation
    from essessey.dialects._conversation import dialect_routes as dialect_routes
    from essessey.dialects._conversation import user_text as user_text

_NEEDS_STARLETTE: Final = {
    "ConversationMessage": "_conversation",
    "DialectRequest": "_conversation",
    "DialectTurnFactory": "_conversation",
    "Role": "_conversation",
    "conversation": "_conversation",
    "dialect_routes": "_conversation",
    "user_text": "_conversation",
}

__all__ = sorted(_NEEDS_STARLETTE)


def __getattr__(name: str) -> Any:
    # The dialects' routes need Starlette (the ``server`` extra): imported on first use,
    # so the base encoder imports without it.
    return import_lazily(__name__, _NEEDS_STARLETTE, name, extra="server")


def __dir__() -> list[str]:
    return public_dir(globals(), __all__)
