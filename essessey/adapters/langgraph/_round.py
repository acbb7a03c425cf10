"""One LLM call of a LangGraph run, published as a round: its chunks' text, reasoning and
tool call fragments, read as langchain-core gives them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from essessey.adapters._message import PublishedToolCall
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import add_count, clean, json_text, json_value, output_text
from essessey.adapters.rounds import RoundStream

__all__ = ["LLMCall", "add_usage", "read_part", "result_of"]

logger = logging.getLogger("essessey.adapters.langgraph")

_LC_ID: Final = "lc_run-"  # the message id langchain-core gives a chunk its provider did not

_Piece: TypeAlias = (
    tuple[Literal["text", "reasoning", "signature"], str]
    | tuple[Literal["server_call", "server_result"], dict[str, Any]]
)


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
        elif kind == "server_tool_call":
            call = _server_call(block)
            if call is not None:
                found.append(("server_call", call))
        elif kind == "server_tool_result":
            result = _server_result(block)
            if result is not None:
                found.append(("server_result", result))
        elif kind not in ("tool_call", "tool_call_chunk", "invalid_tool_call"):
            # server_tool_call_chunk among them: the call goes out whole, from the block
            # the provider's integration gives once its arguments are.
            logger.debug("a content block of type %s is not published", kind)
    return found


def _server_call(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tool the provider ran itself (a web search, code execution), as the protocol's
    ``server_tool_use`` block; None, with a log line, when it names no call or tool."""
    call_id, name, args = block.get("id"), block.get("name"), block.get("args")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
        logger.warning("a server tool call without an id or a name; not published")
        return None
    given = json_value(args) if isinstance(args, Mapping) else {}
    return {"type": "server_tool_use", "id": call_id, "name": clean(name), "input": given}


def _server_result(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A server tool's result: its call's id, its output and whether it failed."""
    call_id = block.get("tool_call_id")
    if not (isinstance(call_id, str) and call_id):
        logger.warning("a server tool result without its call's id; not published")
        return None
    result: dict[str, Any] = {"tool_use_id": call_id, "content": json_value(block.get("output"))}
    if block.get("status") == "error":
        result["is_error"] = True
    return result


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
            add_count(into, key, value)


def result_of(message: ToolMessage) -> str:
    """A tool message's content as its result text: a string as it is, blocks as JSON."""
    content = message.content
    return output_text(content)


# -- one LLM call ------------------------------------------------------------------------------


class LLMCall:
    """One LLM call's chunks, published as a round of ``rounds``."""

    __slots__ = (
        "by_index",
        "done",
        "finish_reason",
        "held",
        "ids",
        "node",
        "requests",
        "rounds",
        "server_names",
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
        self.signable = False  # a thinking block is open: a signature may follow
        self.finish_reason: str | None = None
        self.server_names: dict[str, str] = {}  # a server tool call's id -> its tool

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
        if piece[0] == "server_call" or piece[0] == "server_result":
            await self._server_block(piece[0], piece[1])
            return
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

    async def _server_block(self, kind: str, block: dict[str, Any]) -> None:
        # As the Anthropic format has its server tools (and the Responses adapter the
        # tools the provider ran): a server_tool_use block, then <tool>_tool_result.
        if kind == "server_call":
            self.server_names[block["id"]] = block["name"]
        else:
            name = self.server_names.get(block["tool_use_id"], "server")
            block = {"type": f"{name}_tool_result", **block}
        self.signable = False
        await self.rounds.block_start(block)
        await self.rounds.block_stop()

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
            arguments = args if isinstance(args, str) else json_text(args or {})
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
        await self.rounds.assistant_message(held.requests())
        for slot, call in enumerate(held.published()):
            self.requests.append(call)
            self.slots[call.id] = slot
            if call.given_id:
                self.slots.setdefault(call.given_id, slot)
        return True
