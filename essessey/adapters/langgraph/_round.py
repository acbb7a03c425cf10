"""One LLM call of a LangGraph run, published as a round: its chunks' text, reasoning and
tool call fragments, read as langchain-core gives them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

import orjson
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from essessey.adapters._message import PublishedToolCall, parse_arguments
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import has_lone_surrogate, replace_surrogates
from essessey.adapters.rounds import RoundStream
from essessey.protocol import result_text

__all__ = ["LLMCall", "add_usage", "clean", "read_part", "result_of"]

logger = logging.getLogger("essessey.adapters.langgraph")

_LC_ID: Final = "lc_run-"  # the message id langchain-core gives a chunk its provider did not

_Piece: TypeAlias = tuple[Literal["text", "reasoning", "signature"], str]


# -- reading the parts ------------------------------------------------------------------------


def read_part(raw: object) -> tuple[str, Any] | None:
    """A stream part's mode and data, from any shape ``astream`` yields: the ``version="v2"``
    dict, or a ``(mode, data)`` / ``(namespace, mode, data)`` tuple."""
    if isinstance(raw, dict):
        mode = raw.get("type")
        if isinstance(mode, str) and "data" in raw:
            return mode, raw["data"]
    elif isinstance(raw, tuple):
        if len(raw) == 2 and isinstance(raw[0], str):
            return raw[0], raw[1]
        if len(raw) == 3 and isinstance(raw[1], str):
            return raw[1], raw[2]
    logger.warning("skipping a stream part that is a %s of no known shape", type(raw).__name__)
    return None


def clean(text: str) -> str:
    """``text`` with a lone surrogate (which no UTF-8 text carries) replaced by U+FFFD."""
    return replace_surrogates(text) if has_lone_surrogate(text) else text


def _pieces(message: AIMessage) -> list[_Piece]:
    """A message's (or chunk's) text, reasoning and reasoning signatures, in order."""
    content = message.content
    if isinstance(content, str) and not message.additional_kwargs:
        return [("text", clean(content))] if content else []
    found: list[_Piece] = []
    for block in message.content_blocks:
        kind = block.get("type")
        if kind == "text" or kind == "refusal":
            text = block.get(kind)
            if isinstance(text, str) and text:
                found.append(("text", clean(text)))
        elif kind == "reasoning":
            reasoning = block.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                found.append(("reasoning", clean(reasoning)))
            extras = block.get("extras")
            if isinstance(extras, Mapping):
                signature = extras.get("signature")
                if isinstance(signature, str) and signature:
                    found.append(("signature", signature))
        elif kind not in ("tool_call", "tool_call_chunk", "invalid_tool_call"):
            logger.debug("a content block of type %s is not published", kind)
    return found


def add_usage(message: AIMessage, into: dict[str, int]) -> None:
    """Add a message's (or chunk's) ``usage_metadata`` to ``into``, in the protocol's terms."""
    usage = message.usage_metadata
    if not usage:
        return
    counts = {"input_tokens": usage.get("input_tokens", 0)}
    counts["output_tokens"] = usage.get("output_tokens", 0)
    details = usage.get("input_token_details") or {}
    cached = details.get("cache_read")
    created = details.get("cache_creation")
    if cached:
        # The protocol's (Anthropic's) input count leaves the cache's tokens out.
        counts["input_tokens"] = max(counts["input_tokens"] - cached, 0)
        counts["cache_read_input_tokens"] = cached
    if created:
        counts["input_tokens"] = max(counts["input_tokens"] - created, 0)
        counts["cache_creation_input_tokens"] = created
    for key, value in counts.items():
        if type(value) is int and value >= 0:
            into[key] = into.get(key, 0) + value


def result_of(message: ToolMessage) -> str:
    """A tool message's content as its result text: a string as it is, blocks as JSON."""
    content = message.content
    return clean(content) if isinstance(content, str) else result_text(content)


# -- one LLM call ------------------------------------------------------------------------------


class LLMCall:
    """One LLM call's chunks, published as a round of ``rounds``."""

    __slots__ = (
        "by_index",
        "done",
        "finish_reason",
        "held",
        "held_results",
        "ids",
        "next_result",
        "node",
        "requests",
        "rounds",
        "signable",
        "slots",
    )

    def __init__(self, rounds: RoundStream, message_id: str | None, node: object) -> None:
        self.rounds = rounds
        self.ids: set[str] = {message_id} if message_id else set()
        self.node = node
        self.held: HeldCalls[_Piece] = HeldCalls(
            rounds, "call_", self._emit, logger=logger, noun="tool call", where="chunk %d"
        )
        self.by_index: dict[object, HeldCall] = {}
        self.done = False  # the model's output is whole: assistant_message was sent
        self.requests: list[PublishedToolCall] = []
        self.slots: dict[str, int] = {}  # a call's id (given and published) -> its slot
        self.held_results: dict[int, tuple[str, bool]] = {}
        self.next_result = 0
        self.signable = False  # a thinking block is open: a signature may follow
        self.finish_reason: str | None = None

    def continues(self, message_id: str | None, node: object) -> bool:
        """Whether a chunk of ``message_id`` (from ``node``) belongs to this call.

        The chunks of one call share its id, except where the provider names only the
        first and langchain-core names the rest after the run (``lc_run-...``).
        """
        if not message_id or message_id in self.ids:
            return True
        if (
            message_id.startswith(_LC_ID)
            and node == self.node
            and not any(known.startswith(_LC_ID) for known in self.ids)
        ):
            self.ids.add(message_id)
            return True
        return False

    async def _emit(self, piece: _Piece) -> None:
        kind, text = piece
        if kind == "text":
            await self.rounds.delta(text=text)
            self.signable = False
        elif kind == "reasoning":
            await self.rounds.delta(reasoning=text)
            self.signable = True
        elif self.signable:
            await self.rounds.delta(signature=text)
        else:
            logger.warning("a reasoning signature with no reasoning before it; not published")

    async def chunk(self, message: AIMessageChunk, position: int) -> None:
        """Publish what one chunk carries."""
        held = self.held
        content = message.content
        if isinstance(content, str) and not message.additional_kwargs:
            if not content:
                pass
            elif held.open is None and not held.pending:  # the common chunk: text, live
                await self.rounds.delta(text=clean(content))
                self.signable = False
            else:
                await held.put(("text", clean(content)))
        else:
            for piece in _pieces(message):
                await held.put(piece)
        fragments = message.tool_call_chunks
        for fragment in fragments:
            index = fragment.get("index")
            given = fragment.get("id")
            call = self.by_index.get(index) if index is not None else None
            if call is None and index is None and not given and held.calls:
                call = held.calls[-1]
            if call is None:
                call = HeldCall(len(held.calls))
                held.add(call)
                if index is not None:
                    self.by_index[index] = call
            if given and call.given_id is None:
                call.given_id = given
            name = fragment.get("name")
            if name and not call.name:
                call.name = name
            args = fragment.get("args")
            if args:
                await held.fragment(call, clean(args), position)
        if fragments or held.pending:
            await held.advance()
        if message.response_metadata:
            self._metadata(message)

    async def whole(self, message: AIMessage) -> None:
        """Publish a whole message as the round's output."""
        for piece in _pieces(message):
            await self.held.put(piece)
        for number, tool_call in enumerate([*message.tool_calls, *message.invalid_tool_calls]):
            call = HeldCall(number)
            call.given_id = tool_call.get("id")
            call.name = tool_call.get("name")
            args = tool_call.get("args")
            arguments = args if isinstance(args, str) else orjson.dumps(args or {}).decode()
            call.parts.append(clean(arguments))
            call.done = True
            self.held.add(call)
        self._metadata(message)
        await self.finish()

    def _metadata(self, message: AIMessage) -> None:
        metadata = message.response_metadata
        if metadata:
            reason = metadata.get("finish_reason") or metadata.get("stop_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason

    async def finish(self) -> bool:
        """The model's output is whole: publish what waits and declare the calls; False
        when that was done already."""
        if self.done:
            return False
        self.done = True
        held = self.held
        await held.advance(final=True)
        held.log_late()
        declared = held.requests()
        await self.rounds.assistant_message(declared)
        for slot, (request, call) in enumerate(zip(declared, held.started, strict=True)):
            self.requests.append(
                PublishedToolCall(
                    request.id, request.name, request.arguments, parse_arguments(request.arguments)
                )
            )
            self.slots[request.id] = slot
            if call.given_id:
                self.slots.setdefault(call.given_id, slot)
        return True
