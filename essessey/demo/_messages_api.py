"""A fake Anthropic Messages endpoint: ``POST /v1/messages`` with a scripted reply.

It checks a request as the real API does where that matters to a client (``model``,
``max_tokens``, ``messages``, ``stream``, ``thinking``, ``tools``, ``tool_choice``) and
answers with the same reply every time, so a client can be tested against it without a
key or a network:

- a thinking block (with a signature) when ``thinking`` is enabled (``{"type": "enabled",
  "budget_tokens": N}``, N >= 1024 and below ``max_tokens``) or adaptive;
- text, one word per delta;
- a ``tool_use`` call of the first tool given (or the one ``tool_choice`` names), its
  input built from the tool's ``input_schema`` (each required property gets a value of
  its type), and stop reason ``tool_use``; ``end_turn`` without tools (or with
  ``tool_choice`` ``none``); ``max_tokens`` when ``max_tokens`` words cut the reply short
  (one word is one token here, and so is a tool call);
- a forced tool choice (``any`` or ``tool``) answers with the tool call alone, no text
  before it: the real API pre-fills the assistant turn so that the call comes first, and
  clients that force a tool read the first block as the call. Thinking together with a
  forced tool choice is refused with a 400, as the real API refuses it.

``"stream": true`` streams it in the ``anthropic`` dialect (what the official SDKs read);
otherwise the whole message comes as JSON. The reply never depends on what the messages
say, and nothing of them is logged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

import orjson
from starlette.requests import Request
from starlette.responses import Response

from essessey import Publisher, StopReason, stream_turn
from essessey.bindings.http import BadRequest, read_json
from essessey.bindings.sse import EventStreamResponse

__all__ = [
    "FORCED_TOOL_WITH_THINKING",
    "MAX_MESSAGES_BODY",
    "MessagesRequest",
    "ScriptedReply",
    "messages_endpoint",
]

logger = logging.getLogger("essessey.demo")

MAX_MESSAGES_BODY: Final = 1024 * 1024
"""The largest ``/v1/messages`` body read, in bytes (a larger one gets 413)."""

MIN_THINKING_BUDGET: Final = 1024
_MAX_SCHEMA_DEPTH: Final = 8
# What one request's arguments may hold at most, in values (a string counts one per 64
# characters): nested arrays multiply, and a small schema would otherwise ask for
# gigabytes (4 levels of 16 items around a 1,024-character string: 67 MB).
_MAX_SAMPLE_VALUES: Final = 4096

_THINKING: Final = (
    "This endpoint is scripted: it does not read the conversation, "
    "and it answers the same way every time."
)
_TEXT: Final = (
    "Hello! This is the scripted reply of the essessey demo server. It does not read your "
    "messages, and it answers the same way every time."
)
_SIGNATURE: Final = "ZXNzZXNzZXktZGVtby1zaWduYXR1cmU="  # not a real signature: a fixed marker
_ROLES: Final = ("user", "assistant")
_TOOL_CHOICES: Final = ("auto", "any", "tool", "none")

FORCED_TOOL_WITH_THINKING: Final = "Thinking may not be enabled when tool_choice forces tool use."
"""The 400 message for ``thinking`` with a forced ``tool_choice`` (the real API's words)."""


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """What the reply depends on, from a valid request."""

    model: str
    max_tokens: int
    stream: bool
    thinking: bool
    tool: Mapping[str, Any] | None
    forced_tool: bool
    input_tokens: int


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """The reply to a request: thinking and text as their deltas, the tool call (id, name,
    input) if any, why it stopped, and its usage."""

    message_id: str
    model: str
    thinking: tuple[str, ...]
    signature: str | None
    text: tuple[str, ...]
    tool_call: tuple[str, str, dict[str, Any]] | None
    stop_reason: str
    input_tokens: int
    output_tokens: int

    def message(self) -> dict[str, Any]:
        """The whole message, as the API answers a request without ``stream``."""
        content: list[dict[str, Any]] = []
        if self.thinking:
            content.append(
                {
                    "type": "thinking",
                    "thinking": "".join(self.thinking),
                    "signature": self.signature or "",
                }
            )
        if self.text:
            content.append({"type": "text", "text": "".join(self.text)})
        if self.tool_call is not None:
            tool_use_id, name, tool_input = self.tool_call
            content.append(
                {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}
            )
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }

    async def publish(self, publisher: Publisher) -> None:
        """Stream the reply through ``publisher`` (a producer for EventStreamResponse)."""
        async with stream_turn(
            publisher,
            message_id=self.message_id,
            stream_id=self.message_id,
            model=self.model,
            input_tokens=self.input_tokens,
        ) as turn:
            if self.thinking:
                thinking = await turn.thinking()
                for chunk in self.thinking:
                    await thinking.write(chunk)
                if self.signature:
                    await thinking.write_signature(self.signature)
            if self.text:
                text = await turn.text()
                for chunk in self.text:
                    await text.write(chunk)
            if self.tool_call is not None:
                tool_use_id, name, tool_input = self.tool_call
                await turn.close_current()
                index = turn.next_index
                arguments = orjson.dumps(tool_input).decode()
                cut = len(arguments) // 2
                # A tool call the caller runs: no result block, as the API streams it.
                await publisher.send_tool_use_start(index, tool_use_id, name)
                for fragment in (arguments[:cut], arguments[cut:]):
                    if fragment:
                        await publisher.send_tool_input_delta(index, fragment)
                await publisher.send_content_block_stop(index)
            turn.stop_reason = self.stop_reason
            turn.output_tokens = self.output_tokens


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request(body: Any) -> MessagesRequest:
    """Check a Messages API request body; BadRequest names the first problem found."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if "model" not in body:
        raise BadRequest("model: Field required")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: must be a non-empty string")
    if "max_tokens" not in body:
        raise BadRequest("max_tokens: Field required")
    max_tokens = body["max_tokens"]
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens: must be an integer >= 1")
    if "messages" not in body:
        raise BadRequest("messages: Field required")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list")
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages.{n}: must be an object")
        if message.get("role") not in _ROLES:
            raise BadRequest(f"messages.{n}.role: must be 'user' or 'assistant'")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise BadRequest(f"messages.{n}.content: must be a string or a list of blocks")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be a boolean")
    thinking = _thinking(body.get("thinking"), max_tokens)
    tool, forced = _chosen_tool(body.get("tools"), body.get("tool_choice"))
    if thinking and forced:
        # The real API's own words: a forced call pre-fills the assistant turn, which
        # leaves no room for a thinking block before it.
        raise BadRequest(FORCED_TOOL_WITH_THINKING)
    return MessagesRequest(
        model=model,
        max_tokens=max_tokens,
        stream=stream,
        thinking=thinking,
        tool=tool,
        forced_tool=forced,
        input_tokens=_input_tokens(body),
    )


def _thinking(thinking: Any, max_tokens: int) -> bool:
    if thinking is None:
        return False
    if not isinstance(thinking, dict):
        raise BadRequest("thinking: must be an object")
    kind = thinking.get("type")
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return True
    if kind != "enabled":
        raise BadRequest("thinking.type: must be 'enabled', 'disabled' or 'adaptive'")
    budget = thinking.get("budget_tokens")
    if not _is_int(budget) or budget < MIN_THINKING_BUDGET:
        raise BadRequest(f"thinking.budget_tokens: must be an integer >= {MIN_THINKING_BUDGET}")
    if budget >= max_tokens:
        raise BadRequest("thinking.budget_tokens: must be less than max_tokens")
    return True


def _chosen_tool(tools: Any, tool_choice: Any) -> tuple[Mapping[str, Any] | None, bool]:
    """The tool the reply calls (None for none) and whether the choice forces it."""
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: must be a list")
        for n, tool in enumerate(tools):
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"tools.{n}: must be an object with a non-empty name")
            schema = tool.get("input_schema")
            if schema is not None and not isinstance(schema, dict):
                raise BadRequest(f"tools.{n}.input_schema: must be an object")
    if tool_choice is None:
        tool_choice = {"type": "auto"}
    if not isinstance(tool_choice, dict):
        raise BadRequest("tool_choice: must be an object")
    choice = tool_choice.get("type")
    if choice not in _TOOL_CHOICES:
        raise BadRequest("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'")
    forced = choice in ("any", "tool")
    if not tools:
        if forced:
            raise BadRequest("tool_choice: forcing a tool needs tools to choose from")
        return None, False
    if choice == "none":
        return None, False
    if choice == "tool":
        for tool in tools:
            if tool["name"] == tool_choice.get("name"):
                return dict(tool), True
        raise BadRequest("tool_choice.name: no tool of that name was given")
    return dict(tools[0]), forced


def sample_input(schema: Any) -> dict[str, Any]:
    """Arguments for a tool with this ``input_schema``: each required property gets a
    value of its type (its ``const``, first ``enum`` value or ``default`` when it has
    one). As far as simple goes: ``$ref``, ``oneOf`` and the like get a string; past
    ``_MAX_SAMPLE_VALUES`` values, arrays end and other values are ``null``."""
    return _sample_object(schema, 0, [_MAX_SAMPLE_VALUES])


def _sample_object(schema: Any, depth: int, budget: list[int]) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    required = schema.get("required")
    if not isinstance(required, list):
        return {}
    return {
        name: _sample_value(properties.get(name), depth + 1, budget)
        for name in required
        if isinstance(name, str)
    }


def _sample_value(schema: Any, depth: int, budget: list[int]) -> Any:
    if budget[0] <= 0:
        return None
    budget[0] -= 1
    if not isinstance(schema, dict) or depth > _MAX_SCHEMA_DEPTH:
        return "example"
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind in ("integer", "number"):
        minimum = schema.get("minimum")
        return minimum if isinstance(minimum, int | float) and not isinstance(minimum, bool) else 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        count = schema.get("minItems")
        count = count if _is_int(count) and 0 < count <= 16 else 0
        items: list[Any] = []
        while len(items) < count and budget[0] > 0:
            items.append(_sample_value(schema.get("items"), depth + 1, budget))
        return items
    if kind == "object":
        return _sample_object(schema, depth, budget)
    text = "example"
    min_length = schema.get("minLength")
    if _is_int(min_length) and len(text) < min_length <= 1024:
        text = text.ljust(min_length, "x")
    max_length = schema.get("maxLength")
    if _is_int(max_length) and max_length >= 0:
        text = text[:max_length]
    budget[0] -= len(text) // 64
    return text


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [word + " " for word in words[:-1]] + [words[-1]]


def build_reply(request: MessagesRequest) -> ScriptedReply:
    """The scripted reply to ``request`` (its ids are fresh, the rest is fixed)."""
    tool = request.tool
    if request.forced_tool:
        text = ""  # the call comes first: nothing is said before it
    elif tool is None:
        text = _TEXT
    else:
        text = f"{_TEXT} I will call the {tool['name']} tool now."
    thinking_words = _words(_THINKING) if request.thinking else []
    all_text_words = _words(text) if text else []
    budget = request.max_tokens
    thinking = thinking_words[:budget]
    text_words = all_text_words[: max(0, budget - len(thinking))]
    used = len(thinking) + len(text_words)
    # Cut short when the words did not all fit, or left no token for the call.
    cut = used < len(thinking_words) + len(all_text_words) or (tool is not None and used >= budget)
    tool_call = None
    if tool is not None and not cut:
        tool_call = (
            f"toolu_demo_{secrets.token_hex(8)}",
            str(tool["name"]),
            sample_input(tool.get("input_schema")),
        )
    if cut:
        stop_reason = StopReason.MAX_TOKENS
    elif tool_call is not None:
        stop_reason = StopReason.TOOL_USE
    else:
        stop_reason = StopReason.END_TURN
    return ScriptedReply(
        message_id=f"msg_demo_{secrets.token_hex(8)}",
        model=request.model,
        thinking=tuple(thinking),
        signature=_SIGNATURE if thinking else None,
        text=tuple(text_words),
        tool_call=tool_call,
        stop_reason=stop_reason,
        input_tokens=request.input_tokens,
        output_tokens=len(thinking) + len(text_words) + (tool_call is not None),
    )


async def messages_endpoint(request: Request) -> Response:
    """``POST /v1/messages``: the scripted reply, streamed or whole; 400 (413 for a body
    over :data:`MAX_MESSAGES_BODY`) in Anthropic's error shape for a bad request."""
    request_id = f"req_demo_{secrets.token_hex(8)}"
    headers = {"request-id": request_id}
    too_large = BadRequest(
        f"the request body is larger than {MAX_MESSAGES_BODY} bytes",
        status=413,
        error_type="request_too_large",
    )
    try:
        body = await read_json(request, limit=MAX_MESSAGES_BODY, too_large=too_large)
        parsed = parse_request(body)
    except BadRequest as exc:
        logger.info("refused a /v1/messages request: %s", exc)
        return exc.answer(headers)
    reply = build_reply(parsed)
    logger.debug(
        "scripted reply %s: %d thinking and %d text deltas, tool call: %s",
        reply.message_id,
        len(reply.thinking),
        len(reply.text),
        reply.tool_call is not None,
    )
    if parsed.stream:
        return EventStreamResponse(reply.publish, dialect="anthropic", headers=headers)
    return Response(
        orjson.dumps(reply.message()), 200, headers=headers, media_type="application/json"
    )


def _input_tokens(body: dict[str, Any]) -> int:
    # An estimate (four bytes a token) from what the model would read, re-serialised so
    # that it depends neither on the client's whitespace nor on "stream".
    prompt = [body.get("system"), body.get("messages"), body.get("tools")]
    return max(1, len(orjson.dumps(prompt)) // 4)
