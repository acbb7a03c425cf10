"""One LLM call of a LangGraph run, published as a round: its chunks' text, reasoning and
tool call fragments, read as langchain-core gives them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Final, Literal, TypeAlias

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from essessey._logsafe import log_label
from essessey.adapters._compaction import compaction_block
from essessey.adapters._message import PublishedToolCall, parse_arguments
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import (
    add_count,
    arguments_complete,
    clean,
    json_text,
    json_value,
    output_text,
)
from essessey.adapters.rounds import RoundStream
from essessey.protocol import thinking_block_start

__all__ = ["LLMCall", "add_usage", "read_part", "result_of"]

logger = logging.getLogger("essessey.adapters.langgraph")

_LC_ID: Final = "lc_run-"  # the message id langchain-core gives a chunk its provider did not

# The blocks of a model's own tool calls: published from tool_call_chunks / tool_calls.
_CALL_BLOCKS: Final = frozenset({"tool_call", "tool_call_chunk", "invalid_tool_call"})

# What a call publishes, in order (held behind a call whose arguments are not whole).
_Piece: TypeAlias = (
    tuple[Literal["text", "reasoning", "signature", "encrypted"], str]
    | tuple[Literal["server_call", "server_result", "whole"], dict[str, Any]]
)
# What a chunk carries: a piece, a piece of a server call's input (added to its call), or
# what made one of its tool calls (its ``caller``, by the call's index and id).
_Found: TypeAlias = (
    _Piece
    | tuple[Literal["server_chunk"], dict[str, Any]]
    | tuple[Literal["caller"], dict[str, Any]]
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


def _pieces(message: AIMessage, warned: set[str]) -> list[_Found]:
    """A message's (or chunk's) text, reasoning, reasoning signatures and server tool
    blocks, in order. A block of a type with no place in the protocol is logged once per
    type in ``warned`` (the run's) and left out."""
    content = message.content
    if isinstance(content, str) and not message.additional_kwargs:
        return [("text", clean(content))] if content else []
    found: list[_Found] = []
    calls: set[object] | None = None  # the message's tool call ids, once needed
    anthropic = message.response_metadata.get("model_provider") == "anthropic"
    for block in message.content_blocks:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                found.append(("text", clean(text)))
        elif kind == "refusal":
            text = block.get("refusal")
            if isinstance(text, str) and text and not _restates_stop(message, text):
                found.append(("text", clean(text)))
        elif kind == "reasoning":
            _reasoning(block.get("reasoning"), block.get("extras"), found)
        elif kind == "server_tool_call_chunk":
            found.append(("server_chunk", _anthropic_names(block) if anthropic else dict(block)))
        elif kind == "server_tool_call":
            call = _server_call(_anthropic_names(block) if anthropic else block)
            if call is not None:
                found.append(("server_call", call))
        elif kind == "server_tool_result":
            result = _server_result(block)
            if result is not None:
                found.append(("server_result", result))
        elif kind == "non_standard":
            value = block.get("value")
            given = value.get("type") if isinstance(value, Mapping) else None
            if given == "thinking" and isinstance(value, Mapping):
                # A provider's reasoning langchain-core has no translator for (Mistral's
                # thinking parts, a list of text chunks, through ChatOpenAI).
                thinking = value.get("thinking")
                if isinstance(thinking, list):
                    thinking = "".join(
                        part["text"]
                        for part in thinking
                        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
                    )
                _reasoning(thinking, value, found)
                continue
            if given == "redacted_thinking" and isinstance(value, Mapping):
                # Reasoning Anthropic encrypted: a client cannot read it, only send it
                # back, as the Anthropic adapter's redacted_thinking block carries it.
                data = value.get("data")
                if isinstance(data, str) and data:
                    found.append(("whole", {"type": "redacted_thinking", "data": data}))
                continue
            if given == "compaction" and isinstance(value, Mapping):
                # The provider compacting the conversation (Anthropic's compaction block,
                # a Responses API compaction item): what a client sends back in its place.
                compaction = compaction_block(
                    value.get("content"), value.get("encrypted_content"), value.get("signature")
                )
                if compaction is not None:
                    found.append(("whole", compaction))
                continue
            call_id = value.get("call_id") if isinstance(value, Mapping) else None
            if isinstance(call_id, str) and call_id:
                if calls is None:
                    calls = {c.get("id") for c in message.tool_calls}
                    calls.update(c.get("id") for c in message.invalid_tool_calls)
                if call_id in calls:
                    continue  # a call langchain-core gives as a tool call too (custom tools)
            _not_published(given if isinstance(given, str) else kind, warned)
        elif kind in _CALL_BLOCKS:
            # The call itself comes from tool_call_chunks / tool_calls; what made it (a
            # programmatic call's code execution) only here.
            extras = block.get("extras")
            caller = extras.get("caller") if isinstance(extras, Mapping) else None
            if isinstance(caller, Mapping):
                made = {"index": block.get("index"), "id": block.get("id")}
                found.append(("caller", {**made, "caller": json_value(caller)}))
        else:
            _not_published(kind, warned)
    return found


def _reasoning(text: object, extras: object, found: list[_Found]) -> None:
    """Reasoning text and what ``extras`` carries for the provider to read back, as
    pieces: Anthropic's signature, or the Responses API's ``encrypted_content`` (what a
    client that keeps no state with OpenAI sends back)."""
    if isinstance(text, str) and text:
        found.append(("reasoning", clean(text)))
    if isinstance(extras, Mapping):
        signature = extras.get("signature")
        if isinstance(signature, str) and signature:
            found.append(("signature", signature))
        encrypted = extras.get("encrypted_content")
        if isinstance(encrypted, str) and encrypted:
            found.append(("encrypted", encrypted))


def _restates_stop(message: AIMessage, text: str) -> bool:
    """Whether a refusal block is the explanation of the stop's ``stop_details``, which
    langchain-core adds as a block of Anthropic's refusals: the epilogue carries it, and it
    is not the model's text."""
    details = message.response_metadata.get("stop_details")
    return isinstance(details, Mapping) and details.get("explanation") == text


def _not_published(kind: object, warned: set[str]) -> None:
    label = log_label(kind)
    if label not in warned:
        warned.add(label)
        logger.warning(
            "a content block of type %s is not published: the adapter has no block for it "
            "(said once per run)",
            label,
        )


def _anthropic_names(block: Mapping[str, Any]) -> dict[str, Any]:
    """A server tool call of Anthropic's named as Anthropic names it (and as the
    Anthropic adapter publishes it): langchain-core calls its code execution
    ``code_interpreter`` and an MCP server's tool ``remote_mcp`` (the tool's own name and
    its server in ``extras``), which langchain-anthropic names back so when it sends them
    to Anthropic."""
    named = dict(block)
    name = block.get("name")
    extras = block.get("extras")
    extras = extras if isinstance(extras, Mapping) else {}
    if name == "code_interpreter":
        named["name"] = "code_execution"
    elif name == "remote_mcp":
        named["block_type"] = "mcp_tool_use"
        if isinstance(extras.get("tool_name"), str):
            named["name"] = extras["tool_name"]
    return named


def _server_call(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tool the provider ran itself (a web search, code execution), as the protocol's
    ``server_tool_use`` block (Anthropic's ``mcp_tool_use`` for an MCP server's tool, with
    its ``server_name``), with its ``caller`` when ``extras`` names one; None, with a log
    line, when it names no call or tool."""
    call_id, name, args = block.get("id"), block.get("name"), block.get("args")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
        logger.warning("a server tool call without an id or a name; not published")
        return None
    given = json_value(args) if isinstance(args, Mapping) else {}
    kind = block.get("block_type", "server_tool_use")
    use = {"type": kind, "id": call_id, "name": clean(name), "input": given}
    extras = block.get("extras")
    if isinstance(extras, Mapping):
        server = extras.get("server_name")
        if kind == "mcp_tool_use" and isinstance(server, str):
            use["server_name"] = clean(server)
        caller = extras.get("caller")
        if isinstance(caller, Mapping):
            use["caller"] = json_value(caller)
    return use


def _server_result(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A server tool's result: its block type (the provider's own, when langchain-core
    kept it; empty for :class:`LLMCall` to name after the call's tool), its call's id,
    its output and whether it failed."""
    call_id = block.get("tool_call_id")
    if not (isinstance(call_id, str) and call_id):
        logger.warning("a server tool result without its call's id; not published")
        return None
    extras = block.get("extras")
    given = extras.get("block_type") if isinstance(extras, Mapping) else None
    # Only a result type: a provider's "tool_result" would be the protocol's own block.
    kind = clean(given) if isinstance(given, str) and given.endswith("_tool_result") else ""
    result: dict[str, Any] = {
        "type": kind,
        "tool_use_id": call_id,
        "content": json_value(block.get("output")),
    }
    if block.get("status") == "error":
        result["is_error"] = True
    return result


def _caller_of(
    callers: list[dict[str, Any]], index: object, call_id: object
) -> dict[str, Any] | None:
    """The caller a chunk's content gave for the tool call at ``index`` (or, without one,
    of the id ``call_id``)."""
    for made in callers:
        if (index is not None and made["index"] == index) or (
            index is None and call_id and made["id"] == call_id
        ):
            caller: dict[str, Any] = made["caller"]
            return caller
    return None


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


class _ServerCall:
    """A server tool call whose input streams in pieces (``server_tool_call_chunk``)."""

    __slots__ = ("first", "id", "index", "parts")

    def __init__(self, call_id: str, first: Mapping[str, Any], index: object) -> None:
        self.id = call_id
        self.first = first  # the piece that named it: its tool, its extras
        self.index = index
        self.parts: list[str] = []


class LLMCall:
    """One LLM call's chunks, published as a round of ``rounds``.

    A call's stream may hold several provider messages, each ending with a chunk at
    ``chunk_position="last"`` (ChatAnthropic marks every ``message_delta`` with a stop
    reason so): each such end closes what its message opened, and the call is
    :attr:`ended` until another chunk of it comes. Its calls are declared at
    :meth:`finish`, once the run has gone on past it.
    """

    __slots__ = (
        "by_index",
        "content",
        "done",
        "ended",
        "finish_reason",
        "held",
        "ids",
        "late_server",
        "node",
        "requests",
        "rounds",
        "server",
        "server_names",
        "slots",
        "stop_details",
        "stop_sequence",
        "warned",
    )

    def __init__(
        self, rounds: RoundStream, message_id: str | None, node: object, warned: set[str]
    ) -> None:
        self.rounds = rounds
        self.ids: set[str] = {message_id} if message_id else set()
        self.node = node
        self.warned = warned  # the block types the run logged as not published
        self.held: HeldCalls[_Piece] = HeldCalls(
            rounds,
            "call_",
            self._emit,
            logger=logger,
            noun="tool call",
            where="chunk %d",
            before_start=self._call_opens,
        )
        self.by_index: dict[object, HeldCall] = {}
        self.done = False  # the model's output is whole: assistant_message was sent
        self.ended = False  # a chunk at chunk_position="last" came, and none after it
        self.requests: list[PublishedToolCall] = []
        self.slots: dict[str, int] = {}  # a call's id (given and published) -> its slot
        # The text or thinking block this call has open, if any (a thinking block takes
        # a signature).
        self.content: Literal["text", "thinking"] | None = None
        self.finish_reason: str | None = None
        self.stop_details: dict[str, Any] | None = None
        self.stop_sequence: str | None = None
        self.server_names: dict[str, str] = {}  # a server tool call's id -> its tool
        self.server: _ServerCall | None = None  # the server call whose input streams
        self.late_server = 0  # characters of server call input that came too late

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
        if piece[0] == "whole":
            await self._whole_block(piece[1])
            return
        if piece[0] == "encrypted":
            # The whole reasoning item's, at its end: the signature of its thinking block
            # while that is open, else (an item with no summary) a redacted_thinking
            # block, as the Responses adapter publishes it.
            if self.content == "thinking":
                await self.rounds.delta(signature=piece[1])
            else:
                await self._whole_block({"type": "redacted_thinking", "data": piece[1]})
            return
        kind, text = piece
        if kind == "text":
            await self._text(text)
        elif kind == "reasoning":
            await self.rounds.delta(reasoning=text)
            self.content = "thinking"
        else:
            if self.content != "thinking":
                # The signature of a thinking block with no text (Anthropic signs those
                # too): a thinking block opens for it, as the Anthropic adapter has it.
                await self.rounds.open_content(thinking_block_start(self.rounds.publisher.dialect))
                self.content = "thinking"
            await self.rounds.delta(signature=text)

    async def _whole_block(self, block: dict[str, Any]) -> None:
        """A block carried whole in its start (redacted reasoning, a server tool's call
        or result): it closes the open text or thinking block."""
        self.content = None
        await self.rounds.block_start(block)
        await self.rounds.block_stop()

    async def _call_opens(self) -> None:
        # A tool call's block opening closes the text or thinking block.
        self.content = None

    async def _server_block(self, kind: str, block: dict[str, Any]) -> None:
        # As the Anthropic format has its server tools (and the Responses adapter the
        # tools the provider ran): a server_tool_use block, then <tool>_tool_result.
        if kind == "server_call":
            self.server_names[block["id"]] = block["name"]
        elif not block["type"]:
            name = self.server_names.get(block["tool_use_id"], "server")
            block = {**block, "type": f"{name}_tool_result"}
        await self._whole_block(block)

    async def _take(self, found: _Found) -> None:
        """Publish a piece, or hold it behind the open call; a server call's piece is
        added to its input, and anything else ends that input."""
        if found[0] == "server_chunk":
            await self._server_chunk(found[1])
            return
        if found[0] == "caller":
            return  # the caller of a tool call: the call's fragments take it (_chunk)
        await self._server_done()
        await self.held.put(found)

    async def _server_chunk(self, block: Mapping[str, Any]) -> None:
        """A piece of a server tool call: the first names it (an id, a tool, an index),
        the rest add to its input (by index); the call is published once its input is
        whole JSON, or when something else comes."""
        call_id, index, args = block.get("id"), block.get("index"), block.get("args")
        if isinstance(call_id, str) and call_id:
            await self._server_done()  # a new call: the one before it is whole
            self.server = _ServerCall(call_id, block, index)
        call = self.server
        if not (isinstance(args, str) and args):
            return
        if call is None or (index is not None and call.index is not None and index != call.index):
            self.late_server += len(args)
            return
        call.parts.append(clean(args))
        if arguments_complete(call.parts):
            await self._server_done()

    async def _server_done(self) -> None:
        """The streamed server call's input is whole: its block goes out."""
        call = self.server
        if call is None:
            return
        self.server = None
        text = "".join(call.parts)
        args = parse_arguments(text)
        if not isinstance(args, dict):
            logger.warning(
                "a server tool call's input is not a JSON object (%d characters); published as {}",
                len(text),
            )
            args = {}
        block = _server_call({**call.first, "id": call.id, "args": args})
        if block is not None:
            await self.held.put(("server_call", block))

    def chunk(self, message: AIMessageChunk, position: int) -> Awaitable[None]:
        """What publishes one chunk: the round's text delta itself for the common chunk
        (only text, with nothing held or open before it), else :meth:`_chunk`."""
        self.ended = False
        content = message.content
        held = self.held
        if (
            type(content) is str
            and content
            and not message.additional_kwargs
            and not message.tool_call_chunks
            and not message.response_metadata
            and message.chunk_position != "last"
            and held.open is None
            and not held.pending
            and self.server is None
        ):
            return self._text(clean(content))
        return self._chunk(message, position)

    def _text(self, text: str) -> Awaitable[None]:
        """Text out live: it goes to the open text block (or opens one)."""
        self.content = "text"
        return self.rounds.delta(text=text)

    async def _chunk(self, message: AIMessageChunk, position: int) -> None:
        held = self.held
        content = message.content
        callers: list[dict[str, Any]] = []
        if isinstance(content, str) and not message.additional_kwargs:
            if content:
                await self._take(("text", clean(content)))
        else:
            for piece in _pieces(message, self.warned):
                if piece[0] == "caller":
                    callers.append(piece[1])
                else:
                    await self._take(piece)
        fragments = message.tool_call_chunks
        if fragments:
            await self._server_done()
        for fragment in fragments:
            index = fragment.get("index")
            given = fragment.get("id")
            call = self.by_index.get(index) if index is not None else None
            if call is not None and given and call.given_id and given != call.given_id:
                # Another call's id at an index in use: a call of its own, and the one
                # before it has all its arguments.
                call.done = True
                call = None
            if call is None and index is None and not given and held.calls:
                call = held.calls[-1]
            if call is None:
                call = HeldCall(len(held.calls))
                held.add(call)
                if index is not None:
                    self.by_index[index] = call
            if given and call.given_id is None:
                call.given_id = given
            if callers and call.caller is None:
                call.caller = _caller_of(callers, index, given)
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
        if message.chunk_position == "last":
            await self._message_end()

    async def _message_end(self) -> None:
        """A provider message of the call ended: what it opened is whole and closes now.
        A next one (a stream of several) starts its blocks and call indexes anew."""
        await self._server_done()
        held = self.held
        for call in held.calls:
            call.done = True
        self.by_index.clear()
        await held.advance(final=True)
        if held.open is not None:
            await held.close_open()
        elif self.content is not None:
            await self.rounds.close_block()
        self.content = None
        self.ended = True

    async def whole(self, message: AIMessage) -> None:
        """Publish a whole message as the round's output."""
        callers: list[dict[str, Any]] = []
        for piece in _pieces(message, self.warned):
            if piece[0] == "caller":
                callers.append(piece[1])
            else:
                await self._take(piece)
        await self._server_done()
        for number, tool_call in enumerate([*message.tool_calls, *message.invalid_tool_calls]):
            call = HeldCall(number)
            call.given_id = tool_call.get("id")
            call.name = tool_call.get("name")
            if callers:
                call.caller = _caller_of(callers, None, call.given_id)
            args = tool_call.get("args")
            arguments = args if isinstance(args, str) else json_text(args or {})
            call.parts.append(clean(arguments))
            call.done = True
            self.held.add(call)
        self._metadata(message)
        await self.finish()

    def _metadata(self, message: AIMessage) -> None:
        metadata = message.response_metadata
        if not metadata:
            return
        reason = metadata.get("finish_reason") or metadata.get("stop_reason")
        if not reason and metadata.get("status") == "incomplete":
            # The Responses API's cut response (its status, and why).
            details = metadata.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, Mapping) else None
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
            details = metadata.get("stop_details")
            given = json_value(details) if isinstance(details, Mapping) else None
            self.stop_details = given if isinstance(given, dict) else None
            sequence = metadata.get("stop_sequence")
            self.stop_sequence = clean(sequence) if isinstance(sequence, str) else None

    async def finish(self) -> bool:
        """The model's output is whole: publish what waits and declare the calls; False
        when that was done already."""
        if self.done:
            return False
        self.done = True
        await self._server_done()
        held = self.held
        await held.advance(final=True)
        held.log_late()
        if self.late_server:
            logger.warning(
                "%d characters of server tool call input came for no open call; they cannot go out",
                self.late_server,
            )
        await self.rounds.assistant_message(held.requests())
        for slot, call in enumerate(held.published()):
            self.requests.append(call)
            self.slots[call.id] = slot
            if call.given_id:
                self.slots.setdefault(call.given_id, slot)
        return True
