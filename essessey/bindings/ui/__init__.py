"""The Vercel AI SDK's UI message stream: a turn's events as the chunks ``useChat`` reads
(see docs/ui.md)."""

from essessey.bindings.ui._encoder import DONE, FINISH_REASONS, UIMessageEncoder, frame
from essessey.bindings.ui._routes import (
    UI_MESSAGE_STREAM_HEADERS,
    ChatRequest,
    TurnFactory,
    parse_chat_request,
    ui_chat_routes,
)

__all__ = [
    "DONE",
    "FINISH_REASONS",
    "UI_MESSAGE_STREAM_HEADERS",
    "ChatRequest",
    "TurnFactory",
    "UIMessageEncoder",
    "frame",
    "parse_chat_request",
    "ui_chat_routes",
]

for _name in __all__:
    _value = globals()[_name]
    if hasattr(_value, "__module__") and isinstance(_value, type):
        _value.__module__ = __name__
