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

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from essessey._failure import send_failure
from essessey.errors import RoundOrderError
from essessey.protocol import StopReason, result_text
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher, writable_text
from essessey.streamers import (
    DEFAULT_EXPIRES_IN,
    NO_RESULT_TEXT,
    Asker,
    BlockIndex,
    BlockStreamer,
    TextStreamer,
    ThinkingStreamer,
    ToolCall,
    ToolStreamer,
    refused_call,
)

__all__ = [
    "RoundStream",
    "RoundSummary",
    "ToolCallRequest",
    "continue_rounds",
    "result_text",
    "stream_rounds",
]

logger = logging.getLogger("essessey.adapters.rounds")


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """A tool call the model asked for: its id, the tool's name and its JSON arguments.

    ``arguments`` is the JSON text as the model produced it (possibly still empty when
    the call is announced before its arguments stream in). ``item_type`` is the
    provider's own type for a call that is not a plain function call (a Responses API
    ``custom_tool_call``, ``shell_call``, ...), and ``caller`` what made the call when the
    model did not (the code of a provider's programmatic tool calling, as the provider
    names it), both carried on its tool_use block (``protocol.tool_use_block_start``).
    """

    id: str
    name: str
    arguments: str = ""
    item_type: str | None = None
    caller: dict[str, Any] | None = None


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


_S = TypeVar("_S", TextStreamer, ThinkingStreamer)


class _Phase:
    # Plain strings compared by identity, not an enum.Enum: Python 3.11 looks an enum
    # member up through the enum's metaclass, and deltas check the phase for every event.
    IDLE: Final = "idle"  # between rounds
    OUTPUT: Final = "output"  # the model's output: thinking, text, tool calls, other blocks
    DECLARED: Final = "declared"  # assistant_message fixed the round's calls
    RESULTS: Final = "results"  # tool_result blocks


class _Gate:
    """The round's lock, first come first served: taken without a coroutine when it is
    free (deltas take it for every event), waited for in turn otherwise."""

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """Take the gate if it is free (no coroutine); False when :meth:`wait` must."""
        if self.held or self.waiters:
            return False
        self.held = True
        return True

    async def wait(self) -> None:
        """Take the gate once every earlier waiter had it (it is handed on, never raced);
        for a caller that :meth:`take` refused."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the gate, then cancelled: hand it on
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Hand the gate to the first waiter still waiting, else free it."""
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # held stays True: it passes to that waiter
                return
        self.held = False

    async def __aenter__(self) -> None:
        if not self.take():
            await self.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


_Content = TextStreamer | ThinkingStreamer | BlockStreamer


class RoundStream:
    """Publishes an agent's rounds into one message with the original's index layout.

    Per round: :meth:`round_start`, the model's output as it streams (:meth:`delta`
    for reasoning and text, :meth:`tool_call_start` and :meth:`tool_call_delta` for tool
    calls, and pass-through :meth:`block_start`/:meth:`block_delta`/:meth:`block_stop`
    for block types it does not model), :meth:`assistant_message` with the round's
    whole list of calls once the model is done, :meth:`tool_result` per call in any
    order, and :meth:`round_end`. The caller sends the message's preamble and epilogue,
    or uses :func:`stream_rounds`, which does both.

    The model's blocks keep the order they came in: text after a tool call, or a
    server tool's block between two calls, is a block of its own after what came
    before (the provider's order is the truth). Only the results wait: they come after
    every block of the round's model output.

    The blocks are written by the streamers (:mod:`essessey.streamers`) through one
    shared :class:`~essessey.streamers.BlockIndex`, which owns the indexes; this class
    owns the round: its phases, its declared calls and the order of their results.

    A proxy of a provider's own stream keeps that stream's events as they were with
    :meth:`open_content` (a text or thinking block opened with the provider's start
    object), :meth:`raw_delta` (a delta the round does not model, for the open block)
    and :meth:`close_block` (a block closed where the provider closed it).
    """

    __slots__ = (
        "_call_ids",
        "_content",
        "_cursor",
        "_declared",
        "_lock",
        "_next_result",
        "_pending_results",
        "_phase",
        "_round_start",
        "_rounds",
        "_signature",
        "_text_parts",
        "_thinking_parts",
        "_tool_calls",
        "_tools",
        "output_tokens",
        "publisher",
        "stop_details",
        "stop_reason",
        "stop_sequence",
        "usage",
    )

    def __init__(self, publisher: Publisher, *, start_index: int = 0) -> None:
        self.publisher = publisher
        self._cursor = BlockIndex(publisher, start_index)
        # Deltas take it on every event: a free gate is a flag, no coroutine.
        self._lock = _Gate()
        self._rounds = 0
        # Every tool_use id this message opened, in any round: a client matches a
        # result to its call by id, so an id is used once in a message (and a stream).
        self._call_ids: set[str] = set()
        self._phase: str = _Phase.IDLE
        self._reset_round()
        # Read by stream_rounds for the epilogue; set them before the turn ends.
        self.stop_reason: str | None = StopReason.END_TURN
        self.stop_sequence: str | None = None
        self.stop_details: dict[str, Any] | None = None
        self.output_tokens = 0
        self.usage: dict[str, int] = {}

    def _reset_round(self) -> None:
        self._round_start = self._cursor.index
        self._content: _Content | None = None
        tools = ToolStreamer(self.publisher, shared_index=self._cursor)
        self._tools = tools
        # A live view, read once per round: tool_call_delta checks it for every fragment.
        self._tool_calls = tools.started_calls
        self._declared: list[ToolCallRequest] | None = None
        self._pending_results: dict[int, tuple[str, bool]] = {}
        self._next_result = 0
        self._text_parts: list[str] = []
        self._thinking_parts: list[str] = []
        self._signature: str | None = None

    # -- state ---------------------------------------------------------------------

    @property
    def next_index(self) -> int:
        """The next free block index (where the next block will open)."""
        return self._cursor.index

    @property
    def rounds(self) -> int:
        """How many rounds have ended."""
        return self._rounds

    def call_id_used(self, call_id: str) -> bool:
        """Whether a tool call of this message has ``call_id`` already, or the stream's
        checker knows it from an earlier message (strict publishers): an adapter gives
        a call whose id repeats one a fresh id, as a provider's repeated id would
        otherwise break the message."""
        if call_id in self._call_ids:
            return True
        checker = self.publisher.checker
        return checker is not None and checker.knows_tool_use(call_id)

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
            self._phase = _Phase.OUTPUT

    async def delta(self, *, text: str = "", reasoning: str = "", signature: str = "") -> None:
        """Stream a chunk of the model's output: reasoning, answer text, or both.

        Reasoning goes to a thinking block, text to a text block; whichever block is
        open (a tool call's too) is closed when another kind arrives, so reasoning after
        text opens a new thinking block (nothing is dropped). When both are given,
        reasoning goes first. A ``signature`` (a provider's signature of the reasoning)
        goes to the thinking block, after ``reasoning``.
        """
        if not (text or reasoning or signature):
            return
        # The gate's take and release and the phase's check, written out: the path of
        # nearly every event of a round.
        gate = self._lock
        if gate.held or gate.waiters:
            await gate.wait()
        else:
            gate.held = True
        try:
            if self._phase is not _Phase.OUTPUT:
                self._require_output("delta")
            if signature and not reasoning and not isinstance(self._content, ThinkingStreamer):
                raise RoundOrderError("a signature belongs to an open thinking block")
            if signature:
                writable_text(signature)  # before the reasoning goes out: nothing partial
            if reasoning or signature:
                thinking = self._content
                if type(thinking) is not ThinkingStreamer:
                    thinking = await self._switch_to(ThinkingStreamer)
                if reasoning:
                    await thinking.write(reasoning)
                if signature:
                    await thinking.write_signature(signature)
                    self._signature = signature
            if text:
                streamer = self._content
                if type(streamer) is not TextStreamer:
                    streamer = await self._switch_to(TextStreamer)
                await streamer.write(text)
        finally:
            if gate.waiters:
                gate.release()
            else:
                gate.held = False

    async def block_start(self, content_block: Mapping[str, Any]) -> None:
        """Open a block of a type this class does not model (passed through as given).

        For a provider's other content (``redacted_thinking``, server tool blocks): it
        takes the next index like any block, wherever it comes in the model's output.
        Its deltas go through :meth:`block_delta` and it ends with :meth:`block_stop`.
        """
        async with self._lock:
            self._require_output("block_start")
            await self._close_open()
            block = BlockStreamer(self.publisher, shared_index=self._cursor)
            await block.start(content_block)
            self._content = block

    async def block_delta(self, delta: Mapping[str, Any]) -> None:
        """A delta of the block opened by :meth:`block_start`, passed through as given."""
        async with self._lock:
            block = self._content
            if not isinstance(block, BlockStreamer):
                raise RoundOrderError("block_delta without a block opened by block_start")
            await block.write(delta)

    async def block_stop(self) -> None:
        """Close the block opened by :meth:`block_start`."""
        async with self._lock:
            if not isinstance(self._content, BlockStreamer):
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
        if block_type not in ("text", "thinking"):
            raise ValueError("open_content takes a text or thinking block")
        async with self._lock:
            self._require_output("open_content")
            await self._close_open()
            streamer = (
                TextStreamer(self.publisher, shared_index=self._cursor)
                if block_type == "text"
                else ThinkingStreamer(self.publisher, shared_index=self._cursor)
            )
            await streamer.start(content_block)
            self._content = streamer

    async def raw_delta(self, delta: Mapping[str, Any]) -> None:
        """A delta for the open block, whichever kind it is, passed through as given.

        For what the round does not model (a text block's ``citations_delta``, a
        provider's empty chunk): it goes to the open text, thinking or pass-through
        block, or to the open tool call, and adds nothing to the round's summary.
        """
        async with self._lock:
            if self._phase is _Phase.IDLE or not self._cursor.is_open:
                raise RoundOrderError("raw_delta without an open block")
            await self._cursor.raw_delta(delta)

    async def close_block(self) -> None:
        """Close the open block (content or tool call) now.

        A block otherwise closes when the next one opens; a proxy closes it where the
        provider did, so the events in between (pings) keep their order.
        """
        async with self._lock:
            if self._phase is _Phase.IDLE or not self._cursor.is_open:
                raise RoundOrderError("close_block without an open block")
            await self._close_open()

    async def tool_call_start(self, i: int, call: ToolCallRequest) -> None:
        """Open the tool_use block of the round's call ``i`` at the next index.

        Calls start in order (``i`` is the number already started). ``call.arguments``,
        when given, goes out as one input delta; before :meth:`assistant_message` more
        may follow through :meth:`tool_call_delta` while this call is the open one (after
        it, the block closes at once). Starting a call that is already out with the same
        id does nothing, so a loop may announce the calls it streamed again when it runs
        them.
        """
        async with self._lock:
            if self._already_started(i, call):
                return
            if self._phase in (_Phase.IDLE, _Phase.RESULTS):
                raise RoundOrderError(
                    f"tool call {i} cannot start now: "
                    + ("no round is open" if self._phase is _Phase.IDLE else "results began")
                )
            self._check_new_call(i, call)
            await self._close_content()
            await self._tools.start_call(
                call.id, call.name, call.arguments, item_type=call.item_type, caller=call.caller
            )
            self._call_ids.add(call.id)
            if self._declared is not None:
                # The model's output is complete: the arguments are whole, so is the block.
                await self._tools.end_call()

    async def tool_call_delta(self, i: int, partial_json: str) -> None:
        """Stream a fragment of the JSON arguments of call ``i``, the open call."""
        gate = self._lock
        if not gate.take():
            await gate.wait()
        try:
            calls = self._tool_calls
            open_id = self._tools.open_call
            open_i = len(calls) - 1 if open_id is not None else -1
            if self._phase is not _Phase.OUTPUT or i != open_i:
                raise RoundOrderError(
                    f"arguments for tool call {i}, but "
                    + (f"the open call is {open_i}" if open_i >= 0 else "none")
                    + " is open"
                )
            await self._tools.write_arguments(calls[i].tool_use_id, partial_json)
        finally:
            gate.release()

    async def assistant_message(self, tool_calls: Sequence[ToolCallRequest] = ()) -> None:
        """The model's round is complete: close its content and fix its tool calls.

        ``tool_calls`` is the round's whole list. Calls already streamed must be its
        first entries, with the same ids; the rest start with :meth:`tool_call_start` or,
        at the latest, when results go out.
        """
        async with self._lock:
            if self._phase is not _Phase.OUTPUT:
                raise RoundOrderError(
                    "assistant_message was already sent for this round"
                    if self._phase in (_Phase.DECLARED, _Phase.RESULTS)
                    else "assistant_message outside a round's model output"
                )
            declared = list(tool_calls)
            started = self._tool_calls
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
            await self._close_open()
            self._declared = declared
            self._phase = _Phase.DECLARED

    async def tool_result(self, i: int, result: object, *, is_error: bool = False) -> None:
        """The result of call ``i``: published after the round's output, in call order.

        ``result`` is text or any JSON-serialisable value (see :func:`result_text`).
        Needs :meth:`assistant_message` first (the layout depends on the round's number
        of calls); a result that comes before an earlier call's is held until that one
        is out, because a client renders block ``k`` before ``k + 1``.
        """
        text = result_text(result)
        writable_text(text)  # now, not when it goes out behind an earlier call's result
        async with self._lock:
            if self._phase is _Phase.IDLE:
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
        result held back for an earlier unanswered call goes out now, after the results
        before it, in call order (the unanswered call's result comes in the later
        message, wherever the others are).
        """
        async with self._lock:
            if self._phase is _Phase.IDLE:
                raise RoundOrderError("round_end without an open round")
            await self._close_open()
            tools = self._tools
            if self._declared is None:
                self._declared = [
                    ToolCallRequest(call.tool_use_id, call.name, call.arguments)
                    for call in tools.calls
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
                await self._announce_declared()
            await self._flush_results()
            # Only with answer_missing=False: results behind a call whose answer comes in
            # a later message. They are whole, so none waits for that message.
            held = self._pending_results
            for i in sorted(held):
                text, is_error = held.pop(i)
                await self._tools.write_result(
                    self._tool_calls[i].tool_use_id, text, is_error=is_error
                )
            summary = RoundSummary(
                number=self._rounds,
                start_index=self._round_start,
                end_index=self._cursor.index,
                text="".join(self._text_parts),
                thinking="".join(self._thinking_parts),
                signature=self._signature,
                tool_calls=tools.calls,
            )
            self._rounds += 1
            self._phase = _Phase.IDLE
            return summary

    # -- asking (docs/asking.md) -----------------------------------------------------------

    async def ask_approval(
        self,
        tool_use_id: str,
        *,
        reason: str | None = None,
        expires_in: float | None = DEFAULT_EXPIRES_IN,
        request_id: str | None = None,
    ) -> str:
        """Ask the client to approve the call ``tool_use_id`` of a round ended with
        ``round_end(answer_missing=False)``, before it runs; returns the request's id.
        The message ends with stop reason ``tool_use``: the turn waits."""
        return await self._asking(
            "ask_approval",
            lambda asker: asker.approval(
                tool_use_id, reason=reason, expires_in=expires_in, request_id=request_id
            ),
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
        """Ask the client ``question`` between rounds; returns its id. The message ends
        with stop reason ``tool_use``: the turn waits. ``tool_use_id``: the call (of the
        round, without a result) whose run asks it; its result comes after the answer
        (:meth:`earlier_result`), and the client does not run it."""
        return await self._asking(
            "ask",
            lambda asker: asker.question(
                question,
                schema=schema,
                expires_in=expires_in,
                request_id=request_id,
                tool_use_id=tool_use_id,
            ),
        )

    async def earlier_result(
        self, tool_use_id: str, result: object, *, is_error: bool = False
    ) -> None:
        """The result of a call an earlier message made and left to an approval or to the
        question its run asked (in the message that continues the turn, between rounds):
        text as it is, else JSON."""
        async with self._lock:
            self._require_idle("earlier_result")
            text = result_text(result)
            await Asker(self.publisher, shared_index=self._cursor).result(
                tool_use_id, text, is_error=is_error
            )

    async def _asking(self, what: str, write: Callable[[Asker], Awaitable[str]]) -> str:
        """Between rounds, ``write`` what the message asks and make it end waiting (stop
        reason ``tool_use``); the request's id."""
        async with self._lock:
            self._require_idle(what)
            key = await write(Asker(self.publisher, shared_index=self._cursor))
            self.stop_reason = StopReason.TOOL_USE
            return key

    def _require_idle(self, what: str) -> None:
        if self._phase is not _Phase.IDLE:
            raise RoundOrderError(f"{what} comes between rounds: end the round first")

    # -- internals (called with the lock held) -----------------------------------------

    def _require_output(self, what: str) -> None:
        if self._phase is not _Phase.OUTPUT:
            raise RoundOrderError(
                f"{what} outside a round's model output: "
                + (
                    "no round is open"
                    if self._phase is _Phase.IDLE
                    else "assistant_message already ended it"
                )
            )

    async def _switch_to(self, kind: type[_S]) -> _S:
        # The caller checked that the open content is not already of this kind: the
        # deltas' path tests that without a coroutine.
        await self._close_open()
        streamer = kind(self.publisher, shared_index=self._cursor)
        self._content = streamer
        return streamer

    async def _close_content(self) -> None:
        content = self._content
        if content is None:
            return
        await content.close()
        self._content = None
        if isinstance(content, ThinkingStreamer):
            self._thinking_parts.append(content.text)
        elif isinstance(content, TextStreamer):
            self._text_parts.append(content.text)

    async def _close_open(self) -> None:
        await self._close_content()
        await self._tools.end_call()

    def _already_started(self, i: int, call: ToolCallRequest) -> bool:
        calls = self._tool_calls
        return i < len(calls) and calls[i].tool_use_id == call.id

    def _check_new_call(self, i: int, call: ToolCallRequest) -> None:
        calls = self._tool_calls
        if i != len(calls):
            raise RoundOrderError(
                f"tool call {i} started out of order: the next call is {len(calls)}"
            )
        declared = self._declared
        if declared is not None and (i >= len(declared) or declared[i].id != call.id):
            raise RoundOrderError(f"tool call {i} is not the round's declared call {i}")
        reason = refused_call(call.id, call.name, self._tools.calls_by_id)
        if reason is not None:
            raise RoundOrderError(reason)

    async def _announce_declared(self) -> None:
        # Results come after every tool_use block: declared calls never started go now.
        declared = self._declared
        assert declared is not None
        tools = self._tools
        for request in declared[len(self._tool_calls) :]:
            await self._close_content()
            await tools.start_call(
                request.id,
                request.name,
                request.arguments,
                item_type=request.item_type,
                caller=request.caller,
            )
            self._call_ids.add(request.id)
        await tools.end_call()

    async def _flush_results(self) -> None:
        if self._next_result not in self._pending_results:
            return
        if self._phase is not _Phase.RESULTS:
            await self._close_open()
            await self._announce_declared()
            self._phase = _Phase.RESULTS
        calls = self._tool_calls
        while self._next_result in self._pending_results:
            i = self._next_result
            text, is_error = self._pending_results.pop(i)
            await self._tools.write_result(calls[i].tool_use_id, text, is_error=is_error)
            self._next_result = i + 1


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
        # Inside: an epilogue refused (a stop reason or a count not written as the
        # protocol's) ends the stream with an error too.
        await _end_rounds(publisher, rounds)
    except Exception as exc:
        await send_failure(publisher, exc, error_type=error_type)
        raise


async def _end_rounds(publisher: Publisher, rounds: RoundStream) -> None:
    usage: dict[str, Any] = dict(rounds.usage)
    await publisher.send_stream_epilogue(
        rounds.stop_reason,
        rounds.output_tokens,
        stop_sequence=rounds.stop_sequence,
        stop_details=rounds.stop_details,
        **usage,
    )


@asynccontextmanager
async def continue_rounds(
    publisher: Publisher, answered: Answered, *, error_type: str = "api_error"
) -> AsyncIterator[RoundStream]:
    """Go on with an agent's turn its client answered (docs/asking.md): the rounds of
    the message the hub started with the record of the answers, from
    ``answered.next_index``; the epilogue ends it on exit. As :func:`stream_rounds`
    otherwise."""
    rounds = RoundStream(publisher, start_index=answered.next_index)
    try:
        yield rounds
        if rounds.in_round:
            await rounds.round_end()
        # Inside: an epilogue refused (a stop reason or a count not written as the
        # protocol's) ends the stream with an error too.
        await _end_rounds(publisher, rounds)
    except Exception as exc:
        await send_failure(publisher, exc, error_type=error_type)
        raise
