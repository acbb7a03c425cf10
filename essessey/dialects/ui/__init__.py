"""The Vercel AI SDK's UI message stream: a turn's events as the chunks ``useChat`` reads
(see docs/ui.md)."""

from essessey._public import missing_extra, set_public_module
from essessey.dialects.ui._encoder import DONE, FINISH_REASONS, UIMessageEncoder, frame

try:
    from essessey.dialects.ui._chats import (
        ChatRequest,
        TurnFactory,
        parse_chat_request,
        ui_answers,
    )
    from essessey.dialects.ui._routes import UI_MESSAGE_STREAM_HEADERS, ui_chat_routes
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None

__all__ = [
    "DONE",
    "FINISH_REASONS",
    "UI_MESSAGE_STREAM_HEADERS",
    "ChatRequest",
    "TurnFactory",
    "UIMessageEncoder",
    "frame",
    "parse_chat_request",
    "ui_answers",
    "ui_chat_routes",
]

set_public_module(__name__, globals(), __all__)
