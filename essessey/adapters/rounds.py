"""An agent's rounds in one message, with every block index worked out.

An agent turn is a loop: the model streams reasoning, text and tool calls (a *round*),
the tools run, their results go back to the model, and the next round begins. A client
sees all of it as one message, so the block indexes must run on across rounds. The
layout, the same as the Go original's, is, per round starting at ``base``:

- the round's thinking and text blocks (each opened on its first non-empty chunk, so a
  round without reasoning has no thinking block), then
- its ``n`` tool_use blocks at ``base .. base+n-1``, then
- its ``n`` tool_result blocks at ``base+n .. base+2n-1``, in call order,

and the next round starts at ``base + 2n`` (after the text, when there were no calls).

:class:`RoundStream` keeps that arithmetic in one place. It is safe to call from
concurrent tasks (tools usually run in parallel): results may arrive in any order and are
held until every earlier one is out, because a client renders block ``k`` before
``k + 1``. A call that would break the layout raises :class:`RoundOrderError` and emits
nothing. A call that never gets a result gets an ``is_error`` result at
:meth:`RoundStream.round_end`, so no client waits for it forever.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from essessey.errors import RoundOrderError, SerializationError
from essessey.protocol import EventType, StopReason
from essessey.publisher import Publisher
from essessey.streamers import NO_RESULT_TEXT, ToolCall

__all__ = [
    "RoundStream",
    "RoundSummary",
    "ToolCallRequest",
    "result_text",
    "stream_rounds",
]

logger = logging.getLogger("essessey.adapters.rounds")


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for: its id, the tool's name and its JSON arguments.

    ``arguments`` is the JSON text as the model produced it (possibly still empty when
    the call is announced before its arguments stream in).
    """

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class RoundSummary:
    """What one round published: its content, its calls with their results, its indexes."""

    number: int
    start_index: int
    end_index: int
    text: str = ""
    thinking: str = ""
    signature: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def result_text(result: object) -> str:
    """The text a tool result is published as: a string as it is, anything else as JSON.

    Raises :class:`SerializationError` for a value JSON cannot represent.
    """
    if isinstance(result, str):
        return result
    try:
        return orjson.dumps(result).decode()
    except TypeError as exc:
        raise SerializationError(f"tool result is not JSON-serialisable: {exc}") from exc


class _Phase(enum.Enum):
    IDLE = "idle"  # between rounds
    CONTENT = "content"  # thinking, text and other blocks
    CALLS = "calls"  # tool_use blocks
    RESULTS = "results"  # tool_result blocks


class _Open(enum.Enum):
    NONE = "none"
    THINKING = "thinking"
    TEXT = "text"
    OTHER = "other"


class RoundStream:
    """Publishes an agent's rounds into one message with the original's index layout.

    Per round: :meth:`round_start`, any number of :meth:`delta` (and pass-through
    :meth:`block_start`/:meth:`block_delta`/:meth:`block_stop` for block types it does not
    model), the tool calls as they stream (:meth:`tool_call_start`,
    :meth:`tool_call_delta`), :meth:`assistant_message` with the round's whole list of
    calls once the model is done, :meth:`tool_result` per call in any order, and
    :meth:`round_end`. The caller sends the message's preamble and epilogue, or uses
    :func:`stream_rounds`, which does both.

    A proxy of a provider's own stream keeps that stream's events as they were with
    :meth:`open_content` (a text or thinking block opened with the provider's start
    object), :meth:`raw_delta` (a delta the round does not model, for the open block)
    and :meth:`close_block` (a block closed where the provider closed it).
    """

    __slots__ = (
        "_base",
        "_calls",
        "_declared",
        "_index",
        "_lock",
        "_next_result",
        "_open",
        "_open_call",
        "_open_call_parts",
        "_pending_results",
        "_phase",
        "_round_start",
        "_rounds",
        "_signature",
        "_text_parts",
        "_thinking_parts",
        "output_tokens",
        "publisher",
        "stop_reason",
        "stop_sequence",
        "usage",
    )

    def __init__(self, publisher: Publisher, *, start_index: int = 0) -> None:
        if start_index < 0:
            raise ValueError("start_index must be >= 0")
        self.publisher = publisher
        self._lock = anyio.Lock()
        self._index = start_index
        self._rounds = 0
        self._phase = _Phase.IDLE
        self._reset_round()
        # Read by stream_rounds for the epilogue; set them before the turn ends.
        self.stop_reason: str | None = StopReason.END_TURN
        self.stop_sequence: str | None = None
        self.output_tokens = 0
        self.usage: dict[str, int] = {}

    def _reset_round(self) -> None:
        self._round_start = self._index
        self._open = _Open.NONE
        self._base = -1
        self._calls: list[ToolCall] = []
        self._declared: list[ToolCallRequest] | None = None
        self._open_call = -1
        self._open_call_parts: list[str] = []
        self._pending_results: dict[int, tuple[str, bool]] = {}
        self._next_result = 0
        self._text_parts: list[str] = []
        self._thinking_parts: list[str] = []
        self._signature: str | None = None

    # -- state ---------------------------------------------------------------------

    @property
    def next_index(self) -> int:
        """The next free block index (where the next block will open)."""
        return self._index

    @property
    def rounds(self) -> int:
        """How many rounds have ended."""
        return self._rounds

    @property
    def in_round(self) -> bool:
        """Whether a round is open (started and not yet ended)."""
        return self._phase is not _Phase.IDLE

    # -- the round -------------------------------------------------------------------

    async def round_start(self) -> None:
        """Begin a round at :attr:`next_index`; emits nothing (blocks open lazily)."""
        async with self._lock:
            if self._phase is not _Phase.IDLE:
                raise RoundOrderError("round_start while a round is open; end it first")
            self._reset_round()
            self._phase = _Phase.CONTENT

    async def delta(self, *, text: str = "", reasoning: str = "", signature: str = "") -> None:
        """Stream a chunk of the model's output: reasoning, answer text, or both.

        Reasoning goes to a thinking block, text to a text block; whichever is open is
        closed when the other kind arrives, so reasoning after text opens a new thinking
        block (nothing is dropped). When both are given, reasoning goes first. A
        ``signature`` (a provider's signature of the reasoning) goes to the thinking
        block, after ``reasoning``.
        """
        if not (text or reasoning or signature):
            return
        async with self._lock:
            self._require_content("delta")
            if signature and not reasoning and self._open is not _Open.THINKING:
                raise RoundOrderError("a signature belongs to an open thinking block")
            publisher = self.publisher
            if reasoning or signature:
                await self._switch_to(_Open.THINKING)
                if reasoning:
                    await publisher.send_content_block_delta_thinking(self._index, reasoning)
                    self._thinking_parts.append(reasoning)
                if signature:
                    await publisher.send_signature_delta(self._index, signature)
                    self._signature = signature
            if text:
                await self._switch_to(_Open.TEXT)
                await publisher.send_content_block_delta_text(self._index, text)
                self._text_parts.append(text)

    async def block_start(self, content_block: Mapping[str, Any]) -> None:
        """Open a block of a type this class does not model (passed through as given).

        For a provider's other content (``redacted_thinking``, server tool blocks): it
        takes the next index like any block. Its deltas go through :meth:`block_delta`
        and it ends with :meth:`block_stop`.
        """
        async with self._lock:
            self._require_content("block_start")
            await self._close_content()
            await self._publish_start(content_block)
            self._open = _Open.OTHER

    async def block_delta(self, delta: Mapping[str, Any]) -> None:
        """A delta of the block opened by :meth:`block_start`, passed through as given."""
        async with self._lock:
            if self._phase is not _Phase.CONTENT or self._open is not _Open.OTHER:
                raise RoundOrderError("block_delta without a block opened by block_start")
            await self.publisher.publish(
                EventType.CONTENT_BLOCK_DELTA,
                {"type": EventType.CONTENT_BLOCK_DELTA, "index": self._index, "delta": dict(delta)},
            )

    async def block_stop(self) -> None:
        """Close the block opened by :meth:`block_start`."""
        async with self._lock:
            if self._phase is not _Phase.CONTENT or self._open is not _Open.OTHER:
                raise RoundOrderError("block_stop without a block opened by block_start")
            await self._close_content()

    async def open_content(self, content_block: Mapping[str, Any]) -> None:
        """Open a text or thinking block whose start object is given, passed through as is.

        For a provider's start object with fields the dialect's own lacks (an Anthropic
        thinking block's empty ``signature``). The block is then the round's open text
        or thinking block: :meth:`delta` of its kind continues it and its content counts
        in the summary. It must get content before it closes (a client would render an
        empty card), so open it just before its first chunk. Raises ValueError for any
        other block type (:meth:`block_start` takes those).
        """
        block_type = content_block.get("type")
        kind = _Open.TEXT if block_type == "text" else _Open.THINKING
        if block_type not in ("text", "thinking"):
            raise ValueError("open_content takes a text or thinking block")
        async with self._lock:
            self._require_content("open_content")
            await self._close_content()
            await self._publish_start(content_block)
            self._open = kind

    async def raw_delta(self, delta: Mapping[str, Any]) -> None:
        """A delta for the open block, whichever kind it is, passed through as given.

        For what the round does not model (a text block's ``citations_delta``, a
        provider's empty chunk): it goes to the open text, thinking or pass-through
        block, or to the open tool call, and adds nothing to the round's summary.
        """
        async with self._lock:
            if self._phase is _Phase.CONTENT and self._open is not _Open.NONE:
                index = self._index
            elif self._phase is _Phase.CALLS and self._open_call >= 0:
                index = self._base + self._open_call
            else:
                raise RoundOrderError("raw_delta without an open block")
            await self.publisher.publish(
                EventType.CONTENT_BLOCK_DELTA,
                {"type": EventType.CONTENT_BLOCK_DELTA, "index": index, "delta": dict(delta)},
            )

    async def close_block(self) -> None:
        """Close the open block (content or tool call) now.

        A block otherwise closes when the next one opens; a proxy closes it where the
        provider did, so the events in between (pings) keep their order.
        """
        async with self._lock:
            if self._phase is _Phase.CONTENT and self._open is not _Open.NONE:
                await self._close_content()
            elif self._phase is _Phase.CALLS and self._open_call >= 0:
                await self._close_call()
            else:
                raise RoundOrderError("close_block without an open block")

    async def tool_call_start(self, i: int, call: ToolCallRequest) -> None:
        """Open the tool_use block of the round's call ``i`` at ``base + i``.

        Calls start in order (``i`` is the number already started). ``call.arguments``,
        when given, goes out as one input delta; before :meth:`assistant_message` more
        may follow through :meth:`tool_call_delta` while this call is the open one (after
        it, the block closes at once). Starting a call that is
        already out with the same id does nothing, so a loop may announce the calls it
        streamed again when it runs them.
        """
        async with self._lock:
            if self._phase in (_Phase.IDLE, _Phase.RESULTS) and not self._already_started(i, call):
                raise RoundOrderError(
                    f"tool call {i} cannot start now: "
                    + ("no round is open" if self._phase is _Phase.IDLE else "results began")
                )
            if self._already_started(i, call):
                return
            self._check_new_call(i, call)
            await self._emit_call(call)
            if self._declared is not None:
                # The model's output is complete: the arguments are whole, so is the block.
                await self._close_call()

    async def tool_call_delta(self, i: int, partial_json: str) -> None:
        """Stream a fragment of the JSON arguments of call ``i``, the open call."""
        async with self._lock:
            if self._phase is not _Phase.CALLS or i != self._open_call:
                raise RoundOrderError(
                    f"arguments for tool call {i}, but "
                    + (f"the open call is {self._open_call}" if self._open_call >= 0 else "none")
                    + " is open"
                )
            if partial_json:
                await self.publisher.send_tool_input_delta(self._base + i, partial_json)
                self._open_call_parts.append(partial_json)

    async def assistant_message(self, tool_calls: Sequence[ToolCallRequest] = ()) -> None:
        """The model's round is complete: close its content and fix its tool calls.

        ``tool_calls`` is the round's whole list. Calls already streamed must be its
        first entries, with the same ids; the rest start with :meth:`tool_call_start` or,
        at the latest, when results go out.
        """
        async with self._lock:
            if self._phase not in (_Phase.CONTENT, _Phase.CALLS):
                raise RoundOrderError("assistant_message outside a round's model output")
            if self._declared is not None:
                raise RoundOrderError("assistant_message was already sent for this round")
            declared = list(tool_calls)
            started = self._calls
            if len(started) > len(declared) or any(
                call.tool_use_id != request.id
                for call, request in zip(started, declared, strict=False)
            ):
                raise RoundOrderError(
                    f"{len(started)} tool calls were streamed, and the message's first "
                    f"{len(started)} of {len(declared)} do not match them"
                )
            ids = [request.id for request in declared]
            if len(set(ids)) != len(ids) or not all(ids):
                raise RoundOrderError("the round's tool call ids must be non-empty and distinct")
            await self._close_content()
            await self._close_call()
            if self._phase is _Phase.CONTENT:
                self._phase = _Phase.CALLS
                self._base = self._index
            self._declared = declared

    async def tool_result(self, i: int, result: object, *, is_error: bool = False) -> None:
        """The result of call ``i``: published at ``base + n + i`` once ``0..i-1`` are out.

        ``result`` is text or any JSON-serialisable value (see :func:`result_text`).
        Needs :meth:`assistant_message` first (the layout depends on the round's number
        of calls).
        """
        text = result_text(result)
        async with self._lock:
            if self._phase not in (_Phase.CALLS, _Phase.CONTENT, _Phase.RESULTS):
                raise RoundOrderError(f"tool result {i} outside a round")
            declared = self._declared
            if declared is None:
                raise RoundOrderError(
                    "tool_result before assistant_message: the round's calls are not known yet"
                )
            if not 0 <= i < len(declared):
                raise RoundOrderError(f"no tool call {i} in this round ({len(declared)} calls)")
            if i < self._next_result or i in self._pending_results:
                raise RoundOrderError(f"tool call {i} already has a result")
            self._pending_results[i] = (text, is_error)
            await self._flush_results()

    async def round_end(self, *, answer_missing: bool = True) -> RoundSummary:
        """End the round: close what is open, answer owed calls with an error result.

        Without :meth:`assistant_message`, the calls streamed so far are the round's
        calls. Returns what the round published.

        ``answer_missing=False`` leaves owed calls unanswered instead, for a message that
        ends at the model's tool calls (stop reason ``tool_use``) and whose results come
        in a later message: declared calls not yet out get their tool_use blocks, and a
        result held back for an earlier unanswered call is dropped with a warning.
        """
        async with self._lock:
            if self._phase is _Phase.IDLE:
                raise RoundOrderError("round_end without an open round")
            await self._close_content()
            await self._close_call()
            if self._declared is None:
                self._declared = [
                    ToolCallRequest(call.tool_use_id, call.name, call.arguments)
                    for call in self._calls
                ]
            if answer_missing:
                for i in range(self._next_result, len(self._declared)):
                    if i not in self._pending_results:
                        logger.warning(
                            "tool call %d of round %d got no result; sending an error result",
                            i,
                            self._rounds,
                        )
                        self._pending_results[i] = (NO_RESULT_TEXT, True)
            elif self._phase is not _Phase.RESULTS:
                # Once results began, _flush_results has announced every declared call.
                for request in self._declared[len(self._calls) :]:
                    await self._emit_call(request)
                await self._close_call()
            await self._flush_results()
            if self._pending_results:
                logger.warning(
                    "%d tool result(s) of round %d wait for an earlier call's result; dropped",
                    len(self._pending_results),
                    self._rounds,
                )
                self._pending_results.clear()
            summary = RoundSummary(
                number=self._rounds,
                start_index=self._round_start,
                end_index=self._index,
                text="".join(self._text_parts),
                thinking="".join(self._thinking_parts),
                signature=self._signature,
                tool_calls=list(self._calls),
            )
            self._rounds += 1
            self._phase = _Phase.IDLE
            return summary

    # -- internals (called with the lock held) -----------------------------------------

    async def _publish_start(self, content_block: Mapping[str, Any]) -> None:
        # "type" first, as every other event: publish() would add it last.
        await self.publisher.publish(
            EventType.CONTENT_BLOCK_START,
            {
                "type": EventType.CONTENT_BLOCK_START,
                "index": self._index,
                "content_block": dict(content_block),
            },
        )

    def _require_content(self, what: str) -> None:
        if self._phase is not _Phase.CONTENT:
            raise RoundOrderError(
                f"{what} outside a round's content: "
                + ("no round is open" if self._phase is _Phase.IDLE else "tool calls began")
            )

    async def _switch_to(self, kind: _Open) -> None:
        if self._open is kind:
            return
        await self._close_content()
        if kind is _Open.THINKING:
            await self.publisher.send_content_block_start_thinking(self._index)
        else:
            await self.publisher.send_content_block_start_text(self._index)
        self._open = kind

    async def _close_content(self) -> None:
        if self._open is not _Open.NONE:
            await self.publisher.send_content_block_stop(self._index)
            self._open = _Open.NONE
            self._index += 1

    def _already_started(self, i: int, call: ToolCallRequest) -> bool:
        return i < len(self._calls) and self._calls[i].tool_use_id == call.id

    def _check_new_call(self, i: int, call: ToolCallRequest) -> None:
        if i != len(self._calls):
            raise RoundOrderError(
                f"tool call {i} started out of order: the next call is {len(self._calls)}"
            )
        declared = self._declared
        if declared is not None:
            if i >= len(declared) or declared[i].id != call.id:
                raise RoundOrderError(f"tool call {i} is not the round's declared call {i}")
        elif not call.id or any(c.tool_use_id == call.id for c in self._calls):
            raise RoundOrderError(f"tool call id {call.id!r} is empty or already used")
        if not call.name:
            raise RoundOrderError(f"tool call {i} has no tool name")

    async def _emit_call(self, call: ToolCallRequest) -> None:
        # Closing the round's content fixes the base; do it before the first call only.
        if self._phase is _Phase.CONTENT:
            await self._close_content()
            self._phase = _Phase.CALLS
            self._base = self._index
        await self._close_call()
        index = self._base + len(self._calls)
        await self.publisher.send_tool_use_start(index, call.id, call.name)
        self._calls.append(ToolCall(call.id, call.name))
        self._open_call = len(self._calls) - 1
        self._index = index
        if call.arguments:
            await self.publisher.send_tool_input_delta(index, call.arguments)
            self._open_call_parts.append(call.arguments)

    async def _close_call(self) -> None:
        if self._open_call < 0:
            return
        index = self._base + self._open_call
        await self.publisher.send_content_block_stop(index)
        self._calls[self._open_call].arguments = "".join(self._open_call_parts)
        self._open_call_parts = []
        self._open_call = -1
        self._index = index + 1

    async def _flush_results(self) -> None:
        declared = self._declared
        assert declared is not None
        if self._next_result not in self._pending_results:
            return
        # Results come after every tool_use block: announce declared calls never started.
        for request in declared[len(self._calls) :]:
            await self._emit_call(request)
        await self._close_call()
        self._phase = _Phase.RESULTS
        n = len(declared)
        while self._next_result in self._pending_results:
            i = self._next_result
            text, is_error = self._pending_results.pop(i)
            call = self._calls[i]
            await self.publisher.send_tool_result_block(
                self._base + n + i, call.tool_use_id, text, is_error=is_error
            )
            call.result = text
            call.is_error = is_error
            self._next_result = i + 1
            self._index = self._base + n + i + 1


@asynccontextmanager
async def stream_rounds(
    publisher: Publisher,
    *,
    message_id: str,
    stream_id: str,
    model: str,
    input_tokens: int = 0,
    error_type: str = "api_error",
) -> AsyncIterator[RoundStream]:
    """Run one agent message: preamble on entry, the rounds, epilogue on exit.

    A round still open when the body ends is ended (owed results become error
    results). Set ``rounds.stop_reason``, ``output_tokens`` and ``usage`` for the
    epilogue. If the body raises, an ``error`` event naming only the exception class
    ends the stream and the exception propagates.
    """
    await publisher.send_stream_preamble(message_id, stream_id, model, input_tokens=input_tokens)
    rounds = RoundStream(publisher)
    try:
        yield rounds
        if rounds.in_round:
            await rounds.round_end()
    except Exception as exc:
        try:
            await publisher.send_error(error_type, f"the turn failed: {type(exc).__name__}")
        except Exception as send_exc:
            logger.error("could not send the error event: %s", type(send_exc).__name__)
        raise
    usage: dict[str, Any] = dict(rounds.usage)
    await publisher.send_stream_epilogue(
        rounds.stop_reason, rounds.output_tokens, stop_sequence=rounds.stop_sequence, **usage
    )
