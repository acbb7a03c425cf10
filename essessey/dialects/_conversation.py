"""Any dialect's request, read the same way: the conversation's text and every route at once.

An agent written on a framework wants the user's words, whichever client sent them: the
AI SDK's UI messages (``parts``), AG-UI and Chat Completions messages (``content`` as a
string or a list of parts) and Responses input (a string, or items whose ``content`` is
``input_text``/``output_text`` parts, with ``instructions`` beside them). :func:`conversation`
reads each into one list of :class:`ConversationMessage`, and :func:`dialect_routes`
serves one turn factory to all four dialects and the protocol's own SSE.

Only text is read: tool calls, tool results, images and files stay in the request
(``request.messages``, ``request.input``, ``request.body``) for an app that wants them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from starlette.routing import BaseRoute

from essessey.bindings.sse import hub_routes
from essessey.dialects.agui import AGUIRunRequest, agui_routes
from essessey.dialects.chat_completions import ChatCompletionRequest, chat_completions_routes
from essessey.dialects.responses import ResponsesRequest, responses_routes
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from essessey.hub import StreamHub, TurnProducer

__all__ = [
    "ConversationMessage",
    "DialectRequest",
    "DialectTurnFactory",
    "Role",
    "conversation",
    "dialect_routes",
    "user_text",
]

logger = logging.getLogger("essessey.dialects")

DialectRequest: TypeAlias = ChatRequest | AGUIRunRequest | ChatCompletionRequest | ResponsesRequest
"""A request of any dialect: what each dialect's routes hand the app's turn factory."""

DialectTurnFactory: TypeAlias = Callable[[DialectRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(request) -> producer`` for a request of any dialect (:func:`dialect_routes`)."""

Role: TypeAlias = Literal["system", "user", "assistant"]
"""Who said a :class:`ConversationMessage`; a ``developer`` message is ``system``."""

_ROLES: Final[dict[str, Role]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
# The text parts' types: the AI SDK's and Chat Completions' ``text``, Responses'
# ``input_text`` (what the user said) and ``output_text`` (what the model said).
_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class ConversationMessage:
    """One message of a conversation, as text: who said it and what."""

    role: Role
    text: str


def conversation(request: DialectRequest) -> list[ConversationMessage]:
    """The text of every message ``request`` carries, in order, the last user message
    included: system (and developer) instructions, what the user said and what the
    assistant answered. Messages without text (tool results, a tool-only assistant
    message, an image) are left out; a message of a role it does not know is skipped
    with a log line."""
    found: list[ConversationMessage] = []
    for role, content in _messages(request):
        text = _text(content)
        if text:
            found.append(ConversationMessage(role, text))
    return found


def user_text(request: DialectRequest) -> str:
    """What the user said last in ``request`` ("" when it carries no user text): the
    prompt of an agent that keeps the conversation itself."""
    for message in reversed(conversation(request)):
        if message.role == "user":
            return message.text
    return ""


def _messages(request: DialectRequest) -> Iterator[tuple[Role, Any]]:
    """Each message's role and content, as the dialect sends them."""
    if isinstance(request, ResponsesRequest):
        instructions = request.body.get("instructions")
        if isinstance(instructions, str):
            yield "system", instructions
        if isinstance(request.input, str):
            yield "user", request.input
            return
        items: list[Any] = request.input
    else:
        items = request.messages
    parts_key = "parts" if isinstance(request, ChatRequest) else "content"
    for item in items:
        if not isinstance(item, dict):
            logger.warning("a message that is a %s, not an object; skipped", type(item).__name__)
            continue
        kind = item.get("type")
        if kind is not None and kind != "message" and isinstance(request, ResponsesRequest):
            continue  # a Responses item that is not a message: a call, an output, reasoning
        raw_role = item.get("role")
        role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            if raw_role not in ("tool", "function", "activity", "reasoning"):
                logger.warning("a message of role %s; skipped", type(raw_role).__name__)
            continue
        yield role, item.get(parts_key)


def _text(content: Any) -> str:
    """The text of a message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, dict)
        and isinstance(kind := part.get("type"), str)
        and kind in _TEXT_PARTS
        and isinstance(part.get("text"), str)
    )


def dialect_routes(
    hub: StreamHub,
    turn: DialectTurnFactory,
    *,
    ui_path: str = "/api/chat",
    agui_path: str = "/agui",
    openai_prefix: str = "/v1",
    streams_prefix: str = "/streams",
) -> Sequence[BaseRoute]:
    """Every dialect's routes for one turn factory, at each client's default path: the AI
    SDK's ``useChat`` (``ui_path``), AG-UI (``agui_path``), OpenAI Chat Completions and
    Responses (``{openai_prefix}/chat/completions``, ``{openai_prefix}/responses``) and
    the protocol's own SSE with its resume, cancel and answer routes
    (``streams_prefix``). Each dialect's own routes function takes its options
    (``max_body``, the SSE options) for an app that needs them."""
    return [
        *ui_chat_routes(hub, turn, path=ui_path),
        *agui_routes(hub, turn, path=agui_path),
        *chat_completions_routes(hub, turn, path=f"{openai_prefix}/chat/completions"),
        *responses_routes(hub, turn, path=f"{openai_prefix}/responses"),
        *hub_routes(hub, streams_prefix),
    ]
