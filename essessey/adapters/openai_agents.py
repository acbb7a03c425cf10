"""Publish an OpenAI Agents SDK run as the protocol: every model response a round.

``Runner.run_streamed(agent, input)`` runs an agent loop and streams it as
``result.stream_events()``: the model's raw Responses API events, the items the run made of
them (``RunItemStreamEvent``: the tool calls, the tool outputs the SDK ran, handoffs) and the
agent switches (``AgentUpdatedStreamEvent``). :func:`stream_run` publishes that stream into
one message of a :class:`~essessey.adapters.RoundStream`:

==============================================  ==========================================
Agents SDK event                                published as
==============================================  ==========================================
a model response's raw events                   one round, through
(``RawResponsesStreamEvent``)                   ``openai_responses.stream_round``:
                                                reasoning, text, tool calls (parallel ones
                                                too), hosted tools (web search, file
                                                search, code interpreter) as its
                                                ``server_tool_use`` blocks
``tool_output`` (``ToolCallOutputItem``)        the ``tool_result`` of the call it names,
                                                the output as the SDK sends it to the model
``handoff_occured`` (``HandoffOutputItem``)     the ``tool_result`` of the handoff's call
                                                (``transfer_to_<agent>``): the SDK's own
                                                handoff output, which names the new agent
``AgentUpdatedStreamEvent``                     nothing of its own: the protocol has no
                                                block for an agent switch; the handoff's
                                                result names the agent, and
                                                :attr:`PublishedRun.agents` lists them
``tool_called``, ``message_output_created``,    nothing more: the raw events carried them
``reasoning_item_created``, ``handoff_requested``
``result.interruptions`` (tools with            the call's tool_use block stays without a
``needs_approval``)                             result and the message asks to approve it
                                                (``approval_request``, stop reason
                                                ``tool_use``); see :class:`AgentTurns`
==============================================  ==========================================

The next model response is the next round, all in one message. The usage is the sum of the
responses' ``response.completed`` usage; the model name is the responses' own
(``response.created``); the stop reason is the last response's (``end_turn`` once the SDK
ran every call of it). An error the run raises (a tool's exception with
``failure_error_function=None``, ``MaxTurnsExceeded``, a guardrail's tripwire, a failed
response) ends the message with an ``error`` event and propagates; a run whose publisher is
cancelled, or that fails, is cancelled (``result.cancel()``) and its stream closed, so
nothing of it keeps running.

:class:`AgentTurns` serves an agent to every dialect through a
:class:`~essessey.StreamHub` in a few lines, approvals included: the SDK's ``RunState`` of a
run that stops to ask is kept in :class:`~essessey.adapters.RunStates` (the hub's store, so
any replica sharing it can go on), and ``turns.on_answer`` applies the answers
(``state.approve`` / ``state.reject``) and resumes the run where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, cast

import anyio

from essessey._public import missing_extra

try:
    from agents import Agent, RunConfig, RunHooks, Runner, RunState
    from agents.items import (
        HandoffOutputItem,
        MCPApprovalResponseItem,
        ToolApprovalItem,
        ToolCallOutputItem,
        TResponseInputItem,
    )
    from agents.result import RunResultStreaming
    from agents.stream_events import (
        AgentUpdatedStreamEvent,
        RawResponsesStreamEvent,
        RunItemStreamEvent,
        StreamEvent,
    )
    from openai.types.responses import ResponseCreatedEvent
    from openai.types.responses.response_output_item import McpApprovalRequest
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(__name__, exc, extra="openai-agents") from None

from essessey._ids import new_message_id
from essessey._public import set_public_module
from essessey.adapters._message import PublishedToolCall
from essessey.adapters._run_state import RunStates
from essessey.adapters._values import add_count, output_text
from essessey.adapters.openai_responses import (
    StreamedResponse,
    approval_call_id,
    stream_round,
)
from essessey.adapters.rounds import RoundStream, continue_rounds, stream_rounds
from essessey.dialects import DialectRequest, conversation
from essessey.hub import TurnProducer
from essessey.protocol import StopReason
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher

__all__ = [
    "AgentTurns",
    "ApprovalReason",
    "PublishedRun",
    "RunInput",
    "agent_input",
    "publish_run",
    "stream_run",
]

logger = logging.getLogger("essessey.adapters.openai_agents")

# The events that end one model response's raw stream.
_TERMINAL: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "error"}
)
# How long a run that ends early is given to wind down (its loop cancelled, then waited for).
_CLOSE_TIMEOUT: Final = 5.0

RunInput: TypeAlias = str | list[TResponseInputItem]
"""What ``Runner.run_streamed`` takes as a new run's input."""

ApprovalReason: TypeAlias = Callable[[ToolApprovalItem], "str | None"]
"""``approval_reason(item) -> reason``: the reason an approval request for the SDK's
``ToolApprovalItem`` shows (None for none)."""


@dataclass(slots=True)
class PublishedRun:
    """What :func:`stream_run` published and learned from one run (or one resumed run).

    ``responses`` holds each model response's :class:`StreamedResponse` (one per round), in
    order; ``text`` is the text of every round and ``output`` the SDK's
    ``result.final_output`` (None when the run stopped to ask). ``results`` maps each call
    the SDK ran to the output published for it, as text. ``agents`` names the agents that
    ran, the first one first and each handoff's target after it. ``interruptions`` are the
    SDK's ``result.interruptions`` (tools that need approval) and ``asked`` the ids of the
    approval requests published for them, in the same order: ``asked[0]`` is the key the
    run's state is kept under. ``stop_reason``, ``usage`` and ``model`` are what the
    message's epilogue and preamble say.
    """

    responses: list[StreamedResponse] = field(default_factory=list)
    text: str = ""
    output: Any = None
    results: dict[str, str] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)
    interruptions: list[ToolApprovalItem] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    stop_reason: str = StopReason.END_TURN
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None


class _Events:
    """The run's stream events, with room to put events back (a look ahead)."""

    __slots__ = ("_back", "_iterator")

    def __init__(self, result: RunResultStreaming) -> None:
        self._iterator: AsyncIterator[StreamEvent] = result.stream_events()
        self._back: deque[StreamEvent] = deque()

    async def next(self) -> StreamEvent | None:
        if self._back:
            return self._back.popleft()
        try:
            return await anext(self._iterator)
        except StopAsyncIteration:
            return None

    def put_back(self, events: Sequence[StreamEvent]) -> None:
        self._back.extendleft(reversed(events))

    async def close(self) -> None:
        iterator = self._iterator
        if isinstance(iterator, AsyncGenerator):
            await iterator.aclose()


class _Response:
    """One model response's raw events, read off the run's stream up to its terminal
    event (an iterator, not a generator: nothing is left for the event loop to close)."""

    __slots__ = ("_done", "_events", "_first")

    def __init__(self, first: RawResponsesStreamEvent, events: _Events) -> None:
        self._first: RawResponsesStreamEvent | None = first
        self._events = events
        self._done = False

    def __aiter__(self) -> _Response:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        event: StreamEvent | None
        if self._first is not None:
            event, self._first = self._first, None
        else:
            event = await self._events.next()
        if not isinstance(event, RawResponsesStreamEvent):
            # The response's stream was cut short: stream_round says so (an api_error).
            self._done = True
            if event is not None:
                self._events.put_back([event])
            raise StopAsyncIteration
        data = event.data
        if data.type in _TERMINAL:
            self._done = True
        # The SDK's object as it is: the Responses adapter reads a delta's fields off it
        # without a model_dump.
        return data


class _Run:
    """The state of one published run: the open round's calls and their results."""

    def __init__(
        self, rounds: RoundStream, result: RunResultStreaming, answered: Answered | None
    ) -> None:
        self.rounds = rounds
        self.result = result
        self.out = PublishedRun()
        self.earlier: dict[str, bool] = {}  # calls of the asking message: denied?
        if answered is not None:
            for request, approval in answered.approvals():
                self.earlier[request.tool_use_id] = not approval.approved
        self.calls: list[PublishedToolCall] = []  # the open round's calls
        # The open round's calls by the id the model gave them (which the SDK's items
        # carry): a call that repeated an earlier call's id went out under a fresh one.
        self.given: dict[str, int] = {}
        # The open round's hosted MCP approval requests, by their id: the call each gates.
        self.gates: dict[str, int] = {}
        self.message_calls: set[str] = set()  # every call of the message, as published
        # The calls the provider ran itself, their outputs published with them (the SDK
        # makes an output item of a hosted shell's output too).
        self.hosted: set[str] = set()
        # The earlier rounds' calls that got an output, by the model's id: their name,
        # input and output (see repeats).
        self.ran: dict[str, tuple[str, Any, str]] = {}
        self.last: StreamedResponse | None = None

    async def response(self, first: RawResponsesStreamEvent, events: _Events) -> None:
        await self.end_round()
        await self.rounds.round_start()
        streamed = await stream_round(self.rounds, _Response(first, events))
        self.out.responses.append(streamed)
        self.out.text += streamed.text
        if self.out.model is None and streamed.model:
            self.out.model = streamed.model
        for key, value in streamed.usage.items():
            add_count(self.out.usage, key, value)
        self.calls = streamed.tool_calls
        self.given = {}
        for i, call in enumerate(self.calls):
            if call.given_id:
                self.given.setdefault(call.given_id, i)
        slots = {call.id: i for i, call in enumerate(self.calls)}
        self.gates = {
            request_id: slots[call_id]
            for request_id, call_id in streamed.approvals
            if call_id in slots
        }
        self.message_calls.update(call.id for call in self.calls)
        self.hosted.update(streamed.hosted_calls)
        self.last = streamed

    async def output(self, call_id: str | None, output: object) -> None:
        if not call_id:
            logger.warning("a tool output without a call id; not published")
            return
        text = _text(output)
        i = self.given.get(call_id) if self.rounds.in_round else None
        if i is not None:
            if await self._result(i, text):
                self.ran[call_id] = (self.calls[i].name, self.calls[i].input, text)
        elif not self.rounds.in_round and call_id in self.earlier:
            await self._earlier_result(call_id, text, is_error=self.earlier[call_id])
        elif call_id in self.hosted:
            # A call the provider ran: its output went out with it (the SDK makes an item
            # of a hosted shell's output too).
            logger.debug("an output for a call the provider ran; published with the call")
        else:
            logger.warning("an output for a call this message does not know; not published")

    async def approval_answer(self, answer: Mapping[str, Any]) -> None:
        """The SDK's answer to a hosted MCP server's approval request, which the app's
        ``on_approval_request`` gave: the result of the call the request gates, as the
        SDK sends it to the model (an error result when it denies the call)."""
        request_id = answer.get("approval_request_id")
        if not isinstance(request_id, str):
            logger.warning("an approval answer without its request's id; not published")
            return
        text, denied = _text(answer), answer.get("approve") is not True
        i = self.gates.get(request_id) if self.rounds.in_round else None
        call_id = approval_call_id(request_id)
        if i is not None:
            await self._result(i, text, is_error=denied)
        elif not self.rounds.in_round and call_id in self.earlier:
            # The answer to the message that asked: a resumed run sends it to the model.
            await self._earlier_result(call_id, text, is_error=denied)
        else:
            logger.warning("an approval answer for a request this message does not know")

    async def _earlier_result(self, call_id: str, text: str, *, is_error: bool) -> None:
        """Publish the result of a call the message that asked made (between rounds)."""
        del self.earlier[call_id]
        self.out.results[call_id] = text
        await self.rounds.earlier_result(call_id, text, is_error=is_error)

    async def _result(self, i: int, text: str, *, is_error: bool = False) -> bool:
        """Publish the result of the open round's call ``i``, unless it has one."""
        call = self.calls[i]
        if call.id in self.out.results:
            logger.warning("tool call %d got a second output; not published", i)
            return False
        self.out.results[call.id] = text
        # The round holds a result behind an earlier call's (which may wait for an
        # approval, its result then in the next message): results go out in call order.
        await self.rounds.tool_result(i, text, is_error=is_error)
        return True

    async def end_round(self, *, asking: bool = False) -> None:
        rounds = self.rounds
        if not rounds.in_round:
            return
        await self.repeats()
        # Results held behind a call without one go out here, in call order; the calls
        # that wait for an approval are left to the next message.
        await rounds.round_end(answer_missing=not asking)

    async def repeats(self) -> None:
        """The SDK runs a call once: one that repeats an earlier round's call (its id,
        tool and input) is the same invocation, never run again and given no output of
        its own. It went out under a fresh id; its result is the output the SDK holds
        for it, the earlier call's."""
        for i, call in enumerate(self.calls):
            earlier = self.ran.get(call.given_id) if call.given_id else None
            if call.id in self.out.results or earlier is None:
                continue
            name, given, text = earlier
            if name == call.name and given is not None and given == call.input:
                logger.info("tool call %d repeats an earlier call; its output is the result", i)
                self.out.results[call.id] = text
                await self.rounds.tool_result(i, text)

    async def ask(self, states: RunStates | None, reason: ApprovalReason | None) -> None:
        interruptions = list(self.result.interruptions)
        self.out.interruptions = interruptions
        await self.end_round(asking=True)
        ids = [_request_id() for _ in interruptions]
        if states is not None:
            # Saved before anything asks: an answer may come as soon as a client reads it.
            state = self.result.to_state().to_string()
            await states.save(ids[0], state.encode())
        for item, request_id in zip(interruptions, ids, strict=True):
            given = item.call_id  # a hosted MCP server's: its approval request's id
            i = self.given.get(given, self.gates.get(given)) if given else None
            call_id = given if i is None else self.calls[i].id
            if call_id not in self.message_calls:
                # A nested agent's call (an agent used as a tool), a hosted MCP server's: no
                # tool_use block of this message to gate.
                raise ValueError(
                    f"the run waits to approve a call of {type(item.raw_item).__name__} "
                    "that is not a tool call of its message; it cannot be asked"
                )
            await self.rounds.ask_approval(
                call_id, reason=None if reason is None else reason(item), request_id=request_id
            )
            self.out.asked.append(request_id)
        self.out.stop_reason = StopReason.TOOL_USE

    def finish(self) -> None:
        out = self.out
        out.output = self.result.final_output
        last = self.last
        usage = dict(out.usage)
        self.rounds.output_tokens = usage.pop("output_tokens", 0)
        self.rounds.usage = usage
        if out.asked:
            return  # asking made the stop reason tool_use
        if last is not None and not (
            last.stop_reason == StopReason.TOOL_USE and all(c.id in out.results for c in self.calls)
        ):
            out.stop_reason = last.stop_reason
        else:
            out.stop_reason = StopReason.END_TURN
        self.rounds.stop_reason = out.stop_reason


async def stream_run(
    rounds: RoundStream,
    result: RunResultStreaming,
    *,
    states: RunStates | None = None,
    answered: Answered | None = None,
    approval_reason: ApprovalReason | None = None,
) -> PublishedRun:
    """Publish the run ``result`` (of ``Runner.run_streamed``) into ``rounds``' message.

    Reads ``result.stream_events()`` to its end: each model response is a round (see the
    module's table), the tool outputs the SDK ran are the round's results, in call order.
    Between rounds ``rounds`` must be idle (no round open) when this starts; it is idle
    when this returns. Sets ``rounds.stop_reason``, ``output_tokens`` and ``usage`` for the
    epilogue; the caller (or :func:`~essessey.adapters.stream_rounds`) ends the message.

    When the run stops for approvals (``result.interruptions``), each interrupted call's
    tool_use block stays without a result and the message asks to approve it
    (``approval_reason(item)`` is the request's reason); with ``states``, the run's
    ``RunState`` (``result.to_state().to_string()``) is saved under the first request's id
    before anything asks. ``answered``: the run resumes a message that asked, and the
    outputs of the calls it approved or denied are their results in this message (a
    denied call's, the SDK's rejection message, with ``is_error``).

    What the run raises propagates (a stream of :func:`stream_rounds` then ends with an
    ``error`` event). Whatever ends this (an error, a cancellation), a run not complete is
    cancelled (``result.cancel()``) and its event stream closed before this returns.
    """
    return await _stream_from(rounds, result, _Events(result), answered, states, approval_reason)


async def _close(result: RunResultStreaming, events: _Events) -> None:
    """End the run: cancel it unless it is complete, close its stream and wait for its
    loop (its tools with it) to be done, shielded from a cancellation and bounded."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_TIMEOUT):
        if not result.is_complete:
            result.cancel()
        await events.close()
        task = result.run_loop_task
        if task is not None and not task.done():
            await asyncio.wait([task])


async def publish_run(
    publisher: Publisher,
    result: RunResultStreaming,
    *,
    message_id: str,
    stream_id: str,
    model: str | None = None,
    states: RunStates | None = None,
    approval_reason: ApprovalReason | None = None,
) -> PublishedRun:
    """Publish the run ``result`` as one whole message, preamble to epilogue.

    ``message_start`` names the model the first response names (its ``response.created``),
    else ``model``, else ``""``: the stream is read up to the first response's first event
    before the message opens. The rest is :func:`stream_run` (``states`` and
    ``approval_reason`` as there) inside :func:`~essessey.adapters.stream_rounds`: an error
    of the run ends the message with an ``error`` event and propagates.
    """
    events = _Events(result)
    seen: list[StreamEvent] = []
    name = model or ""
    failure: Exception | None = None
    try:
        while (event := await events.next()) is not None:
            seen.append(event)
            if isinstance(event, RawResponsesStreamEvent):
                data = event.data
                if isinstance(data, ResponseCreatedEvent) and data.response.model:
                    name = data.response.model
                break
    except Exception as exc:
        failure = exc
    events.put_back(seen)
    async with stream_rounds(
        publisher, message_id=message_id, stream_id=stream_id, model=name
    ) as rounds:
        if failure is not None:
            await _close(result, events)
            raise failure
        return await _stream_from(rounds, result, events, None, states, approval_reason)


async def _stream_from(
    rounds: RoundStream,
    result: RunResultStreaming,
    events: _Events,
    answered: Answered | None,
    states: RunStates | None,
    approval_reason: ApprovalReason | None,
) -> PublishedRun:
    # publish_run reads ahead to name the model: the events may have begun.
    run = _Run(rounds, result, answered)
    try:
        while (event := await events.next()) is not None:
            if isinstance(event, RawResponsesStreamEvent):
                await run.response(event, events)
            elif isinstance(event, RunItemStreamEvent):
                item = event.item
                if isinstance(item, ToolCallOutputItem | HandoffOutputItem):
                    payload = cast(Mapping[str, Any], item.to_input_item())
                    await run.output(_call_id(payload), payload.get("output"))
                elif isinstance(item, MCPApprovalResponseItem):
                    await run.approval_answer(cast(Mapping[str, Any], item.raw_item))
            elif isinstance(event, AgentUpdatedStreamEvent):
                run.out.agents.append(event.new_agent.name)
        if result.interruptions:
            await run.ask(states, approval_reason)
        else:
            await run.end_round()
        run.finish()
        return run.out
    finally:
        await _close(result, events)


def _asked_call(item: ToolApprovalItem) -> str | None:
    """The call an interruption's approval request gates, as published: a hosted MCP
    server's interruption names its approval request, whose call has an id of its own."""
    raw = item.raw_item
    # A live run holds the openai SDK's object; a run restored from its state, a dict.
    mcp = isinstance(raw, McpApprovalRequest) or (
        isinstance(raw, Mapping) and raw.get("type") == "mcp_approval_request"
    )
    given = item.call_id
    return approval_call_id(given) if mcp and given else given


def _call_id(payload: Mapping[str, Any]) -> str | None:
    value = payload.get("call_id")
    return value if isinstance(value, str) else None


def _text(output: object) -> str:
    """A tool output as the model reads it: text as it is, anything else as JSON."""
    return output_text(output if output is not None else "")


def _request_id() -> str:
    return "apr_" + secrets.token_hex(12)


def agent_input(request: DialectRequest) -> RunInput:
    """A new run's input from any dialect's request: every message's text
    (:func:`essessey.dialects.conversation`) as the Responses input messages the SDK takes
    (``{"role", "content"}``), in order, the last user message last."""
    return [
        cast(TResponseInputItem, {"role": message.role, "content": message.text})
        for message in conversation(request)
    ]


class AgentTurns:
    """An Agents SDK agent served to every dialect through a hub, approvals included.

    ``turns = AgentTurns(agent)`` is the turn factory of
    :func:`essessey.dialects.dialect_routes` (``turns(request)`` runs the agent on the
    request's conversation, :func:`agent_input`, or on what ``input(request)`` returns) and
    ``turns.on_answer`` the hub's continuation (``StreamHub(on_answer=turns.on_answer)``).
    A run that stops for approvals keeps its ``RunState`` in ``states``
    (:class:`~essessey.adapters.RunStates`: give it the hub's store so every replica finds
    it; the default keeps it in this process); the answer, in any dialect, approves or
    rejects each call (a denial's reason, when given, is the rejection message the model
    reads) and resumes the run with ``Runner.run_streamed(agent, state)``.

    ``run_config``, ``context``, ``max_turns`` and ``hooks`` go to every
    ``Runner.run_streamed`` (``context`` replaces the saved one on a resumed run).
    ``approval_reason(item)`` is an approval request's reason.
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        states: RunStates | None = None,
        run_config: RunConfig | None = None,
        context: Any = None,
        max_turns: int | None = None,
        hooks: RunHooks[Any] | None = None,
        input: Callable[[DialectRequest], RunInput] | None = None,
        approval_reason: ApprovalReason | None = None,
    ) -> None:
        self.agent = agent
        self.states = states if states is not None else RunStates()
        self.run_config = run_config
        self.context = context
        self.max_turns = max_turns
        self.hooks = hooks
        self.input = input if input is not None else agent_input
        self.approval_reason = approval_reason

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"run_config": self.run_config, "hooks": self.hooks}
        if self.max_turns is not None:
            options["max_turns"] = self.max_turns
        return options

    def __call__(self, request: DialectRequest) -> TurnProducer:
        """The producer of the agent's turn for ``request`` (served on ``request.id``)."""
        run_input = self.input(request)
        stream_id = request.id

        async def produce(publisher: Publisher) -> None:
            result = Runner.run_streamed(
                self.agent, run_input, context=self.context, **self._options()
            )
            await publish_run(
                publisher,
                result,
                message_id=new_message_id(),
                stream_id=stream_id,
                states=self.states,
                approval_reason=self.approval_reason,
            )

        return produce

    async def on_answer(self, publisher: Publisher, answered: Answered) -> None:
        """The hub's continuation: resume the run that asked, with the answers applied."""
        async with continue_rounds(publisher, answered) as rounds:
            saved = await self.states.load_answered(answered)
            options: dict[str, Any] = {}
            if self.context is not None:
                options["context_override"] = self.context
            state = await RunState.from_string(self.agent, saved.decode(), **options)
            waiting = {_asked_call(item): item for item in state.get_interruptions()}
            for request, approval in answered.approvals():
                item = waiting.get(request.tool_use_id)
                if item is None:
                    raise LookupError("an answered call is not one the run waits for")
                if approval.approved:
                    state.approve(item)
                else:
                    state.reject(item, rejection_message=approval.reason)
            result = Runner.run_streamed(self.agent, state, **self._options())
            await stream_run(
                rounds,
                result,
                states=self.states,
                answered=answered,
                approval_reason=self.approval_reason,
            )
            await self.states.drop(RunStates.key_of(answered))


set_public_module(__name__, globals(), __all__)
