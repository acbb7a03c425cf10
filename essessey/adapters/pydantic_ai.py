"""Publish a Pydantic AI agent's run as the protocol, questions included.

Needs the ``pydantic-ai`` extra (``pip install 'essessey[pydantic-ai]'``, which installs
``pydantic-ai-slim``). Two levels, as for the provider adapters (docs/pydantic_ai.md):

- :class:`AgentTurns`: the few lines. ``turns = AgentTurns(agent)`` is a turn factory for
  every dialect (``dialect_routes(hub, turns)``) and ``turns.on_answer`` the hub's
  continuation (``StreamHub(on_answer=turns.on_answer)``), which resumes a run that
  stopped to ask with Pydantic AI's own ``DeferredToolResults``.
- :func:`stream_run`: the events of ``agent.run_stream_events(...)`` into an open
  :class:`~essessey.adapters.RoundStream`, for an app that runs the agent itself.

The mapping, per model request of the run (one round of the message):

=============================================  ==========================================
Pydantic AI                                    published as
=============================================  ==========================================
``TextPart`` and ``TextPartDelta``             a text block
``ThinkingPart`` and ``ThinkingPartDelta``     a thinking block; the part's final
                                               ``signature`` as its ``signature_delta``
                                               (a signed block ends there); a part
                                               with a signature and no text, a thinking
                                               block of the signature alone; Claude's
                                               redacted thinking, a ``redacted_thinking``
                                               block; a signature delta after its part
                                               ended, on the part's block while that is
                                               open, else a ``redacted_thinking`` block
``ToolCallPart`` and ``ToolCallPartDelta``     a tool_use block (the part's
                                               ``tool_call_id`` is its id), arguments as
                                               they stream; output tools too
                                               (``final_result``); a name or id a later
                                               delta gives, while the block is not out
``NativeToolCallPart``,                        a ``server_tool_use`` block and its
``NativeToolReturnPart``                       ``<tool>_tool_result`` block, each once
                                               per call id in a response (a part sent
                                               again is not)
``FunctionToolResultEvent``,                   the call's tool_result; ``is_error`` for
``OutputToolResultEvent``                      the outcomes Pydantic AI counts as errors
                                               (``failed``, ``retried``: a ``ModelRetry``
                                               and a failed validation)
a run ending with ``DeferredToolRequests``     the calls left without a result (the
                                               client's to run, ``calls``), an
                                               ``approval_request`` per call in
                                               ``approvals``; stop reason ``tool_use``
the last response's ``finish_reason``          the stop reason otherwise: ``length``,
                                               ``max_tokens``; ``content_filter``,
                                               ``refusal``; anything else, ``end_turn``
the run's usage                                ``input_tokens`` (without the cache's),
                                               ``output_tokens`` and the cache token
                                               counts of the epilogue
=============================================  ==========================================

An output tool's call (the ``final_result`` tool of a structured output) is published as
the framework's own history has it: a tool_use block with the structured output as its
arguments and a tool_result (``Final result processed.``). The run's output itself is
:attr:`PublishedRun.output`. A ``CompactionPart`` (the provider compacting the
conversation) is a ``compaction`` block carried whole once the next part begins or the
response ends (Pydantic AI sends it again as it fills in), the Anthropic format's: its
``content`` (Anthropic's summary) and the ``encrypted_content`` and ``signature`` of its
``provider_details``, what a client sends back in the conversation's place. Other parts
(files, speech) and events (custom, capability events) are skipped, with one log line per
type naming only the type.
Logs carry types, positions and lengths, never text, arguments or results.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import orjson

from essessey._public import missing_extra

try:
    from pydantic_ai import (
        AgentRunEvents,
        AgentRunResultEvent,
        DeferredToolRequests,
        DeferredToolResults,
        ToolDenied,
        ToolFailed,
    )
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.messages import (
        ERROR_OUTCOMES,
        AgentStreamEvent,
        BaseToolReturnPart,
        CompactionPart,
        FinalResultEvent,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        NativeToolCallPart,
        NativeToolReturnPart,
        PartDeltaEvent,
        PartEndEvent,
        PartStartEvent,
        SystemPromptPart,
        TextPart,
        TextPartDelta,
        ThinkingPart,
        ThinkingPartDelta,
        ToolCallEvent,
        ToolCallPart,
        ToolCallPartDelta,
        ToolResultEvent,
        UserPromptPart,
        is_multi_modal_content,
    )
    from pydantic_ai.models import Model
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.usage import RunUsage
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(__name__, exc, extra="pydantic-ai") from None

from essessey._ids import new_message_id
from essessey._public import set_public_module
from essessey.adapters._compaction import compaction_block
from essessey.adapters._message import PublishedToolCall
from essessey.adapters._run_state import RunStates
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import add_count, clean, json_text, json_value, output_text
from essessey.adapters.rounds import (
    RoundStream,
    continue_rounds,
    stream_rounds,
)
from essessey.dialects import DialectRequest, conversation
from essessey.protocol import StopReason, thinking_block_start
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher, TurnProducer

__all__ = [
    "AgentTurns",
    "PublishedRun",
    "agent_model_name",
    "history_of",
    "publish_run",
    "stream_run",
]

logger = logging.getLogger("essessey.adapters.pydantic_ai")

RunEvent = AgentStreamEvent | AgentRunResultEvent[Any]
"""An event of ``agent.run_stream_events(...)``: the run's own, then its result."""


@dataclass(slots=True)
class PublishedRun:
    """What :func:`stream_run` published and learned from one run.

    ``result`` is the run's ``AgentRunResult`` (None when the events ended without one)
    and ``output`` its output: the agent's answer, or the ``DeferredToolRequests`` it
    stopped at (``deferred``). ``tool_calls`` are the calls published, in order, with
    their parsed arguments; ``results`` the tool results published, by call id, as text.
    ``asked`` are the ids of the requests the message ended with (client calls left
    without a result first, then approval requests): ``asked[0]`` is the key
    :class:`AgentTurns` keeps the run's state under. ``renamed`` names, by the id it went
    out under, each asked call published under another id than the framework's (a model
    that used the id again): the framework's id, which its ``DeferredToolResults`` takes.
    ``usage`` is the run's, ``model`` the model name of its last response.
    """

    result: AgentRunResult[Any] | None = None
    tool_calls: list[PublishedToolCall] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    usage: RunUsage | None = None
    model: str | None = None

    @property
    def output(self) -> Any:
        """The run's output (None without a result)."""
        return None if self.result is None else self.result.output

    @property
    def deferred(self) -> DeferredToolRequests | None:
        """The calls the run stopped at, when it did."""
        output = self.output
        return output if isinstance(output, DeferredToolRequests) else None

    def messages(self) -> list[ModelMessage]:
        """The run's whole message history (empty without a result)."""
        return [] if self.result is None else self.result.all_messages()


def agent_model_name(agent: AbstractAgent[Any, Any]) -> str:
    """The name of ``agent``'s model, for ``message_start``: a ``Model``'s
    ``model_name``, the ``"provider:model"`` string it was given, or ``""``."""
    model = agent.model
    if isinstance(model, Model):
        return model.model_name
    return model or ""


def history_of(request: DialectRequest) -> tuple[str, list[ModelMessage]]:
    """The prompt of a dialect request and the conversation before it, as Pydantic AI's
    history: the last user message's text, and every earlier message (system prompts as
    ``SystemPromptPart``, user messages as ``UserPromptPart``, the assistant's as a
    ``ModelResponse`` with a ``TextPart``)."""
    said = conversation(request)
    last = max((i for i, message in enumerate(said) if message.role == "user"), default=None)
    if last is None:
        return "", _as_history(said)
    return said[last].text, _as_history(said[:last])


def _as_history(said: Sequence[Any]) -> list[ModelMessage]:
    history: list[ModelMessage] = []
    for message in said:
        if message.role == "assistant":
            history.append(ModelResponse(parts=[TextPart(message.text)]))
        elif message.role == "system":
            history.append(ModelRequest(parts=[SystemPromptPart(message.text)]))
        else:
            history.append(ModelRequest(parts=[UserPromptPart(message.text)]))
    return history


# What waits behind an open tool call whose arguments are not whole yet (HeldCalls):
# ("text" | "reasoning", part index, text), ("signature" | "redacted", part index, the
# signature), a tool the provider ran, ("native_call" | "native_result", part index,
# its part), or a block carried whole, ("block", part index, the block).
_Piece: TypeAlias = tuple[str, int, Any]

# The ``ThinkingPart.id`` Pydantic AI gives Claude's redacted thinking (AnthropicModel's
# and BedrockConverseModel's), whose encrypted data is the part's ``signature``.
_REDACTED_IDS: Final = frozenset({"redacted_thinking", "redacted_content"})

# A response's ``finish_reason`` that is not the protocol's ``end_turn``.
_STOP_REASONS: Final[Mapping[str | None, str]] = {
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}


class _RunReader:
    """Reads one run's events into rounds (see :func:`stream_run`)."""

    def __init__(
        self,
        rounds: RoundStream,
        handle: AgentRunEvents[Any] | None,
        answered_calls: Collection[str],
        earlier_ids: Mapping[str, str],
    ) -> None:
        self.rounds = rounds
        self.handle = handle
        self.answered_calls = answered_calls
        self.earlier_ids = earlier_ids  # the asking message's calls: framework id -> published
        self.run = PublishedRun()
        self.side: Literal["none", "response", "request"] = "none"
        self.skipped: set[str] = set()
        self.position = -1  # the run event being read, for log lines
        self._new_round()

    def _new_round(self) -> None:
        # The round's calls, and what waits for an open call's arguments to be whole,
        # in the order the model sent them: a call's fragment that comes after another
        # part began still goes into its block (the other parts are held behind it).
        self.held: HeldCalls[_Piece] = HeldCalls(
            self.rounds,
            "call_",
            self._emit,
            logger=logger,
            noun="tool call",
            where="run event %d",
            before_start=self._before_call,
        )
        self.by_part: dict[int, HeldCall] = {}  # a tool call part's index -> its call
        self.by_id: dict[str, HeldCall] = {}  # the framework's call id -> its call
        self.ended: dict[HeldCall, str] = {}  # a call's arguments as its last part end had them
        # A call's name and id as Pydantic AI's part has them now (a delta may change them).
        self.named: dict[HeldCall, tuple[str, str]] = {}
        # The thinking parts whose content is in the open thinking block (empty when the
        # open block is another, or none), and those whose content went out at all.
        self.thinking: set[int] = set()
        self.shown: set[int] = set()
        self.thought_ended: set[int] = set()  # thinking parts whose end came
        self.signed: dict[int, str] = {}  # a thinking part's signature, once it is sent
        self.natives: set[int] = set()  # native tool call parts, published at their end
        # Compaction parts not published yet, by part index (see _part_start).
        self.compactions: dict[int, CompactionPart] = {}
        # The provider's own calls and results published, by kind and call id: Pydantic
        # AI sends a finished part again at its index (AnthropicModel a tool search call,
        # once its arguments are normalised), in the same response.
        self.natives_out: set[tuple[str, str]] = set()
        self.declared = False
        self.messages = -1
        self.max_part = -1

    # -- events ------------------------------------------------------------------------

    async def feed(self, event: RunEvent) -> None:
        self.position += 1
        if isinstance(event, PartStartEvent):
            await self._part_start(event)
        elif isinstance(event, PartDeltaEvent):
            await self._part_delta(event)
        elif isinstance(event, PartEndEvent):
            await self._part_end(event)
        elif isinstance(event, ToolCallEvent):
            self.side = "request"
            if self.rounds.in_round and not self.declared:
                await self._declare()
        elif isinstance(event, ToolResultEvent):
            self.side = "request"
            await self._result(event.part)
        elif isinstance(event, AgentRunResultEvent):
            self.run.result = event.result
        elif not isinstance(event, FinalResultEvent):
            self._skip(type(event).__name__)

    def _skip(self, kind: str) -> None:
        if kind not in self.skipped:
            self.skipped.add(kind)
            logger.info("a Pydantic AI %s has no place in the protocol; skipped", kind)

    def _starts_response(self, event: PartStartEvent) -> bool:
        if self.side != "response":
            return True
        if self.handle is not None:
            # The run's history grows by the request before each model request: exact.
            return len(self.handle.all_messages()) != self.messages
        # Without the run's handle: parts count from 0 in every response.
        return event.index == 0 and self.max_part >= 0

    async def _part_start(self, event: PartStartEvent) -> None:
        if self._starts_response(event):
            if self.rounds.in_round:
                await self._end_round()
            self._new_round()
            await self.rounds.round_start()
            self.side = "response"
            if self.handle is not None:
                self.messages = len(self.handle.all_messages())
        self.max_part = max(self.max_part, event.index)
        part = event.part
        for index in [i for i in self.compactions if i != event.index]:
            await self._compacted(index)  # another part began: it is whole
        held = self.held
        if isinstance(part, TextPart):
            await self._content(event.index, "text", part.content)
        elif isinstance(part, ThinkingPart):
            await self._content(event.index, "reasoning", part.content)
        elif isinstance(part, ToolCallPart):
            call = HeldCall(len(held.calls))
            call.given_id = part.tool_call_id
            call.name = part.tool_name
            held.add(call)
            self.by_part[event.index] = call
            self.by_id[part.tool_call_id] = call
            self.named[call] = (part.tool_name, part.tool_call_id)
            await held.fragment(call, _arguments(part.args), self.position)
            await held.advance()
        elif isinstance(part, NativeToolCallPart):
            self.natives.add(event.index)  # published whole, at its end
        elif isinstance(part, CompactionPart):
            # The provider's stream sends it again as it fills in (no end of its own):
            # published whole once another part begins, or the response ends.
            self.compactions[event.index] = part
        elif isinstance(part, NativeToolReturnPart):
            if self._first_out("result", part):
                await held.put(("native_result", event.index, part))
        else:
            self._skip(type(part).__name__)

    async def _content(self, index: int, kind: str, text: str) -> None:
        if text:
            # A lone surrogate (a provider's "\ud800" escape) has no UTF-8: U+FFFD instead.
            await self.held.put((kind, index, clean(text)))

    async def _part_delta(self, event: PartDeltaEvent) -> None:
        delta = event.delta
        if self.side != "response":
            logger.warning("a part delta outside a model response; skipped")
            return
        if isinstance(delta, TextPartDelta):
            await self._content(event.index, "text", delta.content_delta)
        elif isinstance(delta, ThinkingPartDelta):
            await self._content(event.index, "reasoning", delta.content_delta or "")
            if delta.signature_delta and event.index in self.thought_ended:
                # After its part ended (OpenAIResponsesModel's encrypted reasoning, at
                # the item's end): no later part end carries it. Before, the end does.
                await self._signature(event.index, delta.signature_delta)
        elif isinstance(delta, ToolCallPartDelta):
            await self._call_delta(event.index, delta)
        else:
            self._skip(type(delta).__name__)

    async def _call_delta(self, index: int, delta: ToolCallPartDelta) -> None:
        call = self.by_part.get(index)
        if call is None:
            return  # a native tool call's arguments: it goes out whole at its end
        name, call_id = self.named[call]
        if delta.tool_name_delta or (delta.tool_call_id and delta.tool_call_id != call_id):
            # Pydantic AI's own rule: a name delta adds to the name, an id replaces it.
            await self._follow(
                call, name + (delta.tool_name_delta or ""), delta.tool_call_id or call_id
            )
        args = delta.args_delta
        if not args:
            return
        if not isinstance(args, str):
            # The provider merges arguments as objects: the block keeps what went out;
            # the part has the rest.
            logger.warning(
                "arguments of tool call %d came as an object; not streamed", call.ordinal
            )
            return
        await self.held.fragment(call, args, self.position)
        await self.held.advance()

    async def _follow(self, call: HeldCall, name: str, call_id: str) -> None:
        """The call's part now has ``name`` and ``call_id``: its block takes them while
        it is not out yet; once out, it keeps what it went out with."""
        if self.named[call] == (name, call_id):
            return
        self.named[call] = (name, call_id)
        # Its result and the run's deferred requests name it by the id it has now.
        self.by_id[call_id] = call
        if call.slot >= 0:
            logger.warning(
                "tool call %d changed its name or id after its block went out; "
                "the block keeps the first",
                call.ordinal,
            )
            return
        call.name = name
        call.given_id = call_id
        await self.held.advance()  # a call that got its name may open its block now

    async def _part_end(self, event: PartEndEvent) -> None:
        part = event.part
        if self.side != "response":
            logger.warning("a part end outside a model response; skipped")
            return
        if isinstance(part, ThinkingPart):
            self.thought_ended.add(event.index)
            if part.signature:
                await self._signature(
                    event.index,
                    part.signature,
                    redacted=part.id in _REDACTED_IDS and not part.content,
                )
        elif isinstance(part, NativeToolCallPart) and event.index in self.natives:
            self.natives.discard(event.index)
            if self._first_out("call", part):
                await self.held.put(("native_call", event.index, part))
        elif isinstance(part, CompactionPart) and event.index in self.compactions:
            self.compactions[event.index] = part
            await self._compacted(event.index)
        elif isinstance(part, ToolCallPart) and event.index in self.by_part:
            # Not the call's end for certain: a part's end comes when the next part
            # begins, and a model that interleaves its calls sends more of this one
            # after. Its block closes once its arguments are whole JSON, or the
            # response is done.
            call = self.by_part[event.index]
            self.ended[call] = _arguments(part.args)
            await self._follow(call, part.tool_name, part.tool_call_id)

    async def _compacted(self, index: int) -> None:
        """Publish compaction part ``index`` as it is now: whole, once."""
        part = self.compactions.pop(index)
        # Its summary (Anthropic's) and what it is sent back with (provider_details).
        details = part.provider_details or {}
        block = compaction_block(
            part.content, details.get("encrypted_content"), details.get("signature")
        )
        if block is None:
            logger.warning("a compaction part with nothing to send back; not published")
        else:
            await self.held.put(("block", index, block))

    async def _signature(self, index: int, signature: str, *, redacted: bool = False) -> None:
        """The signature of thinking part ``index``, once per part."""
        sent = self.signed.get(index)
        if sent is not None:
            if sent != signature:
                logger.warning(
                    "thinking part %d got a second signature after the first was sent; "
                    "not published",
                    index,
                )
            return
        self.signed[index] = signature
        await self.held.put(("redacted" if redacted else "signature", index, signature))

    def _first_out(self, kind: str, part: NativeToolCallPart | NativeToolReturnPart) -> bool:
        """Whether the provider's own call (``kind`` ``"call"``) or result (``"result"``)
        ``part`` is published for the first time; a part sent again is not."""
        key = (kind, part.tool_call_id)
        if key in self.natives_out:
            logger.debug("a native tool %s sent again at its index; published once", kind)
            return False
        self.natives_out.add(key)
        return True

    # -- publishing what the held calls let go ------------------------------------------

    async def _emit(self, piece: _Piece) -> None:
        kind, index, value = piece
        if kind == "reasoning":
            await self.rounds.delta(reasoning=value)
            self.thinking.add(index)
            self.shown.add(index)
            return
        if kind == "text":
            await self.rounds.delta(text=value)
        elif kind == "signature":
            await self._sign(index, value)
        elif kind == "redacted":
            await self._redacted(value)
        elif kind == "block":
            await self._server_block(value)
        elif kind == "native_call":
            await self._server_block(
                {
                    "type": "server_tool_use",
                    "id": value.tool_call_id,
                    "name": value.tool_name,
                    "input": json_value(value.args_as_dict()),
                }
            )
        else:
            await self._server_block(
                {
                    "type": f"{value.tool_name}_tool_result",
                    "tool_use_id": value.tool_call_id,
                    "content": json_value(to_jsonable_python(value.content, fallback=str)),
                }
            )
        self.thinking.clear()

    async def _sign(self, index: int, signature: str) -> None:
        """Publish the signature of thinking part ``index``: on its thinking block while
        that is the open block; on a thinking block of its own when the part had no
        text; else (its block closed) as a ``redacted_thinking`` block, the protocol's
        other way to carry reasoning a client cannot read but must send back."""
        rounds = self.rounds
        if index not in self.thinking and index in self.shown:
            await self._redacted(signature)
            return
        if index not in self.thinking:
            await rounds.open_content(thinking_block_start(rounds.publisher.dialect))
        await rounds.delta(signature=signature)
        # What the provider signed ends here: the next part's reasoning, signed on its
        # own, is a block of its own (a second signature would join the first).
        await rounds.close_block()

    async def _redacted(self, data: str) -> None:
        """Reasoning a client cannot read, only send back: a ``redacted_thinking`` block,
        as the Anthropic and Responses adapters publish it."""
        await self._server_block({"type": "redacted_thinking", "data": data})

    async def _server_block(self, block: dict[str, Any]) -> None:
        await self.rounds.block_start(block)
        await self.rounds.block_stop()

    async def _before_call(self) -> None:
        self.thinking.clear()

    async def _declare(self) -> None:
        self.declared = True
        for index in list(self.compactions):
            await self._compacted(index)
        held = self.held
        await held.advance(final=True)
        held.log_late()
        for call, arguments in self.ended.items():
            if arguments != "".join(call.parts):
                logger.warning(
                    "tool call %d ended with other arguments than streamed", call.ordinal
                )
        await self.rounds.assistant_message(held.requests())

    def _slot(self, tool_call_id: str) -> int | None:
        """The number in the round of the framework's call ``tool_call_id``, once its
        block opened."""
        call = self.by_id.get(tool_call_id)
        return None if call is None or call.slot < 0 else call.slot

    async def _result(self, part: BaseToolReturnPart[Any]) -> None:
        # An image, audio, a document or a video a tool returned: Pydantic AI's own text
        # of the result leaves it out, and so does the protocol's text result.
        content = part.content
        for item in content if isinstance(content, list) else [content]:
            if is_multi_modal_content(item):
                self._skip(f"tool result's {type(item).__name__}")
        text = output_text(part.model_response_str(wrap_if_error=False))
        is_error = part.outcome in ERROR_OUTCOMES
        if self.rounds.in_round and not self.declared:
            await self._declare()  # the round's calls are known once it is
        i = self._slot(part.tool_call_id) if self.rounds.in_round else None
        if i is None:
            await self._earlier_result(part, text, is_error)
            return
        published = self.held.started[i].id
        if published in self.run.results:
            logger.warning("tool call %d got a second result; not published", i)
            return
        self.run.results[published] = text
        # The round holds a result behind an earlier call's: results go out in call order.
        await self.rounds.tool_result(i, text, is_error=is_error)

    async def _earlier_result(self, part: BaseToolReturnPart[Any], text: str, err: bool) -> None:
        """A result of a call an earlier message made: a resumed run's approved calls."""
        call_id = part.tool_call_id
        if part.outcome == "denied" or call_id in self.answered_calls:
            return  # the answer's record already says it (approval_response, tool_result)
        # The asking message may have published the call under an id of its own.
        call_id = self.earlier_ids.get(call_id, call_id)
        rounds = self.rounds
        if rounds.in_round:
            logger.warning("a tool result for a call of no round; skipped")
            return
        if rounds.publisher.strict and not rounds.call_id_used(call_id):
            # A call no message of the stream made (a run resumed from a history of its
            # own): its result has no block to answer. A strict publisher knows them all.
            logger.warning("a tool result for a call the stream does not know; skipped")
            return
        self.run.results[call_id] = text
        await rounds.earlier_result(call_id, text, is_error=err)

    async def _end_round(self, *, waiting: bool = False) -> None:
        if not self.declared:
            await self._declare()
        self.run.tool_calls.extend(self.held.published())
        # Results held behind a call without one go out here, in call order; that call
        # gets an error result unless it waits for the client.
        await self.rounds.round_end(answer_missing=not waiting)

    # -- the end -------------------------------------------------------------------------

    async def finish(self) -> PublishedRun:
        run = self.run
        deferred = run.deferred
        if self.rounds.in_round:
            await self._end_round(waiting=deferred is not None)
        if run.result is not None:
            run.usage = run.result.usage
            run.model = run.result.response.model_name
            usage = _usage_counts(run.usage)
            self.rounds.output_tokens = usage.pop("output_tokens", 0)
            self.rounds.usage = usage
        if deferred is None:
            # A run that ends without calls waiting: its calls (an output tool's too)
            # were answered, so a final "tool_call" ends the turn as "stop" does.
            finish = None if run.result is None else run.result.response.finish_reason
            self.rounds.stop_reason = _STOP_REASONS.get(finish, StopReason.END_TURN)
            return run
        for call in deferred.calls:
            run.asked.append(self._published_id(call.tool_call_id))
            if run.asked[-1] != call.tool_call_id:
                run.renamed[run.asked[-1]] = call.tool_call_id
        for call in deferred.approvals:
            reason = _reason(deferred.metadata.get(call.tool_call_id))
            call_id = self._published_id(call.tool_call_id)
            if call_id != call.tool_call_id:
                run.renamed[call_id] = call.tool_call_id
            run.asked.append(await self.rounds.ask_approval(call_id, reason=reason))
        self.rounds.stop_reason = StopReason.TOOL_USE
        return run

    def _published_id(self, tool_call_id: str) -> str:
        """The id the last round published the framework's call ``tool_call_id`` under."""
        i = self._slot(tool_call_id)
        return tool_call_id if i is None else self.held.started[i].id


def _usage_counts(usage: RunUsage) -> dict[str, int]:
    """The run's token counts in the protocol's terms. Pydantic AI's ``input_tokens``
    includes the cache's reads and writes; the protocol's (Anthropic's) leaves them out,
    counted apart, and clients add the three up."""
    counts: dict[str, int] = {}
    add_count(counts, "output_tokens", usage.output_tokens)
    cached = usage.cache_read_tokens
    written = usage.cache_write_tokens
    add_count(counts, "input_tokens", max(usage.input_tokens - cached - written, 0))
    if cached:
        add_count(counts, "cache_read_input_tokens", cached)
    if written:
        add_count(counts, "cache_creation_input_tokens", written)
    return counts


def _arguments(args: str | Mapping[str, Any] | None) -> str:
    if args is None:
        return ""
    if isinstance(args, str):
        return args
    return json_text(to_jsonable_python(args, fallback=str))


def _reason(metadata: Any) -> str | None:
    """An approval's reason: the ``reason`` of the ``ApprovalRequired`` metadata, if any."""
    if isinstance(metadata, Mapping):
        reason = metadata.get("reason")
        if isinstance(reason, str):
            return reason
    return None


async def stream_run(
    rounds: RoundStream,
    events: AsyncIterable[RunEvent],
    *,
    answered_calls: Collection[str] = (),
    renamed: Mapping[str, str] | None = None,
) -> PublishedRun:
    """Publish a Pydantic AI run's events into ``rounds``; what it published and learned.

    ``events`` is what ``agent.run_stream_events(...)`` yields (the ``AgentRunEvents``
    handle itself, or any async iterable of its events). Each model request of the run
    is a round: its thinking, text and tool calls as they stream, then the results of
    the tools the framework ran (in call order), then the next round. Give it the
    handle and a new round starts exactly where the run makes its next model request
    (the run's history grows by the request); given another iterable, a part at index 0
    after a response's parts, or after tool events, starts one.

    When the run stops at ``DeferredToolRequests``, the round ends with the deferred
    calls left without a result (``calls``: the client's to run) and an
    ``approval_request`` per call in ``approvals`` (its reason: the ``reason`` in the
    ``ApprovalRequired`` metadata, if any); the stop reason is ``tool_use`` and
    :attr:`PublishedRun.asked` names the requests. A resumed run's results for calls of
    the earlier message (approved calls) go out first, between rounds; a denied call's
    result and the results of ``answered_calls`` (the client's outputs the answer's
    record carries; the framework's ids) are not published again. ``renamed`` is the
    asking run's :attr:`PublishedRun.renamed`: an approved call's result goes to the
    block its call was published as.

    Usage goes to ``rounds.usage`` and ``rounds.output_tokens`` (``input_tokens``
    without the cache's reads and writes, which have keys of their own), the stop reason
    to ``rounds.stop_reason`` (``tool_use`` for a run that stopped at calls, else the
    last response's ``finish_reason``: ``max_tokens`` for ``length``, ``refusal`` for
    ``content_filter``, ``end_turn`` for any other). What the events raise propagates
    (:func:`stream_rounds` then ends the message with an ``error`` event).
    """
    handle = events if isinstance(events, AgentRunEvents) else None
    earlier = {framework: published for published, framework in (renamed or {}).items()}
    reader = _RunReader(rounds, handle, answered_calls, earlier)
    try:
        async for event in events:
            await reader.feed(event)
    except BaseException:
        # The run failed or the turn was cancelled: what the model sent before it, held
        # behind a call whose arguments were not whole, goes out first.
        await reader.held.release_after_failure()
        raise
    return await reader.finish()


async def publish_run(
    publisher: Publisher,
    events: AsyncIterable[RunEvent],
    *,
    message_id: str,
    stream_id: str,
    model: str,
    states: RunStates | None = None,
) -> PublishedRun:
    """Publish a Pydantic AI run's events as one whole message, preamble to epilogue.

    :func:`stream_run` inside :func:`~essessey.adapters.stream_rounds`: an error of the
    run ends the message with an ``error`` event and propagates. With ``states``, a run
    that stopped to ask keeps its message history there under the id of the first
    request (:class:`AgentTurns` resumes it), saved before the message ends.
    """
    async with stream_rounds(
        publisher, message_id=message_id, stream_id=stream_id, model=model
    ) as rounds:
        published = await stream_run(rounds, events)
        await _keep(states, published)
        return published


async def _keep(states: RunStates | None, published: PublishedRun) -> None:
    # Saved before the message ends: an answer is taken only once it has.
    if states is not None and published.asked:
        await states.save(published.asked[0], _state_of(published))


def _state_of(published: PublishedRun) -> bytes:
    """What :class:`AgentTurns` keeps of a run that asked: the ids the answer's requests
    name that are not the framework's (one line of JSON), then the run's history."""
    return orjson.dumps(published.renamed) + b"\n" + _history_json(published.messages())


def _read_state(state: bytes) -> tuple[dict[str, str], list[ModelMessage]]:
    """A state :func:`_state_of` wrote: the renamed ids, and the history."""
    head, _, history = state.partition(b"\n")
    renamed = orjson.loads(head)
    return dict(renamed), ModelMessagesTypeAdapter.validate_json(history)


def _history_json(messages: list[ModelMessage]) -> bytes:
    """The run's messages as Pydantic AI writes them, to be read back by its
    ``validate_json``. A lone surrogate in their text (a tool's output of a file name
    decoded with surrogateescape, say) is replaced by U+FFFD: no JSON writer takes one,
    and Pydantic AI's own raises."""
    try:
        return ModelMessagesTypeAdapter.dump_json(messages)
    except PydanticSerializationError:
        cleaned = _cleaned(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))
        return orjson.dumps(cleaned)


def _cleaned(value: Any) -> Any:
    """``value`` (JSON values) with every string's lone surrogates replaced."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    if isinstance(value, dict):
        return {clean(key): _cleaned(item) for key, item in value.items()}
    return value


class AgentTurns:
    """A Pydantic AI agent served to every dialect, and resumed when a run asked.

    ``turns(request)`` is the turn of a dialect request (``dialect_routes(hub, turns)``):
    the prompt is the request's last user message and the earlier messages are the run's
    ``message_history`` (:func:`history_of`). ``turns.on_answer`` is the hub's
    continuation (``StreamHub(on_answer=turns.on_answer)``): it loads the message
    history of the run that stopped to ask and resumes it with ``DeferredToolResults``
    (an approval as ``True``, a denial as ``ToolDenied`` with the client's reason, a
    client call's output as its result, ``ToolFailed`` for an error output).

    The agent's ``output_type`` must include ``DeferredToolRequests`` for a run to stop
    at tools with ``requires_approval=True`` or deferred tools (Pydantic AI's rule).
    ``states`` keeps the histories: ``RunStates(store)`` on the hub's shared store for
    replicas (the default keeps them in this process). ``deps`` goes to every run;
    ``model_name`` overrides the name ``message_start`` carries (default: the agent's
    model's, :func:`agent_model_name`).
    """

    __slots__ = ("agent", "deps", "model_name", "states")

    def __init__(
        self,
        agent: AbstractAgent[Any, Any],
        *,
        states: RunStates | None = None,
        deps: Any = None,
        model_name: str | None = None,
    ) -> None:
        self.agent = agent
        self.states = states if states is not None else RunStates()
        self.deps = deps
        self.model_name = model_name if model_name is not None else agent_model_name(agent)

    def __call__(self, request: DialectRequest) -> TurnProducer:
        """The turn answering ``request``, as a hub producer on the request's stream."""
        prompt, history = history_of(request)
        stream_id = request.id

        async def produce(publisher: Publisher) -> None:
            async with stream_rounds(
                publisher,
                message_id=new_message_id(),
                stream_id=stream_id,
                model=self.model_name,
            ) as rounds:
                # The run starts inside the message: what its start raises is an in-band
                # error too.
                async with self.agent.run_stream_events(
                    prompt, message_history=history, deps=self.deps
                ) as events:
                    published = await stream_run(rounds, events)
                await _keep(self.states, published)

        return produce

    async def on_answer(self, publisher: Publisher, answered: Answered) -> None:
        """Resume the run whose message ``answered`` answers, in the hub's new message."""
        async with continue_rounds(publisher, answered) as rounds:
            state = await self.states.load_answered(answered)
            renamed, history = _read_state(state)
            results = DeferredToolResults()
            for request, approval in answered.approvals():
                results.approvals[renamed.get(request.tool_use_id, request.tool_use_id)] = (
                    True
                    if approval.approved
                    else ToolDenied(approval.reason)
                    if approval.reason
                    else ToolDenied()
                )
            for call, output in answered.tool_outputs():
                results.calls[renamed.get(call.id, call.id)] = (
                    ToolFailed(output.text) if output.is_error else output.output
                )
            if answered.questions():
                logger.warning(
                    "%d answered question(s) a Pydantic AI run never asks; ignored",
                    len(answered.questions()),
                )
            answered_calls = {renamed.get(call.id, call.id) for call, _ in answered.tool_outputs()}
            async with self.agent.run_stream_events(
                message_history=history, deferred_tool_results=results, deps=self.deps
            ) as events:
                published = await stream_run(
                    rounds, events, answered_calls=answered_calls, renamed=renamed
                )
            await _keep(self.states, published)
        await self.states.drop(RunStates.key_of(answered))


set_public_module(__name__, globals(), __all__)
