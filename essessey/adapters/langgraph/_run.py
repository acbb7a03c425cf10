"""A LangGraph run's stream parts, published into one message (see the package's table)."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Mapping,
)
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, TypeAlias

import anyio
import orjson
from langchain_core.messages import AIMessage, AIMessageChunk, RemoveMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Interrupt

from essessey.adapters._message import PublishedToolCall
from essessey.adapters._run_state import RunStates
from essessey.adapters._values import Malformed, clean, writable
from essessey.adapters.langgraph._approval import approval_call
from essessey.adapters.langgraph._round import LLMCall, add_usage, read_part, result_of
from essessey.adapters.rounds import RoundStream, stream_rounds
from essessey.protocol import StopReason
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher
from essessey.streamers import NO_RESULT_TEXT

__all__ = ["STREAM_MODES", "Graph", "PublishedRun", "graph_stream", "publish_run", "stream_run"]

logger = logging.getLogger("essessey.adapters.langgraph")

STREAM_MODES: Final = ("messages", "updates")
"""The ``stream_mode`` s :func:`stream_run` reads (others are skipped)."""

_INTERRUPTS: Final = "__interrupt__"
# A request id the protocol carries as it is: an interrupt's id (hex) always is.
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# The stop reasons the integrations give (``finish_reason``, ``stop_reason``, a Responses
# API response's incomplete reason) in the protocol's words; any other is end_turn: the
# model stopped, or stopped for calls the graph then ran (it waits for nothing).
_STOP_REASONS: Final[Mapping[str, str]] = {
    "length": StopReason.MAX_TOKENS,
    "max_tokens": StopReason.MAX_TOKENS,
    "MAX_TOKENS": StopReason.MAX_TOKENS,
    "max_output_tokens": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
    "refusal": StopReason.REFUSAL,
    "SAFETY": StopReason.REFUSAL,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "pause_turn": StopReason.PAUSE_TURN,
    "model_context_window_exceeded": StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED,
}
_STATE_VERSION: Final = 1
# How long a run that ends early (cancelled, failed) is given to close its tasks.
_CLOSE_TIMEOUT: Final = 5.0

Graph: TypeAlias = "Pregel[Any, Any, Any, Any]"
"""A compiled graph (``StateGraph.compile()``, ``create_react_agent``)."""

# What publishes a stream part: it returns the awaitable that does (None when the part
# publishes nothing), so that a part's common path creates no coroutine of its own.
_Feed: TypeAlias = Callable[[Any], Awaitable[None] | None]


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


# -- the run -----------------------------------------------------------------------------------


class _Run:
    """The state of one message while a graph's stream parts are read."""

    __slots__ = (
        "_earlier",
        "_nodes",
        "_owed",
        "_position",
        "_round",
        "_stop",
        "_waiting",
        "_warned",
        "out",
        "rounds",
    )

    def __init__(
        self, rounds: RoundStream, nodes: Collection[str] | None, answered: Answered | None
    ) -> None:
        self.rounds = rounds
        self.out = PublishedRun()
        self._nodes = nodes
        self._round: LLMCall | None = None
        self._position = -1
        # Chunks of an LLM call that streams while another one's output is not whole yet.
        self._waiting: dict[str, tuple[object, list[AIMessageChunk]]] = {}
        # Calls an earlier message made: approved ones get their result here, between
        # rounds; the client's outputs the hub recorded already are not published again.
        self._earlier: dict[str, bool] = {}
        self._owed: list[tuple[str, str, bool]] = []
        # The block types logged as not published (once each per run).
        self._warned: set[str] = set()
        # The last round's stop_details and stop_sequence, for the epilogue.
        self._stop: tuple[dict[str, Any] | None, str | None] = (None, None)
        if answered is not None:
            for request, _ in answered.approvals():
                self._earlier[request.tool_use_id] = True
            for question, _ in answered.questions():
                if question.tool_use_id is not None:  # the call that asked: run now
                    self._earlier[question.tool_use_id] = True
            for call, _ in answered.tool_outputs():
                self._earlier[call.id] = False

    def feed(self, raw: object) -> Awaitable[None] | None:
        """What publishes one stream part (None: nothing to publish).

        A plain function, as :meth:`_message` and :meth:`LLMCall.chunk` are: a part
        that is a chunk of the current call reaches the round with no coroutine of
        the adapter's own between the reading loop and the round's delta."""
        self._position += 1
        if type(raw) is dict:  # version="v2", the shape graph_stream asks for
            mode, data = raw.get("type"), raw.get("data")
        else:
            part = read_part(raw)
            if part is None:
                return None
            mode, data = part
        if mode == "messages":
            if not (isinstance(data, tuple) and len(data) == 2):
                logger.warning("skipping messages part %d: not a pair", self._position)
                return None
            message, metadata = data
            # A dict, as LangGraph gives it, without the Mapping ABC's (slower) check.
            if type(metadata) is not dict and not isinstance(metadata, Mapping):
                metadata = {}
            return self._message(message, metadata)
        if mode == "updates":
            if isinstance(data, Mapping):
                return self._update(data)
            logger.warning("skipping updates part %d: a %s", self._position, type(data).__name__)
        return None

    async def _update(self, data: Mapping[str, Any]) -> None:
        await self._settle()  # a node's update: the graph went on
        self._updates(data)

    def _message(self, given: object, metadata: Mapping[str, Any]) -> Awaitable[None] | None:
        # A chunk of the exact class (nearly every part) skips the isinstance checks,
        # which go through the ABC machinery of pydantic's metaclass.
        message: AIMessage
        chunk: AIMessageChunk | None
        if type(given) is AIMessageChunk:
            message = chunk = given
        elif isinstance(given, ToolMessage):
            return self._tool_message(given)
        elif isinstance(given, AIMessage):
            message = given
            chunk = given if isinstance(given, AIMessageChunk) else None
        else:
            return None  # a human or system message a node wrote: not the assistant's
        node = metadata.get("langgraph_node")
        if self._nodes is not None and node not in self._nodes:
            return None
        if message.usage_metadata:
            add_usage(message, self.out.usage)
        if self.out.model is None:
            self._model(message, metadata)
        if chunk is None:
            return self._whole(message, node)
        current = self._round
        if current is not None and current.continues(chunk.id, node):
            if current.done:
                logger.warning("a chunk came after its call's output ended; skipped")
                return None
            return current.chunk(chunk, self._position)
        return self._new_chunk(chunk, node)

    async def _whole(self, message: AIMessage, node: object) -> None:
        current = self._round
        if current is not None and message.id in current.ids:
            # The whole message of the call that streamed it: that call is over.
            await self._output_done()
            return
        await self._start(message.id, node)
        assert self._round is not None
        await self._round.whole(message)
        await self._output_done()

    async def _new_chunk(self, chunk: AIMessageChunk, node: object) -> None:
        """A chunk that does not continue the current call: another call's."""
        current = self._round
        chunk_id = chunk.id
        await self._settle()
        if chunk_id and (chunk_id in self._waiting or (current and not current.done)):
            # Another call streams meanwhile: it is published once this one's output is.
            self._waiting.setdefault(chunk_id, (node, []))[1].append(chunk)
            if current is None or current.done:
                await self._flush_waiting()
            return
        await self._start(chunk_id, node)
        current = self._round
        assert current is not None
        await current.chunk(chunk, self._position)

    def _model(self, message: AIMessage, metadata: Mapping[str, Any]) -> None:
        """Learn the model's name from the first message that names it."""
        name = metadata.get("ls_model_name") or message.response_metadata.get("model_name")
        if isinstance(name, str) and name:
            self.out.model = name

    async def _start(self, message_id: str | None, node: object) -> None:
        await self._end_round(answer_missing=True)
        await self.rounds.round_start()
        self._round = LLMCall(self.rounds, message_id, node, self._warned)

    async def release_after_failure(self) -> None:
        """The run failed or the turn was cancelled: what the current call's model sent
        before it, held behind a call whose arguments were not whole, goes out."""
        current = self._round
        if current is not None and not current.done:
            await current.held.release_after_failure()

    async def _output_done(self) -> None:
        """The current call's output is whole: its calls are declared."""
        current = self._round
        if current is not None and await current.finish():
            self.out.tool_calls.extend(current.requests)

    async def _settle(self) -> None:
        """A part that is not a chunk of the current call came: a call whose stream
        ended (its last chunk came) has its whole output now. Until then more of it may
        come: a stream of several provider messages marks the end of each as last."""
        current = self._round
        if current is not None and current.ended:
            await self._output_done()

    async def _flush_waiting(self, *, final: bool = False) -> None:
        """Publish the calls that streamed beside the current one, in the order they
        began; one that still streams stays the current round (unless ``final``: the
        stream ended)."""
        while self._waiting:
            message_id = next(iter(self._waiting))
            node, chunks = self._waiting.pop(message_id)
            await self._start(message_id, node)
            current = self._round
            assert current is not None
            for chunk in chunks:
                await current.chunk(chunk, self._position)
            if current.ended or final:
                await self._output_done()
            else:
                return  # it still streams: its next chunks continue it

    async def _tool_message(self, message: ToolMessage) -> None:
        call_id = message.tool_call_id
        text, is_error = result_of(message), message.status == "error"
        current = self._round
        if current is not None:
            await self._output_done()
            slot = current.slots.get(call_id)
            if slot is not None:
                published = current.requests[slot].id
                if published in self.out.results:
                    return  # the same message again (a resumed node writes it anew)
                self._record(published, text, is_error)
                # The round holds a result behind an earlier call's (which may wait for an
                # approval, its result then in the next message): in call order.
                await self.rounds.tool_result(slot, text, is_error=is_error)
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
            self._record(call_id, text, is_error)
            if self.rounds.in_round:
                self._owed.append((call_id, text, is_error))
            else:
                await self.rounds.earlier_result(call_id, text, is_error=is_error)

    def _record(self, call_id: str, text: str, is_error: bool) -> None:
        self.out.results[call_id] = text
        if is_error:
            self.out.failed.add(call_id)

    def _updates(self, data: Mapping[str, Any]) -> None:
        for node, update in data.items():
            if isinstance(update, Mapping) and "remove" not in self._warned:
                written = update.get("messages")
                removed = written if isinstance(written, list) else [written]
                if any(isinstance(item, RemoveMessage) for item in removed):
                    # What went out cannot be taken back: the published text keeps it.
                    self._warned.add("remove")
                    logger.info("a node removed messages (RemoveMessage); what was published stays")
            if node == _INTERRUPTS:
                for item in update if isinstance(update, tuple | list) else ():
                    # A subgraph's interrupt comes again in its parent's updates
                    # (subgraphs=True): the same id, asked once.
                    if isinstance(item, Interrupt) and all(
                        item.id != known.id for known in self.out.interrupts
                    ):
                        self.out.interrupts.append(item)

    async def _end_round(self, *, answer_missing: bool) -> None:
        current = self._round
        if current is None:
            return
        await self._output_done()
        # Results held behind a call without one go out here, in call order; with
        # answer_missing=False that call is left to the next message.
        summary = await self.rounds.round_end(answer_missing=answer_missing)
        self._round = None
        self.out.rounds += 1
        self.out.text = summary.text
        self.out.stop_reason = _stop_reason(current.finish_reason)
        self._stop = (current.stop_details, current.stop_sequence)
        for call_id, text, is_error in self._owed:
            await self.rounds.earlier_result(call_id, text, is_error=is_error)
        self._owed.clear()

    async def end(self, states: RunStates | None, config: RunnableConfig | None) -> PublishedRun:
        """The stream ended: publish what waits, then ask what the run waits for."""
        await self._flush_waiting(final=True)
        current = self._round
        unanswered: list[PublishedToolCall] = []
        cut = False
        if current is not None:
            await self._output_done()
            unanswered = [c for c in current.requests if c.id not in self.out.results]
            # An output cut short (max_tokens, a refusal, a pause) made no calls to run:
            # its calls stay in the message without results, as the provider's own
            # stream has them, and the message does not wait for them.
            cut = _stop_reason(current.finish_reason) != StopReason.END_TURN
        out = self.out
        # (request id, interrupt, the call it approves, the call whose run asks it)
        asks: list[tuple[str, Interrupt, str | None, str | None]] = []
        gated: set[str] = set()
        used = {c.id for c in out.tool_calls}
        # An earlier message's call that was let run and asks again before it ends (a
        # tool approved that asks a question, or another approval) is open too.
        owed = [c for c, run in self._earlier.items() if run and c not in out.results]
        open_ids = {c.id for c in unanswered} | set(owed)
        for item in out.interrupts:
            call = approval_call(item.value)
            if call is not None and (call not in open_ids or call in gated):
                call = None
            if call is not None:
                gated.add(call)
            request_id = item.id
            if not _REQUEST_ID.fullmatch(request_id) or request_id in used:
                request_id = ("apr_" if call else "q_") + secrets.token_hex(12)
            used.add(request_id)
            asks.append((request_id, item, call, None))
        asks.sort(key=lambda ask: ask[2] is None)  # approvals before questions
        if not cut:
            asks = _askers(asks, [c.id for c in unanswered] + owed, gated)
        for_client = [] if cut else [c.id for c in unanswered if c.id not in gated]
        if for_client and asks:
            # Most often a tools node that runs the whole round in one task: the calls
            # that did not ask lost their results, and run again when the graph resumes.
            logger.warning(
                "the run stops to ask while %d calls of its round have no result; they are "
                "the client's to answer. If a tools node runs them, dispatch one task per "
                "call (Send), or LangGraph runs them again when it resumes "
                "(docs/langgraph.md)",
                len(for_client),
            )
        out.asked = for_client + [a[0] for a in asks]
        out.resume_ids = {request_id: item.id for request_id, item, _, _ in asks}
        if current is not None:
            if cut and asks:
                # The message asks, so a call without a result would read as the
                # client's: the cut calls (that no approval gates) get error results.
                for request in unanswered:
                    if request.id not in gated:
                        await self.rounds.tool_result(
                            current.slots[request.id], NO_RESULT_TEXT, is_error=True
                        )
            await self._end_round(answer_missing=not (out.asked or cut))
        if out.asked:
            out.stop_reason = StopReason.TOOL_USE
            if states is not None:
                await states.save(out.asked[0], _state(config, out.resume_ids))
            for request_id, item, call, asker in asks:
                if call is not None:
                    await self.rounds.ask_approval(
                        call, reason=_reason(item.value), request_id=request_id
                    )
                else:
                    question, schema = _question(item)
                    await self.rounds.ask(
                        question, schema=schema, request_id=request_id, tool_use_id=asker
                    )
        self.rounds.stop_reason = out.stop_reason
        if not out.asked:
            details, sequence = self._stop
            self.rounds.stop_details = details
            if out.stop_reason == StopReason.STOP_SEQUENCE:
                self.rounds.stop_sequence = sequence
        usage = dict(out.usage)
        self.rounds.output_tokens = usage.pop("output_tokens", 0)
        self.rounds.usage = usage
        return out


def _askers(
    asks: list[tuple[str, Interrupt, str | None, str | None]],
    unanswered: list[str],
    gated: set[str],
) -> list[tuple[str, Interrupt, str | None, str | None]]:
    """``asks`` with each question given the call whose run asks it, which gates that
    call (``gated`` gains it): the graph runs the call on when the answer comes, its
    result then in the next message, so it is not the client's.

    A question names its call when its value is a mapping with ``tool_call_id`` (a tool
    asks with ``interrupt({"question": ..., "tool_call_id": runtime.tool_call_id})``).
    A plain ``interrupt(...)`` names none: the round's calls still without a result are
    the interrupted ones (a graph paused at interrupts runs them when it resumes). When
    there are no more of them than such questions (a call per task, as ``Send``
    dispatches them), each is the next question's, in order; more calls than questions
    (a tools node that runs the whole round in one task) cannot be told apart, and stay
    the client's (see the warning in :meth:`_Run.end`)."""
    open_calls = [c for c in unanswered if c not in gated]
    out: list[tuple[str, Interrupt, str | None, str | None]] = []
    plain: list[int] = []  # the places of the questions that name no call
    for request_id, item, call, _ in asks:
        named = _named_call(item.value) if call is None else None
        asker = None
        if named is not None and named in open_calls:
            open_calls.remove(named)
            gated.add(named)
            asker = named
        elif call is None and named is None:
            plain.append(len(out))
        out.append((request_id, item, call, asker))
    if open_calls and len(open_calls) <= len(plain):
        for place, asker in zip(plain, open_calls, strict=False):
            request_id, item, call, _ = out[place]
            gated.add(asker)
            out[place] = (request_id, item, call, asker)
    return out


def _named_call(value: object) -> str | None:
    """The call a question's interrupt value names (``tool_call_id``), if any."""
    if isinstance(value, Mapping) and isinstance(value.get("tool_call_id"), str):
        call: str = value["tool_call_id"]
        return call or None
    return None


def _stop_reason(finish_reason: str | None) -> str:
    if finish_reason is None:
        return StopReason.END_TURN
    return _STOP_REASONS.get(finish_reason, StopReason.END_TURN)


def _reason(value: object) -> str | None:
    reason = value.get("reason") if isinstance(value, Mapping) else None
    return reason if isinstance(reason, str) else None


def _question(item: Interrupt) -> tuple[str, Mapping[str, Any] | None]:
    """An interrupt's question and its answer's schema (see the module's docstring)."""
    value = item.value
    schema: Mapping[str, Any] | None = (
        item.response_schema if isinstance(item.response_schema, Mapping) else None
    )
    if isinstance(value, Mapping) and isinstance(value.get("question"), str):
        given = value.get("schema")
        schema = given if isinstance(given, Mapping) else schema
    if schema is not None:
        try:
            schema = orjson.loads(_json_text(schema))
        except TypeError:
            logger.warning("an interrupt's answer schema is not JSON; asked without it")
            schema = None
    if isinstance(value, str):
        return clean(value), schema
    if isinstance(value, Mapping) and isinstance(value.get("question"), str):
        return clean(value["question"]), schema
    try:
        return _json_text(value).decode(), schema
    except TypeError:
        logger.warning("an interrupt value of type %s is not JSON", type(value).__name__)
        return type(value).__name__, schema


def _json_text(value: object) -> bytes:
    """``value`` as JSON, what LangGraph checkpoints that JSON has no type for written
    as near as it goes: keys as text, a ``Decimal`` as a number, a set or a tuple as a
    list, anything else as its text. TypeError for what still cannot be written (a lone
    surrogate, an integer past 64 bits)."""
    return orjson.dumps(value, default=_plain, option=orjson.OPT_NON_STR_KEYS)


def _plain(value: object) -> object:
    if isinstance(value, Decimal) and value.is_finite():
        return float(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _state(config: RunnableConfig | None, resume_ids: Mapping[str, str]) -> bytes:
    """What :class:`AgentTurns` keeps of a run that asked: the thread's config (its
    JSON values) and the interrupt id of each request."""
    configurable = (config or {}).get("configurable") or {}
    kept = {
        key: value
        for key, value in configurable.items()
        if isinstance(key, str)
        and not key.startswith("__")
        and isinstance(value, str | int | float | bool)
        and _writable(value)
    }
    return orjson.dumps(
        {"version": _STATE_VERSION, "configurable": kept, "interrupts": dict(resume_ids)}
    )


def _writable(value: object) -> bool:
    """Whether ``value`` can be kept: not an integer past 64 bits, nor a string with a
    lone surrogate, which a thread's config may hold and no JSON writer takes."""
    try:
        writable(value, "configurable")
    except Malformed:
        return False
    return True


# -- the public functions ------------------------------------------------------------------------


def graph_stream(
    graph: Graph,
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
    try:
        await _feed_apart(parts, run.feed)
    except BaseException:
        await run.release_after_failure()
        raise
    return await run.end(states, config)


async def _feed_apart(parts: AsyncIterable[Any], feed: _Feed) -> None:
    """Read the run's stream parts and publish each (what ``feed`` returns for it), in an
    asyncio task of its own.

    LangGraph cancels a run's node tasks when the task iterating ``astream`` is cancelled
    once, the asyncio way; a cancel scope of anyio (the hub's), which cancels again at
    every await until the task gives up, ends the iteration without them, and they run
    on. So the parts are read apart, and a turn that ends early stops that task
    (:class:`_Reader`), then waits (shielded, bounded) for the run to wind down. Each part
    is fed in the task that read it: a model streams its parts one by one, and a hand-over
    to the turn's task would cost a task switch for every part. The run reads no further
    ahead than what is published (a slow store slows its stream, as a slow client slows a
    provider's). What reading or feeding raised is raised here.
    """
    reader = _Reader(parts, feed)
    task = asyncio.ensure_future(reader.run())
    try:
        await asyncio.wait([task])  # a cancellation of this task stops here, not in the run
    finally:
        if not task.done():
            reader.stop(task)
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(_CLOSE_TIMEOUT):
                    await asyncio.wait([task])
                if not task.done():
                    # A part's publishing that does not end (a store out of reach): cut.
                    task.cancel()
                    with anyio.move_on_after(_CLOSE_TIMEOUT):
                        await asyncio.wait([task])
            if task.done() and not task.cancelled():
                task.exception()  # taken: the turn ends with what ended it here
    task.result()


class _Reader:
    """The reading task's loop, and how a turn that ends early stops it.

    Waiting for the run's next part, the task is cancelled the asyncio way, once: LangGraph
    then ends the run itself. Publishing a part or closing the run, it is not cut (a native
    cancellation would go through what the publishing shields, a block's start and its
    first delta): the part goes out whole, and the run, waiting at its yield, is closed
    after it.
    """

    __slots__ = ("_feed", "_iterator", "_stopped", "_waiting")

    def __init__(self, parts: AsyncIterable[Any], feed: _Feed) -> None:
        self._iterator = aiter(parts)
        self._feed = feed
        self._waiting = True  # for the run's next part (the task's first step, too)
        self._stopped = False

    def stop(self, task: asyncio.Task[None]) -> None:
        """End the reading: at once when it waits for the run, after the part otherwise."""
        self._stopped = True
        if self._waiting:
            task.cancel()

    async def run(self) -> None:
        iterator = self._iterator
        try:
            while True:
                self._waiting = True
                try:
                    raw = await anext(iterator)
                except StopAsyncIteration:
                    return
                finally:
                    self._waiting = False
                step = self._feed(raw)
                if step is not None:
                    await step
                if self._stopped:
                    return
        finally:
            # Stopped (or failed) while feeding a part, the run waits at its yield: closed
            # here, not left for the garbage collector with its tasks running.
            if isinstance(iterator, AsyncGenerator):
                await iterator.aclose()


async def publish_run(
    publisher: Publisher,
    graph: Graph,
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
