"""Publish a LangGraph run as the protocol: every LLM call of the graph a round.

``graph.astream(input, config, stream_mode=["messages", "updates"])`` streams a compiled
graph's run as the chat models' message chunks, the messages the nodes return, and each
node's update. :func:`stream_run` publishes that stream into one message of a
:class:`~essessey.adapters.RoundStream` (:func:`graph_stream` starts it with the modes it
reads):

============================================  =========================================
LangGraph stream part                         published as
============================================  =========================================
``messages``: an ``AIMessageChunk``           the round of its LLM call (the chunks of
                                              one message id): its text (``content`` as
                                              a string, or its ``content_blocks``' text
                                              and refusal blocks) in a text block, its
                                              ``reasoning`` blocks (a provider's
                                              thinking, ``reasoning_content``) in a
                                              thinking block with their signature
``tool_call_chunks`` of those chunks          a tool_use block per ``index``, its id and
                                              name from the first fragment, the
                                              arguments streamed as they come (parallel
                                              calls too, interleaved or not)
``messages``: a whole ``AIMessage``           a round of its own, whole (a node that
                                              wrote the message itself, a subgraph's
                                              messages when ``subgraphs`` is off)
``messages``: a ``ToolMessage``               the ``tool_result`` of the call its
                                              ``tool_call_id`` names, ``is_error`` for
                                              ``status="error"`` (``ToolNode``'s error
                                              message for a tool that raised)
``updates``: ``__interrupt__``                what the message asks once the run
                                              stopped: each ``Interrupt`` a question
                                              (``rounds.ask``), or the approval of a
                                              call (:func:`request_approval`)
``usage_metadata``, ``response_metadata``     the epilogue's usage (every call's summed),
                                              the model name (``model_name``) and stop
                                              reason (``finish_reason``/``stop_reason``)
============================================  =========================================

Only the LLM calls LangGraph streams in ``messages`` mode are published: a model bound with
the ``nostream`` tag (``model.with_config(tags=["nostream"])``, LangGraph's own way to keep
an internal call out of the stream) is not, and ``nodes`` limits the rounds to the LLM calls
of the nodes it names. A subgraph's LLM calls stream only with ``subgraphs=True`` (given to
``astream``); without it, the messages a subgraph node returns are published whole, when
the node ends. Human and system messages a node writes are not published.

Two LLM calls that stream at the same time (parallel branches) are published one after
the other: the chunks of the second are held until the first's output is whole.

A run that stops at ``interrupt()`` (LangGraph's human in the loop) ends its message
asking: an interrupt's value that is a string is the question, a mapping with a string
``"question"`` asks that (its ``"schema"``, else the interrupt's ``response_schema``, is the
answer's JSON schema), any other value is asked as its JSON text; the request's id is the
interrupt's own id. The value :func:`request_approval` interrupts with names a call of the
round that has no result: it becomes the approval of that call. The answer, in any
dialect, resumes the graph with ``Command(resume={interrupt id: value})``
(:class:`AgentTurns`); the graph's own state is its checkpointer's (a checkpointer every
replica shares, for replicas), and :class:`~essessey.adapters.RunStates` keeps only the
thread's config and the request ids. Calls a round made that the graph did not run (tools
the client runs, as AG-UI's frontend tools) end the message waiting for their outputs,
which go back as ``ToolMessage`` s.

An error the run raises ends the message with an ``error`` event and propagates; a run
whose publisher is cancelled has its ``astream`` closed, which cancels the graph's tasks.
Logs carry types, counts and lengths, never text or arguments.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Collection,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, cast

import anyio
import orjson
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, interrupt

from essessey._public import set_public_module
from essessey.adapters._message import PublishedToolCall, parse_arguments
from essessey.adapters._run_state import RunStates
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import has_lone_surrogate, replace_surrogates
from essessey.adapters.rounds import RoundStream, continue_rounds, stream_rounds
from essessey.dialects import DialectRequest, conversation, user_text
from essessey.dialects.agui import AGUIRunRequest
from essessey.hub import TurnProducer
from essessey.protocol import StopReason, result_text
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher

__all__ = [
    "APPROVAL",
    "STREAM_MODES",
    "AgentTurns",
    "Approval",
    "PublishedRun",
    "graph_input",
    "graph_stream",
    "publish_run",
    "request_approval",
    "stream_run",
]

logger = logging.getLogger("essessey.adapters.langgraph")

STREAM_MODES: Final = ("messages", "updates")
"""The ``stream_mode`` s :func:`stream_run` reads (others are skipped)."""

APPROVAL: Final = "tool_approval"
"""The ``"type"`` of the interrupt value :func:`request_approval` sends."""

_LC_ID: Final = "lc_run-"  # the message id langchain-core gives a chunk its provider did not
_INTERRUPTS: Final = "__interrupt__"
# A request id the protocol carries as it is: an interrupt's id (hex) always is.
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_MAX_TOKENS: Final = frozenset({"length", "max_tokens", "MAX_TOKENS"})
_REFUSAL: Final = frozenset({"content_filter", "refusal", "SAFETY"})
_STATE_VERSION: Final = 1
# How long a run that ends early (cancelled, failed) is given to close its tasks.
_CLOSE_TIMEOUT: Final = 5.0
_AHEAD: Final = 256  # stream parts read ahead of publishing, at most

_Graph: TypeAlias = "Pregel[Any, Any, Any, Any]"
_Piece: TypeAlias = tuple[Literal["text", "reasoning", "signature"], str]


# -- approvals from inside the graph ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Approval:
    """The answer :func:`request_approval` returns: approved or not, and the reason the
    person who decided gave (None when none)."""

    approved: bool
    reason: str | None = None


def request_approval(tool_call_id: str, *, reason: str | None = None) -> Approval:
    """Ask to approve the tool call ``tool_call_id`` before it runs, from inside a node
    or a tool (``interrupt()`` underneath: the graph needs a checkpointer).

    The run stops; its message asks the approval of that call (an ``approval_request``
    naming its tool_use block), which every dialect shows as its own approval. When the
    answer comes, the node runs again from its start and this returns the decision. Call
    it from a tool with the id LangGraph injects (``runtime: ToolRuntime`` and
    ``runtime.tool_call_id``, or an ``InjectedToolCallId`` argument), or from a review
    node between the model and the tools, once per call of the last ``AIMessage``.
    """
    value: dict[str, Any] = {"type": APPROVAL, "tool_call_id": tool_call_id}
    if reason is not None:
        value["reason"] = reason
    answer = interrupt(value)
    if isinstance(answer, bool):
        return Approval(answer)
    if isinstance(answer, Mapping):
        given = answer.get("reason")
        return Approval(answer.get("approved") is True, given if isinstance(given, str) else None)
    logger.warning("an approval resumed with a %s; taken as denied", type(answer).__name__)
    return Approval(False)


def _approval_call(value: object) -> str | None:
    """The call an interrupt's value asks to approve, when it is :func:`request_approval`'s."""
    if isinstance(value, Mapping) and value.get("type") == APPROVAL:
        call = value.get("tool_call_id")
        if isinstance(call, str) and call:
            return call
    return None


# -- what a run published ------------------------------------------------------------------


@dataclass(slots=True)
class PublishedRun:
    """What :func:`stream_run` published for one run (or one resumed run).

    ``rounds`` counts the LLM calls published, ``text`` is the last one's text (the
    graph's answer: its last AI message), ``tool_calls`` every call of every round with
    its parsed arguments, ``results`` each published result's text by call id (``failed``
    the ids of those that were errors). ``interrupts`` are the run's ``Interrupt`` s and
    ``asked`` the ids of the requests the message ended with, in the order written (calls
    left to the client, then approvals, then questions): ``asked[0]`` is the key of the
    run's state in :class:`~essessey.adapters.RunStates`. ``resume_ids`` maps a
    request id to the interrupt id that ``Command(resume=...)`` takes. ``stop_reason``,
    ``usage`` and ``model`` are what the message's epilogue says and the model the LLM
    calls named (None when none did).
    """

    rounds: int = 0
    text: str = ""
    tool_calls: list[PublishedToolCall] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    interrupts: list[Interrupt] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    resume_ids: dict[str, str] = field(default_factory=dict)
    stop_reason: str = StopReason.END_TURN
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None


# -- reading the parts ------------------------------------------------------------------------


def _part(raw: object) -> tuple[str, Any] | None:
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


def _clean(text: str) -> str:
    return replace_surrogates(text) if has_lone_surrogate(text) else text


def _pieces(message: AIMessage) -> list[_Piece]:
    """A message's (or chunk's) text, reasoning and reasoning signatures, in order."""
    content = message.content
    if isinstance(content, str) and not message.additional_kwargs:
        return [("text", _clean(content))] if content else []
    found: list[_Piece] = []
    for block in message.content_blocks:
        kind = block.get("type")
        if kind == "text" or kind == "refusal":
            text = block.get(kind)
            if isinstance(text, str) and text:
                found.append(("text", _clean(text)))
        elif kind == "reasoning":
            reasoning = block.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                found.append(("reasoning", _clean(reasoning)))
            extras = block.get("extras")
            if isinstance(extras, Mapping):
                signature = extras.get("signature")
                if isinstance(signature, str) and signature:
                    found.append(("signature", signature))
        elif kind not in ("tool_call", "tool_call_chunk", "invalid_tool_call"):
            logger.debug("a content block of type %s is not published", kind)
    return found


def _usage(message: AIMessage, into: dict[str, int]) -> None:
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


def _result(message: ToolMessage) -> str:
    """A tool message's content as its result text: a string as it is, blocks as JSON."""
    content = message.content
    return _clean(content) if isinstance(content, str) else result_text(content)


# -- one LLM call ------------------------------------------------------------------------------


class _Round:
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
                await self.rounds.delta(text=_clean(content))
                self.signable = False
            else:
                await held.put(("text", _clean(content)))
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
                await held.fragment(call, _clean(args), position)
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
            call.parts.append(_clean(arguments))
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


# -- the run -----------------------------------------------------------------------------------


class _Run:
    """The state of one message while a graph's stream parts are read."""

    __slots__ = (
        "_earlier",
        "_nodes",
        "_owed",
        "_position",
        "_round",
        "_waiting",
        "out",
        "rounds",
    )

    def __init__(
        self, rounds: RoundStream, nodes: Collection[str] | None, answered: Answered | None
    ) -> None:
        self.rounds = rounds
        self.out = PublishedRun()
        self._nodes = nodes
        self._round: _Round | None = None
        self._position = -1
        # Chunks of an LLM call that streams while another one's output is not whole yet.
        self._waiting: dict[str, tuple[object, list[AIMessageChunk]]] = {}
        # Calls an earlier message made: approved ones get their result here, between
        # rounds; the client's outputs the hub recorded already are not published again.
        self._earlier: dict[str, bool] = {}
        self._owed: list[tuple[str, str, bool]] = []
        if answered is not None:
            for request, _ in answered.approvals():
                self._earlier[request.tool_use_id] = True
            for call, _ in answered.tool_outputs():
                self._earlier[call.id] = False

    async def feed(self, raw: object) -> None:
        """Publish what one stream part carries."""
        self._position += 1
        if type(raw) is dict:  # version="v2", the shape graph_stream asks for
            mode, data = raw.get("type"), raw.get("data")
        else:
            part = _part(raw)
            if part is None:
                return
            mode, data = part
        if mode == "messages":
            if not (isinstance(data, tuple) and len(data) == 2):
                logger.warning("skipping messages part %d: not a pair", self._position)
                return
            message, metadata = data
            if not isinstance(metadata, Mapping):
                metadata = {}
            await self._message(message, metadata)
        elif mode == "updates":
            if isinstance(data, Mapping):
                self._updates(data)
            else:
                logger.warning(
                    "skipping updates part %d: a %s", self._position, type(data).__name__
                )

    async def _message(self, message: object, metadata: Mapping[str, Any]) -> None:
        if isinstance(message, ToolMessage):
            await self._tool_message(message)
            return
        if not isinstance(message, AIMessage):
            return  # a human or system message a node wrote: not the assistant's
        node = metadata.get("langgraph_node")
        if self._nodes is not None and node not in self._nodes:
            return
        if message.usage_metadata:
            _usage(message, self.out.usage)
        if self.out.model is None:
            self._model(message, metadata)
        current = self._round
        if not isinstance(message, AIMessageChunk):
            if current is not None and message.id in current.ids:
                return  # the whole message of the call that streamed it
            await self._start(message.id, node)
            assert self._round is not None
            await self._round.whole(message)
            await self._output_done()
            return
        if current is not None and current.continues(message.id, node):
            if current.done:
                logger.warning("a chunk came after its call's output ended; skipped")
                return
            await current.chunk(message, self._position)
        elif message.id and (message.id in self._waiting or (current and not current.done)):
            # Another call streams meanwhile: it is published once this one's output is.
            self._waiting.setdefault(message.id, (node, []))[1].append(message)
            if current is None or current.done:
                await self._flush_waiting()
            return
        else:
            await self._start(message.id, node)
            current = self._round
            assert current is not None
            await current.chunk(message, self._position)
        if message.chunk_position == "last":
            await self._output_done()

    def _model(self, message: AIMessage, metadata: Mapping[str, Any]) -> None:
        """Learn the model's name from the first message that names it."""
        name = metadata.get("ls_model_name") or message.response_metadata.get("model_name")
        if isinstance(name, str) and name:
            self.out.model = name

    async def _start(self, message_id: str | None, node: object) -> None:
        await self._end_round(answer_missing=True)
        await self.rounds.round_start()
        self._round = _Round(self.rounds, message_id, node)

    async def _output_done(self) -> None:
        """The current call's output is whole: its calls are declared."""
        current = self._round
        if current is not None and await current.finish():
            self.out.tool_calls.extend(current.requests)

    async def _flush_waiting(self) -> None:
        while self._waiting:
            message_id = next(iter(self._waiting))
            node, chunks = self._waiting.pop(message_id)
            await self._start(message_id, node)
            current = self._round
            assert current is not None
            last = False
            for chunk in chunks:
                await current.chunk(chunk, self._position)
                last = last or chunk.chunk_position == "last"
            if last:
                await self._output_done()
            else:
                return  # it still streams: its next chunks continue it

    async def _tool_message(self, message: ToolMessage) -> None:
        call_id = message.tool_call_id
        text, is_error = _result(message), message.status == "error"
        current = self._round
        if current is not None:
            await self._output_done()
            slot = current.slots.get(call_id)
            if slot is not None:
                published = current.requests[slot].id
                if published in self.out.results:
                    return  # the same message again (a resumed node writes it anew)
                self._result(published, text, is_error)
                # In call order: a result waits for the earlier calls' (an earlier call may
                # wait for an approval, and its result then comes in the next message).
                current.held_results[slot] = (text, is_error)
                while (ready := current.held_results.pop(current.next_result, None)) is not None:
                    await self.rounds.tool_result(current.next_result, ready[0], is_error=ready[1])
                    current.next_result += 1
                return
        if self._waiting:
            # A call of an LLM call that streamed beside the current one: its round next.
            await self._flush_waiting()
            if self._round is not current:
                await self._tool_message(message)
                return
        earlier = self._earlier.get(call_id)
        if earlier is None:
            logger.warning("a tool message names no call of this run; not published")
        elif earlier and call_id not in self.out.results:
            self._result(call_id, text, is_error)
            if self.rounds.in_round:
                self._owed.append((call_id, text, is_error))
            else:
                await self.rounds.earlier_result(call_id, text, is_error=is_error)

    def _result(self, call_id: str, text: str, is_error: bool) -> None:
        self.out.results[call_id] = text
        if is_error:
            self.out.failed.add(call_id)

    def _updates(self, data: Mapping[str, Any]) -> None:
        for node, update in data.items():
            if node == _INTERRUPTS:
                for item in update if isinstance(update, tuple | list) else ():
                    if isinstance(item, Interrupt):
                        self.out.interrupts.append(item)

    async def _end_round(self, *, answer_missing: bool) -> None:
        current = self._round
        if current is None:
            return
        await self._output_done()
        held = sorted(current.held_results.items())
        if answer_missing:
            for slot, (text, is_error) in held:
                await self.rounds.tool_result(slot, text, is_error=is_error)
        summary = await self.rounds.round_end(answer_missing=answer_missing)
        if not answer_missing:
            # The calls that wait (for an approval, for the client) keep no result; the
            # results of the calls after them go out now, naming their calls.
            for slot, (text, is_error) in held:
                call_id = current.requests[slot].id
                await self.rounds.earlier_result(call_id, text, is_error=is_error)
        self._round = None
        self.out.rounds += 1
        self.out.text = summary.text
        self.out.stop_reason = _stop_reason(current.finish_reason)
        for call_id, text, is_error in self._owed:
            await self.rounds.earlier_result(call_id, text, is_error=is_error)
        self._owed.clear()

    async def end(self, states: RunStates | None, config: RunnableConfig | None) -> PublishedRun:
        """The stream ended: publish what waits, then ask what the run waits for."""
        await self._flush_waiting()
        current = self._round
        unanswered: list[PublishedToolCall] = []
        if current is not None:
            await self._output_done()
            unanswered = [c for c in current.requests if c.id not in self.out.results]
        out = self.out
        asks: list[tuple[str, Interrupt, str | None]] = []  # (request id, interrupt, call)
        gated: set[str] = set()
        used = {c.id for c in out.tool_calls}
        open_ids = {c.id for c in unanswered}
        for item in out.interrupts:
            call = _approval_call(item.value)
            if call is not None and (call not in open_ids or call in gated):
                call = None
            if call is not None:
                gated.add(call)
            request_id = item.id
            if not _REQUEST_ID.fullmatch(request_id) or request_id in used:
                request_id = ("apr_" if call else "q_") + secrets.token_hex(12)
            used.add(request_id)
            asks.append((request_id, item, call))
        asks.sort(key=lambda ask: ask[2] is None)  # approvals before questions
        out.asked = [c.id for c in unanswered if c.id not in gated] + [a[0] for a in asks]
        out.resume_ids = {request_id: item.id for request_id, item, _ in asks}
        if current is not None:
            await self._end_round(answer_missing=not out.asked)
        if out.asked:
            out.stop_reason = StopReason.TOOL_USE
            if states is not None:
                await states.save(out.asked[0], _state(config, out.resume_ids))
            for request_id, item, call in asks:
                if call is not None:
                    await self.rounds.ask_approval(
                        call, reason=_reason(item.value), request_id=request_id
                    )
                else:
                    question, schema = _question(item)
                    await self.rounds.ask(question, schema=schema, request_id=request_id)
        self.rounds.stop_reason = out.stop_reason
        usage = dict(out.usage)
        self.rounds.output_tokens = usage.pop("output_tokens", 0)
        self.rounds.usage = usage
        return out


def _stop_reason(finish_reason: str | None) -> str:
    if finish_reason in _MAX_TOKENS:
        return StopReason.MAX_TOKENS
    if finish_reason in _REFUSAL:
        return StopReason.REFUSAL
    return StopReason.END_TURN


def _reason(value: object) -> str | None:
    reason = value.get("reason") if isinstance(value, Mapping) else None
    return reason if isinstance(reason, str) else None


def _question(item: Interrupt) -> tuple[str, Mapping[str, Any] | None]:
    """An interrupt's question and its answer's schema (see the module's docstring)."""
    value = item.value
    schema = item.response_schema if isinstance(item.response_schema, Mapping) else None
    if isinstance(value, str):
        return _clean(value), schema
    if isinstance(value, Mapping) and isinstance(value.get("question"), str):
        given = value.get("schema")
        return _clean(value["question"]), given if isinstance(given, Mapping) else schema
    try:
        return orjson.dumps(value, default=str).decode(), schema
    except TypeError:
        logger.warning("an interrupt value of type %s is not JSON", type(value).__name__)
        return type(value).__name__, schema


def _state(config: RunnableConfig | None, resume_ids: Mapping[str, str]) -> bytes:
    """What :class:`AgentTurns` keeps of a run that asked: the thread's config (its
    JSON values) and the interrupt id of each request."""
    configurable = (config or {}).get("configurable") or {}
    kept = {
        key: value
        for key, value in configurable.items()
        if isinstance(value, str | int | float | bool) and not key.startswith("__")
    }
    return orjson.dumps(
        {"version": _STATE_VERSION, "configurable": kept, "interrupts": dict(resume_ids)}
    )


# -- the public functions ------------------------------------------------------------------------


def graph_stream(
    graph: _Graph,
    input: Any,
    config: RunnableConfig | None = None,
    **options: Any,
) -> AsyncIterator[Any]:
    """``graph.astream(input, config, stream_mode=STREAM_MODES, version="v2", **options)``:
    the run's stream as :func:`stream_run` reads it (``options``: ``context``,
    ``subgraphs``, ``durability``, ...)."""
    return graph.astream(input, config, stream_mode=list(STREAM_MODES), version="v2", **options)


async def stream_run(
    rounds: RoundStream,
    parts: AsyncIterable[Any],
    *,
    config: RunnableConfig | None = None,
    states: RunStates | None = None,
    answered: Answered | None = None,
    nodes: Collection[str] | None = None,
) -> PublishedRun:
    """Publish a graph run's stream ``parts`` into ``rounds``' message (see the module's
    table); ``rounds`` is idle (between rounds) before and after.

    ``parts`` is ``graph.astream(...)`` with the ``messages`` and ``updates`` modes
    (:func:`graph_stream`), in either of its shapes (``version="v2"`` or the tuples).
    ``nodes``: only the LLM calls of these nodes are published (None: every node's).
    When the run stops at interrupts, or with calls it did not run, the message asks
    (:attr:`PublishedRun.asked`); with ``states``, the thread's config (from
    ``config``) and the interrupt ids are saved under the first request's id before
    anything asks. ``answered``: the run resumes a message that asked; the results of the
    calls it approved are published here (between rounds).

    Sets ``rounds.stop_reason``, ``output_tokens`` and ``usage`` for the epilogue. What
    the run raises propagates; whatever ends this, ``parts`` is closed (``aclose``), so
    a run cancelled or failed leaves nothing running.
    """
    if rounds.in_round:
        raise RuntimeError("stream_run starts between rounds: end the open round first")
    run = _Run(rounds, nodes, answered)
    pump = _Pump(parts)
    try:
        while (batch := await pump.batch()) is not None:
            for raw in batch:
                await run.feed(raw)
        return await run.end(states, config)
    finally:
        await pump.close()


class _Pump:
    """Reads a run's stream parts in an asyncio task of its own.

    LangGraph cancels a run's node tasks when the task iterating ``astream`` is cancelled
    once, the asyncio way; a cancel scope of anyio (the hub's), which cancels again at
    every await until the task gives up, ends the iteration without them, and they run
    on. So the parts are read apart, and a turn that ends early cancels that task once
    (:meth:`close`), then waits for the run to wind down. The parts are handed over in
    batches (all that came since the last), a list swap instead of a queue's put and get
    for each.
    """

    __slots__ = ("_ended", "_error", "_more", "_ready", "_room", "_task")

    def __init__(self, parts: AsyncIterable[Any]) -> None:
        self._ready: list[Any] = []
        self._more = asyncio.Event()  # set when parts are ready, or the reading ended
        self._room = asyncio.Event()  # set when the reader may run ahead
        self._room.set()
        self._ended = False
        self._error: Exception | None = None
        self._task = asyncio.ensure_future(self._read(parts))

    async def _read(self, parts: AsyncIterable[Any]) -> None:
        try:
            async for raw in parts:
                ready = self._ready  # batch() swaps the list
                ready.append(raw)
                if len(ready) == 1:
                    self._more.set()
                elif len(ready) >= _AHEAD:
                    # Bounded: the graph runs ahead of publishing by this many parts.
                    self._room.clear()
                    await self._room.wait()
        except Exception as exc:
            self._error = exc
        finally:
            self._ended = True
            self._more.set()

    async def batch(self) -> list[Any] | None:
        """The parts read since the last batch (waiting for one), or None once the
        reading ended; what reading the parts raised, raised here after them."""
        while not self._ready:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            self._more.clear()
            await self._more.wait()
        ready = self._ready
        self._ready = []
        self._room.set()
        return ready

    async def close(self) -> None:
        """Cancel the reading (the run) unless it ended, and wait for it to wind down."""
        task = self._task
        if not task.done():
            task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT):
            await asyncio.wait([task])


async def publish_run(
    publisher: Publisher,
    graph: _Graph,
    input: Any,
    config: RunnableConfig | None = None,
    *,
    message_id: str,
    stream_id: str,
    model: str | None = None,
    states: RunStates | None = None,
    nodes: Collection[str] | None = None,
    **options: Any,
) -> PublishedRun:
    """Run ``graph`` on ``input`` and publish the run as one whole message.

    ``message_start`` names ``model`` (default: the graph's name). The rest is
    :func:`stream_run` over :func:`graph_stream` (``options`` go to ``astream``) inside
    :func:`~essessey.adapters.stream_rounds`: an error of the run ends the message with an
    ``error`` event and propagates.
    """
    async with stream_rounds(
        publisher, message_id=message_id, stream_id=stream_id, model=model or graph.name
    ) as rounds:
        return await stream_run(
            rounds,
            graph_stream(graph, input, config, **options),
            config=config,
            states=states,
            nodes=nodes,
        )


def _as_message(role: str, text: str) -> AnyMessage:
    if role == "system":
        return SystemMessage(text)
    if role == "assistant":
        return AIMessage(text)
    return HumanMessage(text)


def graph_input(request: DialectRequest, *, new_thread: bool = True) -> dict[str, Any]:
    """A run's input from any dialect's request, for a graph whose state has a
    ``messages`` key (``MessagesState``, ``create_react_agent``): every message's text
    (:func:`essessey.dialects.conversation`) as LangChain messages when ``new_thread``,
    else only what the user said last (the checkpointer's thread has the rest)."""
    if new_thread:
        messages = [_as_message(m.role, m.text) for m in conversation(request)]
    else:
        messages = [HumanMessage(user_text(request))]
    return {"messages": messages}


def _thread_id(request: DialectRequest) -> str:
    # AG-UI names its thread; the other dialects' request id names the conversation
    # (useChat's chat id) or the request itself (OpenAI's completions and responses).
    return request.thread_id if isinstance(request, AGUIRunRequest) else request.id


class AgentTurns:
    """A compiled LangGraph graph served to every dialect through a hub, interrupts
    included.

    ``turns = AgentTurns(graph)`` is the turn factory of
    :func:`essessey.dialects.dialect_routes` and ``turns.on_answer`` the hub's
    continuation (``StreamHub(on_answer=turns.on_answer)``). Each request runs the graph on
    the thread ``thread_id(request)`` names (default: AG-UI's ``threadId``, else the
    request's id: ``useChat``'s chat id) with ``config`` (its ``configurable`` gets the
    ``thread_id``). The input is ``input(request, new_thread)`` (default
    :func:`graph_input`): a thread the checkpointer already has gets the user's last
    message, a new one (or a graph without a checkpointer) the whole conversation.

    A run that stops at ``interrupt()`` (or leaves calls to the client) keeps only the
    thread's config and the interrupt ids in ``states``; the graph's state is its
    checkpointer's, so replicas need a checkpointer they share. The answer resumes the
    thread with ``Command(resume={interrupt id: value})`` (an approval's value is
    ``{"approved": bool, "reason": str | None}``, what :func:`request_approval` reads) and
    a client's tool outputs as ``ToolMessage`` s. ``model`` is the name ``message_start``
    carries (default: the graph's name); ``nodes`` as in :func:`stream_run`; ``options``
    go to every ``astream`` (``context``, ``subgraphs``, ``durability``).
    """

    def __init__(
        self,
        graph: _Graph,
        *,
        states: RunStates | None = None,
        config: RunnableConfig | None = None,
        model: str | None = None,
        thread_id: Callable[[DialectRequest], str] | None = None,
        input: Callable[[DialectRequest, bool], Any] | None = None,
        nodes: Collection[str] | None = None,
        **options: Any,
    ) -> None:
        self.graph = graph
        self.states = states if states is not None else RunStates()
        self.config: RunnableConfig = config if config is not None else {}
        self.model = model or graph.name
        self.thread_id = thread_id if thread_id is not None else _thread_id
        self.input = input if input is not None else _default_input
        self.nodes = nodes
        self.options = options

    def config_for(self, configurable: Mapping[str, Any]) -> RunnableConfig:
        """``config`` with ``configurable`` added to its own (the thread's id, ...)."""
        config = cast(RunnableConfig, dict(self.config))
        config["configurable"] = {**(self.config.get("configurable") or {}), **configurable}
        return config

    async def _new_thread(self, config: RunnableConfig) -> bool:
        checkpointer = self.graph.checkpointer
        if not isinstance(checkpointer, BaseCheckpointSaver):
            return True
        snapshot = await self.graph.aget_state(config)
        return not snapshot.values

    def __call__(self, request: DialectRequest) -> TurnProducer:
        """The producer of the graph's turn for ``request`` (served on ``request.id``)."""
        config = self.config_for({"thread_id": self.thread_id(request)})
        stream_id = request.id

        async def produce(publisher: Publisher) -> None:
            run_input = self.input(request, await self._new_thread(config))
            await publish_run(
                publisher,
                self.graph,
                run_input,
                config,
                message_id=_message_id(),
                stream_id=stream_id,
                model=self.model,
                states=self.states,
                nodes=self.nodes,
                **self.options,
            )

        return produce

    async def on_answer(self, publisher: Publisher, answered: Answered) -> None:
        """The hub's continuation: resume the thread that asked with the answers."""
        async with continue_rounds(publisher, answered) as rounds:
            key = answered.requests[0].id
            saved = await self.states.load(key)
            if saved is None:
                raise LookupError("no run state is kept for this turn's requests")
            state = orjson.loads(saved)
            config = self.config_for(state["configurable"])
            interrupts: Mapping[str, str] = state["interrupts"]
            resume: dict[str, Any] = {}
            for request, approval in answered.approvals():
                resume[_interrupt(interrupts, request.id)] = {
                    "approved": approval.approved,
                    "reason": approval.reason,
                }
            for question, answer in answered.questions():
                resume[_interrupt(interrupts, question.id)] = answer.value
            outputs: list[BaseMessage] = [
                ToolMessage(
                    output.text,
                    tool_call_id=call.id,
                    name=call.name,
                    status="error" if output.is_error else "success",
                )
                for call, output in answered.tool_outputs()
            ]
            # With interrupts pending, the graph is paused in a node and runs the round's
            # other calls itself when it resumes; without, they were the client's to run.
            run_input: Any = Command(resume=resume) if resume else {"messages": outputs}
            await stream_run(
                rounds,
                graph_stream(self.graph, run_input, config, **self.options),
                config=config,
                states=self.states,
                answered=answered,
                nodes=self.nodes,
            )
            await self.states.drop(key)


def _interrupt(interrupts: Mapping[str, str], request_id: str) -> str:
    found = interrupts.get(request_id)
    if found is None:
        raise LookupError("an answered request is not one the graph's run waits for")
    return found


def _default_input(request: DialectRequest, new_thread: bool) -> dict[str, Any]:
    return graph_input(request, new_thread=new_thread)


def _message_id() -> str:
    return "msg_" + secrets.token_hex(12)


set_public_module(__name__, globals(), __all__)
