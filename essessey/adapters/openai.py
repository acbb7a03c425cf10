"""Publish an OpenAI chat-completions stream as the protocol.

The chunks are what ``client.chat.completions.create(..., stream=True)`` yields, as
OpenAI, vLLM, Ollama, LiteLLM and OpenRouter send them: plain mappings (decoded JSON) or
the ``openai`` SDK's ``ChatCompletionChunk`` objects, read through their ``model_dump()``.
The SDK is never imported here.

The mapping, for ``choices[0]`` (other choices are skipped, with one log line):

- ``delta.content`` (and ``delta.refusal``, the model's refusal text) -> a text block.
- ``delta.reasoning_content`` (DeepSeek, vLLM) or ``delta.reasoning`` (vLLM, Ollama,
  OpenRouter) -> a thinking block. Some servers send both with the same text; then
  ``reasoning_content`` is taken and ``reasoning`` ignored, so nothing is doubled.
- ``delta.tool_calls[k]`` -> one tool_use block per call, its arguments streamed as
  ``input_json_delta`` as they arrive (see :func:`stream_round` for the details), and
  the deprecated ``delta.function_call`` as one more call.
- ``finish_reason`` -> the stop reason, by :func:`map_stop_reason`.
- ``usage`` (usually a last chunk with ``choices: []``) -> Anthropic-style counts:
  ``input_tokens`` (``prompt_tokens`` less the cached ones, which Anthropic counts
  apart), ``cache_read_input_tokens`` (``prompt_tokens_details.cached_tokens``),
  ``output_tokens`` (``completion_tokens``) and ``reasoning_tokens``
  (``completion_tokens_details.reasoning_tokens``), each only when the server sent it.

The blocks follow :class:`~essessey.adapters.RoundStream`'s layout: a round's thinking
and text, then its tool_use blocks, so text that comes after the round's tool calls
began has no place and is dropped with a warning. A chunk that cannot be read (not a
mapping, a field of the wrong type, a string with a lone surrogate, a count past 64
bits) is skipped with a warning naming the chunk's position and the reason. Logs carry
positions, counts and lengths, never text or arguments.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from essessey.adapters._message import PublishedMessage, PublishedToolCall, parse_arguments
from essessey.adapters.rounds import RoundStream, ToolCallRequest
from essessey.protocol import StopReason
from essessey.publisher import Publisher

__all__ = ["StreamedRound", "map_stop_reason", "publish", "stream_round"]

logger = logging.getLogger("essessey.adapters.openai")

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_MAX_COUNT: Final = 2**63 - 1

_STOP_REASONS: Final[dict[str, str]] = {
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "content_filter": StopReason.END_TURN,
}


def map_stop_reason(finish_reason: str | None, *, tool_calls: bool = False) -> str:
    """The protocol's stop reason for an OpenAI ``finish_reason``.

    ``tool_calls`` says whether the round made tool calls. The table:

    - ``"length"`` -> ``"max_tokens"``, with or without tool calls (their arguments may
      be cut off, and the caller must know).
    - ``"tool_calls"``, ``"function_call"`` -> ``"tool_use"``.
    - ``"stop"``, None or ``""`` -> ``"tool_use"`` when ``tool_calls``, else
      ``"end_turn"``: several servers (Ollama, some vLLM and LiteLLM backends) say
      ``"stop"`` after tool calls, and an agent loop reading ``"end_turn"`` would never
      run them.
    - ``"content_filter"`` -> ``"end_turn"``, even with tool calls: a filter cut the
      output, so its calls are not to be run.
    - anything else -> passed through unchanged (stop reasons are an open set).
    """
    if not finish_reason or finish_reason == "stop":
        return StopReason.TOOL_USE if tool_calls else StopReason.END_TURN
    return _STOP_REASONS.get(finish_reason, finish_reason)


@dataclass(slots=True)
class StreamedRound:
    """What :func:`stream_round` published for one model response.

    ``text`` and ``thinking`` are what went out (text that came after the round's tool
    calls began has no place in the layout and is not in them). ``tool_calls`` are the
    calls that went out, in order. ``finish_reason`` is the server's last one, as sent;
    ``stop_reason`` is it mapped by :func:`map_stop_reason`. ``usage`` holds the token
    counts of the last usage the server reported (empty when it sent none) and
    ``model`` the first ``model`` field seen.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: list[PublishedToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str = StopReason.END_TURN
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None


async def stream_round(
    rounds: RoundStream,
    chunks: Iterable[Any] | AsyncIterable[Any],
    *,
    id_prefix: str = "call_",
) -> StreamedRound:
    """Publish one model response's chunks into the open round of ``rounds``.

    The caller owns the round: it calls ``round_start`` before, and sends tool results
    and calls ``round_end`` after. When the chunks end, this calls
    ``rounds.assistant_message`` with the round's tool calls, so results may follow.

    Tool calls are keyed by their ``index``. A call's tool_use block opens when the
    call's name is known (fragments that came before are held and go out with it), in
    order of first appearance, and its arguments stream as they arrive. Servers send a
    round's calls one after another, so a new call closes the previous one; a fragment
    for a call already closed cannot go out and is dropped with a warning. A fragment
    without an ``index`` is a new call when it carries an id or a name (unless the id is
    a known call's), else it continues the last call. A call without an id (or with an
    empty or repeated one) gets ``f"{id_prefix}{n}"``, with ``n`` unique within the
    message; when one stream carries several messages, pass a prefix unique to the
    message (as :func:`publish` does). A call that never gets a name is dropped with a
    warning.

    A sync iterable is read in the event loop's thread: give it chunks already in memory,
    and a network stream as an async iterable (the SDK's ``AsyncStream``).
    """
    reader = _RoundReader(rounds, id_prefix)
    await _for_each(chunks, reader.feed)
    return await reader.finish()


async def publish(
    publisher: Publisher,
    chunks: Iterable[Any] | AsyncIterable[Any],
    *,
    message_id: str,
    stream_id: str,
    model: str | None = None,
) -> PublishedMessage:
    """Publish one chat-completions response as one whole message, preamble to epilogue.

    ``model`` defaults to the first chunk's ``model`` field (``""`` when it has none);
    input tokens are unknown when the message starts, so ``message_start`` says 0 and
    the epilogue carries the usage the server reported. The content goes through one
    round of a :class:`~essessey.adapters.RoundStream` (see :func:`stream_round`).
    Tool calls end the message without results (stop reason ``tool_use``): their results
    belong to the next message. Generated tool call ids are
    ``f"call_{message_id}_{n}"``.

    If the chunks raise (or publishing fails), an ``error`` event of type
    ``api_error``, naming only the exception class, ends the stream and the exception
    propagates.
    """
    rounds = RoundStream(publisher)
    reader = _RoundReader(rounds, f"call_{message_id}_")
    opened = False

    async def open_message(first: _Chunk | None) -> None:
        nonlocal opened, model
        if model is None:
            model = first.model if first is not None and first.model is not None else ""
        await publisher.send_stream_preamble(message_id, stream_id, model, input_tokens=0)
        await rounds.round_start()
        opened = True

    async def on_chunk(raw: Any) -> None:
        if opened:
            await reader.feed(raw)
            return
        # The preamble must precede the content, and it names the model: read the first
        # chunk before anything goes out.
        first = reader.parse(raw)
        await open_message(first)
        if first is not None:
            await reader.apply(first)

    try:
        await _for_each(chunks, on_chunk)
        if not opened:
            await open_message(None)
        result = await reader.finish()
        await rounds.round_end(answer_missing=False)
        # Any: mypy cannot tell these keyword arguments from stop_sequence.
        usage: dict[str, Any] = {k: v for k, v in result.usage.items() if k != "output_tokens"}
        # Inside the try: a failed epilogue must still end the stream for its clients.
        await publisher.send_stream_epilogue(
            result.stop_reason, result.usage.get("output_tokens", 0), **usage
        )
    except Exception as exc:
        try:
            await publisher.send_error("api_error", f"the turn failed: {type(exc).__name__}")
        except Exception as send_exc:
            logger.error("could not send the error event: %s", type(send_exc).__name__)
        raise
    return PublishedMessage(
        message_id=message_id,
        model=model if model is not None else "",
        text=result.text,
        thinking=result.thinking,
        tool_calls=result.tool_calls,
        stop_reason=result.stop_reason,
        usage=dict(result.usage),
    )


async def _for_each(
    chunks: Iterable[Any] | AsyncIterable[Any], fn: Callable[[Any], Awaitable[None]]
) -> None:
    # A loop per kind instead of an async-generator wrapper: a wrapper left unfinished
    # by an exception would be closed later by the event loop, not here.
    if isinstance(chunks, AsyncIterable):
        async for raw in chunks:
            await fn(raw)
    else:
        for raw in chunks:
            await fn(raw)


# -- reading chunks ---------------------------------------------------------------------


class _Malformed(Exception):
    """A chunk that cannot be read; the message names the field and type, never values."""


@dataclass(slots=True)
class _Fragment:
    """One entry of ``delta.tool_calls`` (or the legacy ``delta.function_call``)."""

    index: int | None
    id: str | None
    name: str | None
    arguments: str
    legacy: bool = False


@dataclass(slots=True)
class _Delta:
    """What ``choices[0]`` of one chunk carries."""

    text: str
    reasoning: str
    fragments: list[_Fragment]
    finish_reason: str | None


@dataclass(slots=True)
class _Chunk:
    """A chunk, read and type-checked whole before any of it is published."""

    model: str | None
    choice: _Delta | None
    other_choices: bool
    usage: dict[str, int] | None


def _kind(value: object) -> str:
    return type(value).__name__


def _opt_str(value: object, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        # Python's json module turns a "\ud800" escape into a lone surrogate, which no
        # UTF-8 text (so no published event) can carry. isascii() is O(1) in CPython.
        if not value.isascii() and _SURROGATE.search(value):
            raise _Malformed(f"{where} holds a lone surrogate")
        return value
    raise _Malformed(f"{where} is a {_kind(value)}, not a string")


def _opt_int(value: object, where: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise _Malformed(f"{where} is a {_kind(value)}, not an integer")
    return value


def _opt_map(value: object, where: str) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return value
    raise _Malformed(f"{where} is a {_kind(value)}, not an object")


def _opt_list(value: object, where: str) -> list[Any] | tuple[Any, ...] | None:
    if value is None or isinstance(value, list | tuple):
        return value
    raise _Malformed(f"{where} is a {_kind(value)}, not a list")


def _count(value: object, where: str) -> int | None:
    count = _opt_int(value, where)
    if count is not None and count < 0:
        raise _Malformed(f"{where} is negative")
    if count is not None and count > _MAX_COUNT:
        # Python's json module reads any integer; orjson writes none past 64 bits.
        raise _Malformed(f"{where} does not fit in 64 bits")
    return count


def _as_mapping(raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        dump = getattr(raw, "model_dump", None)
        if callable(dump):
            try:
                raw = dump()
            except Exception as exc:
                raise _Malformed(f"model_dump() failed with {_kind(exc)}") from None
    if not isinstance(raw, Mapping):
        raise _Malformed(f"the chunk is a {_kind(raw)}, not a mapping")
    return raw


def _read_usage(value: object) -> dict[str, int] | None:
    usage = _opt_map(value, "usage")
    if usage is None:
        return None
    prompt = _count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    completion = _count(usage.get("completion_tokens"), "usage.completion_tokens")
    prompt_details = _opt_map(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details")
    completion_details = _opt_map(
        usage.get("completion_tokens_details"), "usage.completion_tokens_details"
    )
    cached = reasoning = None
    if prompt_details is not None:
        cached = _count(
            prompt_details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens"
        )
    if completion_details is not None:
        reasoning = _count(
            completion_details.get("reasoning_tokens"),
            "usage.completion_tokens_details.reasoning_tokens",
        )
    counts: dict[str, int] = {}
    if prompt is not None:
        # OpenAI's prompt_tokens include the cached ones; Anthropic's input_tokens do
        # not (cache reads are counted apart), and clients add the two up.
        counts["input_tokens"] = max(prompt - (cached or 0), 0)
    if cached is not None:
        counts["cache_read_input_tokens"] = cached
    if completion is not None:
        counts["output_tokens"] = completion
    if reasoning is not None:
        counts["reasoning_tokens"] = reasoning
    return counts


def _read_fragments(delta: Mapping[str, Any], where: str) -> list[_Fragment]:
    fragments: list[_Fragment] = []
    items = _opt_list(delta.get("tool_calls"), f"{where}.tool_calls") or ()
    for k, item in enumerate(items):
        at = f"{where}.tool_calls[{k}]"
        call = _opt_map(item, at)
        if call is None:
            raise _Malformed(f"{at} is null")
        function = _opt_map(call.get("function"), f"{at}.function") or {}
        fragments.append(
            _Fragment(
                index=_opt_int(call.get("index"), f"{at}.index"),
                id=_opt_str(call.get("id"), f"{at}.id"),
                name=_opt_str(function.get("name"), f"{at}.function.name"),
                arguments=_opt_str(function.get("arguments"), f"{at}.function.arguments") or "",
            )
        )
    legacy = _opt_map(delta.get("function_call"), f"{where}.function_call")
    if legacy is not None:
        fragments.append(
            _Fragment(
                index=None,
                id=None,
                name=_opt_str(legacy.get("name"), f"{where}.function_call.name"),
                arguments=_opt_str(legacy.get("arguments"), f"{where}.function_call.arguments")
                or "",
                legacy=True,
            )
        )
    return fragments


def _read_choice(choice: Mapping[str, Any], where: str) -> _Delta:
    delta = _opt_map(choice.get("delta"), f"{where}.delta") or {}
    at = f"{where}.delta"
    content = _opt_str(delta.get("content"), f"{at}.content") or ""
    refusal = _opt_str(delta.get("refusal"), f"{at}.refusal") or ""
    reasoning_content = _opt_str(delta.get("reasoning_content"), f"{at}.reasoning_content")
    reasoning = _opt_str(delta.get("reasoning"), f"{at}.reasoning")
    return _Delta(
        text=content + refusal,
        reasoning=reasoning_content or reasoning or "",
        fragments=_read_fragments(delta, at),
        finish_reason=_opt_str(choice.get("finish_reason"), f"{where}.finish_reason"),
    )


def _read_chunk(raw: Any) -> _Chunk:
    data = _as_mapping(raw)
    model = _opt_str(data.get("model"), "model")
    usage = _read_usage(data.get("usage"))
    choices = _opt_list(data.get("choices"), "choices") or ()
    first: _Delta | None = None
    other = False
    for k, choice in enumerate(choices):
        where = f"choices[{k}]"
        entry = _opt_map(choice, where)
        if entry is None:
            raise _Malformed(f"{where} is null")
        index = _opt_int(entry.get("index"), f"{where}.index")
        if (k if index is None else index) != 0:
            other = True
            continue
        if first is not None:
            raise _Malformed("two choices have index 0")
        first = _read_choice(entry, where)
    return _Chunk(model=model, choice=first, other_choices=other, usage=usage)


# -- publishing one round ------------------------------------------------------------------


class _Call:
    """One tool call of the round, from its first fragment to its block."""

    __slots__ = ("id", "name", "ordinal", "parts", "server_id", "slot")

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal  # order of first appearance
        self.slot = -1  # its number in RoundStream once started
        self.server_id: str | None = None
        self.name: str | None = None
        self.id = ""
        self.parts: list[str] = []


class _RoundReader:
    """The state of one round while its chunks are read and published."""

    __slots__ = (
        "_by_key",
        "_calls",
        "_dropped_chars",
        "_first_dropped",
        "_first_late",
        "_id_base",
        "_id_prefix",
        "_late_chars",
        "_next",
        "_open",
        "_position",
        "_skipped_choices",
        "_started",
        "_text",
        "_thinking",
        "_used_ids",
        "finish_reason",
        "model",
        "rounds",
        "usage",
    )

    def __init__(self, rounds: RoundStream, id_prefix: str) -> None:
        self.rounds = rounds
        self._id_prefix = id_prefix
        # A round's n calls take block indexes from here on and the next round starts
        # at least 2n further, so base + call number never repeats within a message.
        self._id_base = rounds.next_index
        self._position = -1
        self._calls: list[_Call] = []
        self._by_key: dict[object, _Call] = {}
        self._next = 0  # the first call (by ordinal) not yet started or dropped
        self._started: list[_Call] = []
        self._open: _Call | None = None
        self._used_ids: set[str] = set()
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._dropped_chars = 0
        self._first_dropped = -1
        self._late_chars = 0
        self._first_late = -1
        self._skipped_choices = False
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.model: str | None = None

    def parse(self, raw: Any) -> _Chunk | None:
        """Read the next chunk; None (with a warning) when it is malformed."""
        self._position += 1
        try:
            return _read_chunk(raw)
        except _Malformed as exc:
            logger.warning("skipping chat completion chunk %d: %s", self._position, exc)
            return None

    async def feed(self, raw: Any) -> None:
        """Read the next chunk and publish what it carries."""
        chunk = self.parse(raw)
        if chunk is not None:
            await self.apply(chunk)

    async def apply(self, chunk: _Chunk) -> None:
        """Publish a chunk already read by :meth:`parse`."""
        if self.model is None and chunk.model is not None:
            self.model = chunk.model
        if chunk.usage is not None:
            # Servers that report usage on every chunk report running totals.
            self.usage = chunk.usage
        if chunk.other_choices and not self._skipped_choices:
            self._skipped_choices = True
            logger.warning(
                "chunk %d has choices other than index 0; only choice 0 is published",
                self._position,
            )
        choice = chunk.choice
        if choice is None:
            return
        if choice.text or choice.reasoning:
            if self._started:
                # The layout puts a round's text before its calls: this has no place.
                if self._first_dropped < 0:
                    self._first_dropped = self._position
                self._dropped_chars += len(choice.text) + len(choice.reasoning)
            else:
                await self.rounds.delta(text=choice.text, reasoning=choice.reasoning)
                self._text.append(choice.text)
                self._thinking.append(choice.reasoning)
        for fragment in choice.fragments:
            await self._fragment(fragment)
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason

    async def finish(self) -> StreamedRound:
        """End of the chunks: start the calls still held, then declare the round's calls."""
        for call in self._calls[self._next :]:
            if call.name:
                await self._start(call)
            else:
                logger.warning(
                    "tool call %d never got a name; dropped with %d characters of arguments",
                    call.ordinal,
                    sum(map(len, call.parts)),
                )
        self._next = len(self._calls)
        if self._dropped_chars:
            logger.warning(
                "%d characters of text and reasoning came after the round's tool calls "
                "began (first in chunk %d); dropped",
                self._dropped_chars,
                self._first_dropped,
            )
        if self._late_chars:
            logger.warning(
                "%d characters of arguments came for tool calls already closed "
                "(first in chunk %d); dropped",
                self._late_chars,
                self._first_late,
            )
        requests = [ToolCallRequest(c.id, c.name or "", "".join(c.parts)) for c in self._started]
        await self.rounds.assistant_message(requests)
        calls = [
            PublishedToolCall(r.id, r.name, r.arguments, parse_arguments(r.arguments))
            for r in requests
        ]
        return StreamedRound(
            text="".join(self._text),
            thinking="".join(self._thinking),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            stop_reason=map_stop_reason(self.finish_reason, tool_calls=bool(calls)),
            usage=dict(self.usage),
            model=self.model,
        )

    def _call_for(self, fragment: _Fragment) -> _Call | None:
        key: object
        if fragment.legacy:
            key = "function_call"
        elif fragment.index is not None:
            key = fragment.index
        else:
            # No index: a known id continues its call, an id or a name starts the next
            # call, and bare arguments continue the last one.
            if fragment.id:
                for known in self._calls:
                    if known.server_id == fragment.id:
                        return known
            if not (fragment.id or fragment.name):
                return self._calls[-1] if self._calls else None
            return self._new_call()
        call = self._by_key.get(key)
        if call is None:
            call = self._by_key[key] = self._new_call()
        return call

    def _new_call(self) -> _Call:
        call = _Call(len(self._calls))
        self._calls.append(call)
        return call

    async def _fragment(self, fragment: _Fragment) -> None:
        if not (fragment.id or fragment.name or fragment.arguments) and fragment.index is None:
            return
        call = self._call_for(fragment)
        if call is None:
            return
        if fragment.id and call.server_id is None:
            call.server_id = fragment.id
        if fragment.name and not call.name:
            call.name = fragment.name
        if fragment.arguments:
            if call.slot < 0:
                call.parts.append(fragment.arguments)
            elif call is self._open:
                await self.rounds.tool_call_delta(call.slot, fragment.arguments)
                call.parts.append(fragment.arguments)
            else:
                if self._first_late < 0:
                    self._first_late = self._position
                self._late_chars += len(fragment.arguments)
        # Start, in order, every call whose name is known; an unnamed call holds back
        # the ones after it, since blocks cannot be reordered once out.
        while self._next < len(self._calls) and self._calls[self._next].name:
            await self._start(self._calls[self._next])
            self._next += 1

    async def _start(self, call: _Call) -> None:
        call.slot = len(self._started)
        call_id = call.server_id
        if not call_id or call_id in self._used_ids:
            if call_id:
                logger.warning(
                    "tool call %d repeats an earlier call's id; using a generated id",
                    call.ordinal,
                )
            n = self._id_base + call.slot
            call_id = f"{self._id_prefix}{n}"
            suffix = 0
            while call_id in self._used_ids:
                suffix += 1
                call_id = f"{self._id_prefix}{n}_{suffix}"
        self._used_ids.add(call_id)
        call.id = call_id
        await self.rounds.tool_call_start(
            call.slot, ToolCallRequest(call_id, call.name or "", "".join(call.parts))
        )
        self._started.append(call)
        self._open = call
