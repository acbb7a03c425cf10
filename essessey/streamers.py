"""Streamers keep the block indexes right so callers do not have to.

Each streamer owns one kind of block and an index. It opens its block lazily, on the
first non-empty chunk (a round with no text of a kind emits no block and uses no
index), and advances the index only when a block it opened is closed. Streamers that
write into one message share a :class:`BlockIndex`. The turn helper (:func:`stream_turn`)
owns one across its streamers, closes one before the next opens (so thinking always
closes before text), and always ends the stream.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeVar

import anyio

from essessey._failure import send_failure
from essessey.check import Rule
from essessey.errors import ProtocolError
from essessey.protocol import BlockType, EventType, StopReason, result_text
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher, writable_json, writable_text

__all__ = [
    "DEFAULT_EXPIRES_IN",
    "Asker",
    "BlockIndex",
    "BlockStreamer",
    "LineStreamer",
    "TextStreamer",
    "ThinkingStreamer",
    "ToolCall",
    "ToolStreamer",
    "Turn",
    "continue_turn",
    "stream_turn",
]

logger = logging.getLogger("essessey.streamers")

DEFAULT_EXPIRES_IN: Final = 3600.0
"""Seconds an approval request or a question takes answers, by default: the in-memory
store's own ``max_age``, past which a finished stream is dropped anyway."""

NO_RESULT_TEXT = '{"error":"the tool produced no result"}'
"""The result text :meth:`ToolStreamer.close` sends for a call that got no result."""


class BlockIndex:
    """The block indexes of one message, shared by the streamers that write into it.

    Protocol rules 1 to 3 live here, written once: a block opens at :attr:`index`, one
    block is open at a time, and the index advances only when the open block closes.
    Every streamer writes its blocks through one: a streamer made on its own has a
    BlockIndex of its own; pass one as ``shared_index=`` to several streamers (as a
    :class:`Turn` and :class:`~essessey.adapters.RoundStream` do) and their blocks take
    consecutive indexes, and a streamer refuses to open a block while another one's is
    open. The bookkeeping changes only after the publisher took the event, so a refused
    event leaves the index as it was.
    """

    __slots__ = ("_holder", "_index", "_publisher")

    def __init__(self, publisher: Publisher | None, start_index: int = 0) -> None:
        if start_index < 0:
            raise ValueError("start_index must be >= 0")
        self._publisher = publisher
        # A plain slot, not a property: the streamers read it for every delta.
        self._index = start_index
        # The streamer whose block is open, or None between blocks.
        self._holder: object | None = None

    @property
    def index(self) -> int:
        """The index the next block opens at (the open block's, while one is open)."""
        return self._index

    @property
    def is_open(self) -> bool:
        """Whether a block written through this index is open."""
        return self._holder is not None

    async def raw_delta(self, delta: Mapping[str, Any]) -> None:
        """Publish ``delta`` as given for the open block, whichever streamer opened it.

        For a delta no streamer models (a provider's ``citations_delta``, its empty
        chunk). Raises :class:`ProtocolError` when no block is open.
        """
        if self._holder is None:
            raise ProtocolError("a delta needs an open block")
        if self._publisher is not None:
            await self._publisher.publish(
                EventType.CONTENT_BLOCK_DELTA,
                {"type": EventType.CONTENT_BLOCK_DELTA, "index": self._index, "delta": dict(delta)},
            )

    # The streamers of this module are the only writers of blocks: these stay private so
    # that every block goes through a streamer's checks.

    def _claim(self, holder: object) -> int:
        if self._holder is not None and self._holder is not holder:
            raise ProtocolError(
                f"block {self._index} is still open: close it before another block opens"
            )
        return self._index

    async def _start(
        self, holder: object, send_start: Callable[[Publisher, int], Awaitable[None]]
    ) -> int:
        # Open holder's block at the next index (send_start publishes its start).
        index = self._claim(holder)
        if self._publisher is not None:
            await send_start(self._publisher, index)
        self._holder = holder
        return index

    async def _stop(self, holder: object) -> None:
        # Close holder's open block and advance the index; nothing when it has none.
        if self._holder is not holder:
            return
        if self._publisher is not None:
            await self._publisher.send_content_block_stop(self._index)
        self._holder = None
        self._index += 1

    async def _whole(
        self, holder: object, send: Callable[[Publisher, int], Awaitable[None]]
    ) -> None:
        # Publish a whole block (start to stop, by send) at the next index.
        index = self._claim(holder)
        if self._publisher is not None:
            await send(self._publisher, index)
        self._index = index + 1


def _index_for(
    publisher: Publisher | None, start_index: int, shared_index: BlockIndex | None
) -> BlockIndex:
    """A new streamer's BlockIndex: its own at ``start_index``, or the one it shares."""
    if shared_index is None:
        return BlockIndex(publisher, start_index)
    if start_index != 0:
        raise ValueError(
            "a streamer that shares a BlockIndex starts at its index: "
            "give start_index to the BlockIndex"
        )
    if shared_index._publisher is not publisher:
        # Starts and stops would go to one publisher and deltas to another.
        raise ValueError("a streamer and the BlockIndex it shares must have the same publisher")
    return shared_index


async def _nothing() -> None:
    return None


class _BlockStreamer:
    """Shared bookkeeping of the text-like streamers: one block, opened lazily."""

    __slots__ = ("_cursor", "_open", "_parts", "_publisher", "_retired")

    def __init__(
        self,
        publisher: Publisher | None,
        start_index: int = 0,
        *,
        shared_index: BlockIndex | None = None,
    ) -> None:
        self._cursor = _index_for(publisher, start_index, shared_index)
        self._publisher = publisher
        self._open = False
        self._parts: list[str] = []
        self._retired = False

    @property
    def text(self) -> str:
        """Everything written so far (after any transform)."""
        return "".join(self._parts)

    @property
    def next_index(self) -> int:
        """The next free block index: the start index until a block opened and closed."""
        return self._cursor._index

    @property
    def is_open(self) -> bool:
        """Whether this streamer's block is open."""
        return self._open

    def _write(self, chunk: str) -> Coroutine[Any, Any, None]:
        # A plain function returning the coroutine (as the Publisher's delta methods):
        # the delta into an open block, the path of nearly every chunk, is one frame.
        if not chunk:
            writable_text(chunk)  # None, 0, b"": refused, as any chunk not a str is
            return _nothing()
        publisher = self._publisher
        if self._open and publisher is not None:
            return self._send_open(publisher, chunk)
        return self._emit(chunk)

    async def _send_open(self, publisher: Publisher, chunk: str) -> None:
        await self._send_delta(publisher, self._cursor._index, chunk)
        self._parts.append(chunk)

    async def _emit(self, chunk: str) -> None:
        publisher = self._publisher
        if publisher is not None:
            if not self._open:
                # The content is checked before its block opens: a refused first chunk
                # would leave an empty block no end could close.
                writable_text(chunk)
                # A block opens with its first content or not at all: a cancellation
                # landing between the two (in a store's append) would leave an empty
                # text or thinking block, which the turn's end could not close. Shielded,
                # it is delivered after the first delta.
                with anyio.CancelScope(shield=True):
                    await self._open_block()
                    await self._send_delta(publisher, self._cursor._index, chunk)
            else:
                await self._send_delta(publisher, self._cursor._index, chunk)
        self._parts.append(chunk)

    async def _open_block(self, content_block: Mapping[str, Any] | None = None) -> None:
        # content_block: a start object to publish instead of the dialect's own.
        if self._retired:
            # Its Turn has handed this index on to the next streamer: a new block here
            # would reuse that index or overlap that streamer's block.
            raise ProtocolError(
                f"this {type(self).__name__} was closed by its Turn; ask the Turn for a new one"
            )
        if content_block is None:
            await self._cursor._start(self, self._send_start)
        else:
            await self._cursor._start(
                self, lambda publisher, index: _send_given_start(publisher, index, content_block)
            )
        self._open = True

    async def _start_given(self, content_block: Mapping[str, Any], block_type: str) -> None:
        # TextStreamer.start and ThinkingStreamer.start: one block, of the streamer's type.
        if content_block.get("type") != block_type:
            raise ValueError(f"a {type(self).__name__} starts a {block_type!r} block")
        if self._open:
            raise ProtocolError(f"this {type(self).__name__}'s block is already open")
        await self._open_block(content_block)

    async def close(self) -> None:
        """Close the block if one is open and advance the index; otherwise do nothing."""
        if not self._open:
            return
        await self._cursor._stop(self)
        self._open = False

    async def _send_start(self, publisher: Publisher, index: int) -> None:
        await publisher.send_content_block_start_text(index)

    def _send_delta(self, publisher: Publisher, index: int, chunk: str) -> Awaitable[None]:
        # The Publisher's own coroutine: one frame fewer on the path of every delta.
        return publisher.send_content_block_delta_text(index, chunk)


async def _send_given_start(
    publisher: Publisher, index: int, content_block: Mapping[str, Any]
) -> None:
    # "type" first, as every other event: publish() would add it last.
    await publisher.publish(
        EventType.CONTENT_BLOCK_START,
        {
            "type": EventType.CONTENT_BLOCK_START,
            "index": index,
            "content_block": dict(content_block),
        },
    )


class TextStreamer(_BlockStreamer):
    """Streams answer text as one text block; empty chunks open nothing.

    With ``publisher=None`` it only accumulates, which is handy when the same code runs
    with and without a client. ``shared_index`` makes its blocks take their indexes
    from a :class:`BlockIndex` other streamers write through too.
    """

    __slots__ = ()

    async def start(self, content_block: Mapping[str, Any]) -> None:
        """Open the text block now, with ``content_block`` as its start object.

        For a proxy that keeps a provider's start object, with fields the dialect's own
        lacks. Its ``type`` must be ``"text"`` (ValueError otherwise); raises
        :class:`ProtocolError` when the block is already open. Write the first chunk
        right after: a block that closes empty shows as an empty card.
        """
        await self._start_given(content_block, BlockType.TEXT)

    def write(self, chunk: str) -> Coroutine[Any, Any, None]:
        """Append ``chunk``: opens the block on the first non-empty chunk, then a delta."""
        return self._write(chunk)


class ThinkingStreamer(_BlockStreamer):
    """Streams reasoning as one thinking block; empty chunks open nothing."""

    __slots__ = ("_signature",)

    def __init__(
        self,
        publisher: Publisher | None,
        start_index: int = 0,
        *,
        shared_index: BlockIndex | None = None,
    ) -> None:
        super().__init__(publisher, start_index, shared_index=shared_index)
        self._signature: str | None = None

    @property
    def signature(self) -> str | None:
        """The last signature written, if any."""
        return self._signature

    def write(self, chunk: str) -> Coroutine[Any, Any, None]:
        """Append reasoning: opens the block on the first non-empty chunk, then a delta."""
        return self._write(chunk)

    async def start(self, content_block: Mapping[str, Any]) -> None:
        """Open the thinking block now, with ``content_block`` as its start object.

        For a proxy that keeps a provider's start object (an Anthropic thinking block's
        empty ``signature``). Its ``type`` must be ``"thinking"`` (ValueError otherwise);
        raises :class:`ProtocolError` when the block is already open. Write the first
        chunk right after: a block that closes empty shows as an empty card.
        """
        await self._start_given(content_block, BlockType.THINKING)

    async def write_signature(self, signature: str) -> None:
        """Attach a provider's signature to the thinking block (opening it if needed)."""
        if not signature:
            return
        publisher = self._publisher
        if publisher is not None:
            if not self._open:
                writable_text(signature)  # before the block opens: a refusal emits nothing
                await self._open_block()
            await publisher.send_signature_delta(self._cursor._index, signature)
        self._signature = signature

    async def _send_start(self, publisher: Publisher, index: int) -> None:
        await publisher.send_content_block_start_thinking(index)

    def _send_delta(self, publisher: Publisher, index: int, chunk: str) -> Awaitable[None]:
        # The Publisher's own coroutine: one frame fewer on the path of every delta.
        return publisher.send_content_block_delta_thinking(index, chunk)


class LineStreamer(_BlockStreamer):
    """Streams text a whole line at a time, each line passed through ``transform``.

    For line-oriented payloads (a UI spec, a table) that must be checked or rewritten
    before a client sees them. Lines end at LF or CRLF; the transform sees a line
    without its ending, and the ending is written back as it came. A trailing
    partial line is held until the next chunk or :meth:`close`. A line the transform
    turns into ``""`` (with no newline) is dropped.
    """

    __slots__ = ("_pending", "_transform")

    def __init__(
        self,
        publisher: Publisher | None,
        start_index: int = 0,
        transform: Callable[[str], str] | None = None,
        *,
        shared_index: BlockIndex | None = None,
    ) -> None:
        super().__init__(publisher, start_index, shared_index=shared_index)
        self._transform = transform
        self._pending: list[str] = []

    async def write(self, chunk: str) -> None:
        """Buffer ``chunk`` and emit every complete line in it."""
        while chunk:
            newline = chunk.find("\n")
            if newline < 0:
                self._pending.append(chunk)
                return
            self._pending.append(chunk[:newline])
            line = "".join(self._pending)
            self._pending.clear()
            # The CR may have come in an earlier chunk than its LF, hence on the joined line.
            if line.endswith("\r"):
                await self._emit_line(line[:-1], "\r\n")
            else:
                await self._emit_line(line, "\n")
            chunk = chunk[newline + 1 :]

    async def close(self) -> None:
        """Emit the trailing partial line (if any), then close the block."""
        if self._pending:
            line = "".join(self._pending)
            self._pending.clear()
            await self._emit_line(line, "")
        await super().close()

    async def _emit_line(self, line: str, ending: str) -> None:
        if self._transform is not None:
            line = self._transform(line)
        chunk = line + ending
        if chunk:
            await self._emit(chunk)


class BlockStreamer(_BlockStreamer):
    """Streams one block of a type the protocol does not model, passed through as given.

    For a provider's other content (``redacted_thinking``, a server tool's call or
    result, an application's own block type): :meth:`start` publishes the start object
    at the next index, :meth:`write` each delta object unchanged, :meth:`close` ends
    the block. The checker accepts any delta type it does not know in such a block.
    """

    __slots__ = ()

    async def start(self, content_block: Mapping[str, Any]) -> None:
        """Open the block with ``content_block`` as its start object."""
        if self._open:
            raise ProtocolError("this BlockStreamer's block is already open")
        await self._open_block(content_block)

    async def write(self, delta: Mapping[str, Any]) -> None:
        """Publish one delta object of the open block as it is."""
        if not self._open:
            raise ProtocolError("a delta for a BlockStreamer whose block is not open")
        await self._cursor.raw_delta(delta)


@dataclass(slots=True)
class ToolCall:
    """One tool call of a round, as a :class:`ToolStreamer` saw it."""

    tool_use_id: str
    name: str
    arguments: str = ""
    result: str | None = None
    is_error: bool = False


def refused_call(tool_use_id: str, name: str, used: Iterable[str]) -> str | None:
    """Why a tool call cannot start, or None when it can: the one rule for every caller.

    A client matches a result to its call by id, and renders and runs the call by name:
    both must be non-empty, and an id is used once per round.
    """
    if not tool_use_id or tool_use_id in used:
        return f"tool call id {tool_use_id!r} is empty or already used"
    if not name:
        return f"tool call {tool_use_id!r} has no tool name"
    return None


class ToolStreamer:
    """Streams one round's tool calls: every tool_use block, then every tool_result.

    Call :meth:`start_call` for each call (its arguments may follow in
    :meth:`write_arguments` as they arrive), then :meth:`write_result` for each result,
    in any order. Once a result is out, the round's calls are fixed: starting another
    call raises :class:`ProtocolError` and emits nothing. :meth:`close` gives every call
    still without a result an ``is_error`` result, so no client waits for one forever.
    """

    __slots__ = (
        "_by_id",
        "_calls",
        "_cursor",
        "_deferred",
        "_open_id",
        "_open_parts",
        "_publisher",
        "_results_started",
        "_retired",
    )

    def __init__(
        self,
        publisher: Publisher | None,
        start_index: int = 0,
        *,
        shared_index: BlockIndex | None = None,
    ) -> None:
        self._cursor = _index_for(publisher, start_index, shared_index)
        self._publisher = publisher
        self._calls: list[ToolCall] = []
        self._by_id: dict[str, ToolCall] = {}
        self._open_id: str | None = None
        # Fragments of the open call's arguments, joined once when its block closes:
        # appending to a growing string would copy it at every fragment.
        self._open_parts: list[str] = []
        self._results_started = False
        self._retired = False
        self._deferred: set[str] = set()

    @property
    def calls(self) -> list[ToolCall]:
        """The round's calls, in the order they started."""
        if self._open_id is not None:
            self._by_id[self._open_id].arguments = "".join(self._open_parts)
        return list(self._calls)

    @property
    def started_calls(self) -> Sequence[ToolCall]:
        """The calls started so far, in order, as a read-only view that follows new calls.

        Unlike :attr:`calls` it copies nothing, so it suits a check made for every
        argument fragment. The open call's ``arguments`` are filled in when its block
        closes (:attr:`calls` joins them at once).
        """
        # The list itself, typed read-only: a copy per read would cost what the
        # view exists to save.
        return self._calls

    @property
    def calls_by_id(self) -> Mapping[str, ToolCall]:
        """The calls started so far by tool_use id, as a read-only live mapping.

        The open call's ``arguments`` are filled in when its block closes.
        """
        return MappingProxyType(self._by_id)

    @property
    def next_index(self) -> int:
        """The next free block index."""
        return self._cursor._index

    @property
    def open_call(self) -> str | None:
        """The id of the call whose tool_use block is open, or None."""
        return self._open_id

    @property
    def pending(self) -> list[str]:
        """Ids of the calls that have no result yet and are not deferred."""
        return [
            call.tool_use_id
            for call in self._calls
            if call.result is None and call.tool_use_id not in self._deferred
        ]

    def defer(self, tool_use_id: str) -> None:
        """Leave the call ``tool_use_id`` without a result in this message: the client
        runs it, or it waits for an approval (docs/asking.md). :meth:`close` then gives
        it no error result, and the message should end with stop reason ``tool_use``."""
        call = self._by_id.get(tool_use_id)
        if call is None:
            raise ProtocolError(f"no tool call {tool_use_id!r} in this round")
        if call.result is not None:
            raise ProtocolError(f"tool call {tool_use_id!r} already has a result")
        self._deferred.add(tool_use_id)

    async def start_call(
        self,
        tool_use_id: str,
        name: str,
        arguments: str = "",
        *,
        item_type: str | None = None,
        caller: Mapping[str, Any] | None = None,
    ) -> None:
        """Open the tool_use block of a new call (closing the previous call's block);
        ``item_type``: the provider's own type for a call that is not a plain function
        call; ``caller``: what made the call, when the model did not
        (``Publisher.send_tool_use_start``)."""
        if self._retired:
            raise ProtocolError(
                "this ToolStreamer was closed by its Turn; ask the Turn for a new one"
            )
        if self._results_started:
            raise ProtocolError(
                "a tool call cannot start after the round's first result: "
                "all tool_use blocks come before all tool_result blocks"
            )
        reason = refused_call(tool_use_id, name, self._by_id)
        if reason is not None:
            raise ProtocolError(reason)
        if arguments:
            writable_text(arguments)  # before the block opens: a refusal emits nothing
        await self.end_call()
        await self._cursor._start(
            self,
            lambda publisher, index: publisher.send_tool_use_start(
                index, tool_use_id, name, item_type=item_type, caller=caller
            ),
        )
        call = ToolCall(tool_use_id, name)
        self._calls.append(call)
        self._by_id[tool_use_id] = call
        self._open_id = tool_use_id
        if arguments:
            await self.write_arguments(tool_use_id, arguments)

    async def write_arguments(self, tool_use_id: str, partial_json: str) -> None:
        """Stream a fragment of the open call's JSON arguments."""
        if tool_use_id != self._open_id:
            raise ProtocolError(
                f"arguments for {tool_use_id!r}, but the open tool call is {self._open_id!r}"
            )
        if not partial_json:
            return
        if self._publisher is not None:
            await self._publisher.send_tool_input_delta(self._cursor._index, partial_json)
        self._open_parts.append(partial_json)

    async def write_result(self, tool_use_id: str, text: str, *, is_error: bool = False) -> None:
        """Emit a call's whole result block (closing the last tool_use block first)."""
        writable_text(text)  # before anything, the last call's block's end included
        call = self._by_id.get(tool_use_id)
        if call is None:
            raise ProtocolError(f"no tool call {tool_use_id!r} in this round")
        if call.result is not None:
            raise ProtocolError(f"tool call {tool_use_id!r} already has a result")
        if tool_use_id in self._deferred:
            raise ProtocolError(f"tool call {tool_use_id!r} is deferred to a later message")
        await self.end_call()
        await self._cursor._whole(
            self,
            lambda publisher, index: publisher.send_tool_result_block(
                index, tool_use_id, text, is_error=is_error
            ),
        )
        self._results_started = True
        call.result = text
        call.is_error = is_error

    async def close(self) -> None:
        """Close the open block and answer every call still owed with an error result."""
        await self.end_call()
        for tool_use_id in self.pending:
            logger.warning("tool call %s got no result; sending an error result", tool_use_id)
            await self.write_result(tool_use_id, NO_RESULT_TEXT, is_error=True)

    async def end_call(self) -> None:
        """Close the open call's tool_use block (its arguments are complete), if any."""
        if self._open_id is None:
            return
        await self._cursor._stop(self)
        self._by_id[self._open_id].arguments = "".join(self._open_parts)
        self._open_parts = []
        self._open_id = None


class Asker:
    """Writes what a message asks its client (docs/asking.md): approval requests,
    questions, calls the client runs; and, in the message that continues the turn,
    results of calls an earlier message made. Each is a whole block at the shared
    index. A :class:`Turn` and a :class:`~essessey.adapters.RoundStream` offer these as
    methods of their own; this is the one place that writes them.
    """

    __slots__ = ("_cursor", "_publisher")

    def __init__(self, publisher: Publisher, *, shared_index: BlockIndex) -> None:
        self._cursor = _index_for(publisher, 0, shared_index)
        self._publisher = publisher

    async def approval(
        self,
        tool_use_id: str,
        *,
        reason: str | None = None,
        expires_in: float | None = DEFAULT_EXPIRES_IN,
        request_id: str | None = None,
    ) -> str:
        """Ask to approve the message's call ``tool_use_id``; returns the request's id."""
        key = request_id or "apr_" + secrets.token_hex(12)
        expires_at = _expiry(expires_in)
        await self._cursor._whole(
            self,
            lambda publisher, index: publisher.send_approval_request(
                index, key, tool_use_id, reason=reason, expires_at=expires_at
            ),
        )
        return key

    async def question(
        self,
        question: str,
        *,
        schema: Mapping[str, Any] | None = None,
        expires_in: float | None = DEFAULT_EXPIRES_IN,
        request_id: str | None = None,
        tool_use_id: str | None = None,
    ) -> str:
        """Ask ``question`` (``schema``: a JSON schema for the answer; ``tool_use_id``:
        the call whose run asks it); returns its id."""
        key = request_id or "q_" + secrets.token_hex(12)
        expires_at = _expiry(expires_in)
        await self._cursor._whole(
            self,
            lambda publisher, index: publisher.send_question(
                index,
                key,
                question,
                schema=schema,
                expires_at=expires_at,
                tool_use_id=tool_use_id,
            ),
        )
        return key

    async def client_call(
        self, name: str, arguments: Mapping[str, Any] | str, *, tool_use_id: str | None = None
    ) -> str:
        """A call of tool ``name`` that the client runs; returns the call's id."""
        key = tool_use_id or "toolu_" + secrets.token_hex(12)
        await self._cursor._whole(
            self,
            lambda publisher, index: publisher.send_tool_use_block(index, key, name, arguments),
        )
        return key

    async def result(self, tool_use_id: str, text: str, *, is_error: bool = False) -> None:
        """The result of a call an earlier message of the stream made (one it deferred,
        now approved and run)."""
        await self._cursor._whole(
            self,
            lambda publisher, index: publisher.send_tool_result_block(
                index, tool_use_id, text, is_error=is_error
            ),
        )


_MAX_EXPIRES_IN: Final = 100 * 365 * 86_400.0
"""The longest ``expires_in`` taken (a hundred years): a Unix time past it is no time a
client could compare with, and past 64 bits no JSON writer takes it."""


def _expiry(expires_in: float | None) -> int | None:
    """``expires_in`` seconds from now, as the Unix time a request carries."""
    if expires_in is None:
        return None
    if not 0 < expires_in <= _MAX_EXPIRES_IN:  # NaN and infinity too
        raise ValueError(
            "expires_in must be > 0 seconds and at most a hundred years, or None for no expiry"
        )
    return math.ceil(time.time() + expires_in)


_Streamer = TextStreamer | ThinkingStreamer | LineStreamer | ToolStreamer | BlockStreamer
_S = TypeVar("_S", TextStreamer, ThinkingStreamer, LineStreamer, ToolStreamer, BlockStreamer)


class Turn:
    """The index owner of one message: hands out streamers that continue each other.

    Get it from :func:`stream_turn`. Asking for a new streamer closes the current one
    first, so one block is open at a time and the next streamer starts at the next free
    index (all of them share the Turn's one :class:`BlockIndex`). A streamer the Turn has
    moved past refuses to open another block (:class:`ProtocolError`): its index now
    belongs to the next streamer. Set :attr:`stop_reason`, :attr:`output_tokens` and
    :attr:`usage` before the block ends to shape the epilogue.
    """

    __slots__ = (
        "_current",
        "_cursor",
        "output_tokens",
        "publisher",
        "stop_reason",
        "stop_sequence",
        "usage",
    )

    def __init__(self, publisher: Publisher, start_index: int = 0) -> None:
        self.publisher = publisher
        self._cursor = BlockIndex(publisher, start_index)
        self._current: _Streamer | None = None
        self.stop_reason: str | None = StopReason.END_TURN
        self.stop_sequence: str | None = None
        self.output_tokens = 0
        self.usage: dict[str, int] = {}

    @property
    def next_index(self) -> int:
        """The next free block index, counting the current streamer's blocks."""
        return self._cursor._index

    async def text(self) -> TextStreamer:
        """Close the current streamer and start a text streamer after it."""
        await self._release()
        return self._adopt(TextStreamer(self.publisher, shared_index=self._cursor))

    async def thinking(self) -> ThinkingStreamer:
        """Close the current streamer and start a thinking streamer after it."""
        await self._release()
        return self._adopt(ThinkingStreamer(self.publisher, shared_index=self._cursor))

    async def lines(self, transform: Callable[[str], str] | None = None) -> LineStreamer:
        """Close the current streamer and start a line streamer after it."""
        await self._release()
        return self._adopt(
            LineStreamer(self.publisher, transform=transform, shared_index=self._cursor)
        )

    async def tools(self) -> ToolStreamer:
        """Close the current streamer and start a round of tool calls after it."""
        await self._release()
        return self._adopt(ToolStreamer(self.publisher, shared_index=self._cursor))

    async def block(self) -> BlockStreamer:
        """Close the current streamer and start a pass-through block streamer after it."""
        await self._release()
        return self._adopt(BlockStreamer(self.publisher, shared_index=self._cursor))

    async def close_current(self) -> None:
        """Close the current streamer, if any."""
        await self._release()

    # -- asking (docs/asking.md) ----------------------------------------------------------

    async def ask_approval(
        self,
        tool_use_id: str,
        *,
        reason: str | None = None,
        expires_in: float | None = DEFAULT_EXPIRES_IN,
        request_id: str | None = None,
    ) -> str:
        """Ask the client to approve the call ``tool_use_id`` (made in this message by
        :meth:`tools`) before it runs; returns the request's id. The call, and every
        other call of the round still without a result, gets none here (ask for each
        call's approval in turn), and the message ends with stop reason ``tool_use``:
        the turn waits. ``expires_in`` seconds from now answers stop being taken (None:
        never)."""
        # Checked before the round's calls are deferred: a refused request changes nothing.
        _expiry(expires_in)
        if reason is not None:
            writable_text(reason)
        checker = self.publisher.checker
        if checker is not None and not checker.knows_tool_use(tool_use_id):
            raise ProtocolError(
                f"{Rule.APPROVAL_UNKNOWN_CALL}: an approval must name a tool call of the stream"
            )
        return await self._asking(
            lambda asker: asker.approval(
                tool_use_id, reason=reason, expires_in=expires_in, request_id=request_id
            )
        )

    async def ask(
        self,
        question: str,
        *,
        schema: Mapping[str, Any] | None = None,
        expires_in: float | None = DEFAULT_EXPIRES_IN,
        request_id: str | None = None,
        tool_use_id: str | None = None,
    ) -> str:
        """Ask the client ``question`` (``schema``: a JSON schema for the answer);
        returns its id. The message ends with stop reason ``tool_use``: the turn waits.
        With ``tool_use_id``, the question is that call's (a call of the message without
        a result, which the app runs and which asks before it can end): the call is not
        the client's to run, and its result goes out after the answer
        (:meth:`tool_result` in the message that continues the turn)."""
        # Checked before the round's calls are deferred: a refused request changes nothing.
        _expiry(expires_in)
        writable_text(question)
        if schema is not None:
            writable_json(dict(schema))
        return await self._asking(
            lambda asker: asker.question(
                question,
                schema=schema,
                expires_in=expires_in,
                request_id=request_id,
                tool_use_id=tool_use_id,
            )
        )

    async def call_client_tool(
        self, name: str, arguments: Mapping[str, Any] | str, *, tool_use_id: str | None = None
    ) -> str:
        """Call tool ``name``, which the client runs (``arguments``: JSON text or a
        mapping); returns the call's id. The message ends with stop reason
        ``tool_use``: the turn waits for the output."""
        # Checked before the round's calls are deferred: a refused call changes nothing.
        if isinstance(arguments, str):
            writable_text(arguments)
        else:
            writable_json(dict(arguments))
        return await self._asking(
            lambda asker: asker.client_call(name, arguments, tool_use_id=tool_use_id)
        )

    async def tool_result(self, tool_use_id: str, output: Any, *, is_error: bool = False) -> None:
        """The result of a call an earlier message made and left to an approval or to the
        question its run asked, now run (in the message that continues the turn):
        ``output`` is text, or any JSON."""
        text = result_text(output)  # before anything goes out: a bad value emits nothing
        await self._release()
        await Asker(self.publisher, shared_index=self._cursor).result(
            tool_use_id, text, is_error=is_error
        )

    async def _asking(self, write: Callable[[Asker], Awaitable[str]]) -> str:
        """Close the current streamer, ``write`` what the message asks, and make the
        message end waiting (stop reason ``tool_use``); the request's id. A message that
        asks leaves its calls without a result to its client (or to the approvals asked
        next): the current round's are deferred, not given an error result."""
        current = self._current
        if isinstance(current, ToolStreamer):
            for tool_use_id in current.pending:
                current.defer(tool_use_id)
        await self._release()
        key = await write(Asker(self.publisher, shared_index=self._cursor))
        self.stop_reason = StopReason.TOOL_USE
        return key

    async def _release(self) -> None:
        current = self._current
        if current is not None:
            await current.close()
            current._retired = True
            self._current = None

    def _adopt(self, streamer: _S) -> _S:
        self._current = streamer
        return streamer


@asynccontextmanager
async def stream_turn(
    publisher: Publisher,
    *,
    message_id: str,
    stream_id: str,
    model: str,
    input_tokens: int = 0,
    error_type: str = "api_error",
) -> AsyncIterator[Turn]:
    """Run one message: preamble on entry, the body's streamers, epilogue on exit.

    If the body raises, an ``error`` event (of ``error_type``, naming only the exception
    class, never its content) ends the stream so no client waits forever, and the
    exception propagates.
    """
    await publisher.send_stream_preamble(message_id, stream_id, model, input_tokens=input_tokens)
    turn = Turn(publisher)
    try:
        yield turn
        await turn.close_current()
        # Inside: an epilogue refused (a stop reason or a count not written as the
        # protocol's) ends the stream with an error too.
        await _end_turn(publisher, turn)
    except Exception as exc:
        await send_failure(publisher, exc, error_type=error_type)
        raise


async def _end_turn(publisher: Publisher, turn: Turn) -> None:
    usage: dict[str, Any] = dict(turn.usage)  # Any: mypy cannot tell these from stop_sequence
    await publisher.send_stream_epilogue(
        turn.stop_reason, turn.output_tokens, stop_sequence=turn.stop_sequence, **usage
    )


@asynccontextmanager
async def continue_turn(
    publisher: Publisher, answered: Answered, *, error_type: str = "api_error"
) -> AsyncIterator[Turn]:
    """Go on with a turn its client answered (docs/asking.md): what a hub's
    ``on_answer`` continuation writes into. The hub has written the message's start and
    the record of the answers; the body's blocks follow them, and the epilogue ends the
    message on exit. As :func:`stream_turn` otherwise."""
    turn = Turn(publisher, answered.next_index)
    try:
        yield turn
        await turn.close_current()
        # Inside: an epilogue refused (a stop reason or a count not written as the
        # protocol's) ends the stream with an error too.
        await _end_turn(publisher, turn)
    except Exception as exc:
        await send_failure(publisher, exc, error_type=error_type)
        raise
