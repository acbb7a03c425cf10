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
  ``delta.reasoning_details`` (OpenRouter, Snowflake): its text when the delta has
  neither (Snowflake sends it alone), its ``signature`` as the thinking block's
  ``signature_delta``; encrypted reasoning is skipped with a log line.
- ``delta.annotations`` (OpenAI's search models, OpenRouter's web search) -> the text
  block's ``citations_delta``, after the text they follow (a ``url_citation`` as the
  Anthropic format's ``web_search_result_location``; sources sent before any text wait
  for it).
- ``delta.tool_calls[k]`` -> one tool_use block per call, its arguments streamed as
  ``input_json_delta`` as they arrive (see :func:`stream_round` for the details), and
  the deprecated ``delta.function_call`` as one more call.
- ``finish_reason`` -> the stop reason, by :func:`map_stop_reason`.
- ``usage`` (usually a last chunk with ``choices: []``) -> Anthropic-style counts:
  ``input_tokens`` (``prompt_tokens`` less the cached ones, which Anthropic counts
  apart), ``cache_read_input_tokens`` (``prompt_tokens_details.cached_tokens``),
  ``output_tokens`` (``completion_tokens``) and ``reasoning_tokens``
  (``completion_tokens_details.reasoning_tokens``), each only when the server sent it.

The blocks follow :class:`~essessey.adapters.RoundStream`'s layout, in the order the
server sent them (text after a tool call is a block after it); the arguments of
parallel calls whose fragments interleave are kept whole (see :func:`stream_round`).
``delta.content`` may also be a list of typed parts (Mistral): ``text`` parts are text,
``thinking`` parts reasoning, in order. An ``error`` object in a chunk ends the message
with the provider's error. A chunk that cannot be read (not a
mapping, a field of the wrong type, a string with a lone surrogate, a count past 64
bits) is skipped with a warning naming the chunk's position and the reason. Logs carry
positions, counts and lengths, never text or arguments.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from essessey._logsafe import dotted_label, log_label
from essessey.adapters._citations import citation, nested_annotation
from essessey.adapters._message import PublishedMessage, PublishedToolCall
from essessey.adapters._publishing import Ending, publish_message, require_round
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import (
    Malformed,
    as_mapping,
    count,
    has_lone_surrogate,
    opt_int,
    opt_list,
    opt_map,
    opt_str,
    read_all,
    req_map,
    token_counts,
)
from essessey.adapters.rounds import RoundStream
from essessey.errors import ProviderStreamError
from essessey.protocol import StopReason
from essessey.publisher import Publisher

__all__ = ["CUT_STREAM", "StreamedRound", "map_stop_reason", "publish", "stream_round"]

logger = logging.getLogger("essessey.adapters.openai")

CUT_STREAM: Final = "the provider stream ended before its finish_reason, a call's arguments cut"
"""The message of the ``api_error`` that ends a stream cut short: no chunk gave a
``finish_reason`` and a tool call's arguments are not whole JSON."""

_STOP_REASONS: Final[dict[str, str]] = {
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "content_filter": StopReason.REFUSAL,
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
    - ``"content_filter"`` -> ``"refusal"``, even with tool calls: a filter cut the
      output, so its calls are not to be run.
    - anything else -> passed through unchanged (stop reasons are an open set).
    """
    if not finish_reason or finish_reason == "stop":
        return StopReason.TOOL_USE if tool_calls else StopReason.END_TURN
    return _STOP_REASONS.get(finish_reason, finish_reason)


@dataclass(slots=True)
class StreamedRound:
    """What :func:`stream_round` published for one model response.

    ``text`` and ``thinking`` are what went out. ``tool_calls`` are the calls that went
    out, in order. ``finish_reason`` is the server's last one, as sent;
    ``stop_reason`` is it mapped by :func:`map_stop_reason`. ``usage`` holds the token
    counts of the last usage the server reported (empty when it sent none) and
    ``model`` the first non-empty ``model`` field seen.
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

    The caller owns the round: it calls ``round_start`` before (outside a started round
    this raises :class:`~essessey.RoundOrderError` before reading a chunk), and sends
    tool results and calls ``round_end`` after. When the chunks end, this calls
    ``rounds.assistant_message`` with the round's tool calls, so results may follow.

    Tool calls are keyed by their ``index``. A call's tool_use block opens when the
    call's name is known, in order of first appearance, and its arguments stream as
    they arrive, one ``input_json_delta`` per fragment. While a call's block is open
    and its arguments are not yet whole JSON, whatever else comes (another call's
    fragments, as servers that interleave parallel calls send them, or text) is held
    and goes out, in order, once the call's arguments are whole or the chunks end; a
    held fragment goes out as its own delta too (as do the fragments that came before
    its call's name), so every call's arguments reach the client exactly as the server
    sent them, fragment for fragment. (A
    fragment for a call that was closed with whole JSON arguments cannot go out; it is
    counted in a warning.) Text and reasoning keep their place among the calls: text
    after a call is a block after it. A fragment without an ``index`` is a new call
    when it carries an id or a name (unless the id is a known call's), else it
    continues the last call. A call without an id (or with an empty or repeated one)
    gets ``f"{id_prefix}{n}"``, with ``n`` unique within the message; when one stream
    carries several messages, pass a prefix unique to the message (as :func:`publish`
    does). A call that never gets a name is dropped with a warning.

    A chunk with an ``error`` object (OpenRouter puts one in a chunk, Groq sends an SSE
    ``error`` event whose data is ``{"error": ...}``) ends the response: what came
    before goes out, the round's calls are declared, and :class:`ProviderStreamError`
    is raised with the provider's type (from its ``type``, else its HTTP ``code``) and
    message, so :func:`~essessey.adapters.stream_rounds` ends the turn with that error.

    A sync iterable is read in the event loop's thread: give it chunks already in memory,
    and a network stream as an async iterable (the SDK's ``AsyncStream``).
    """
    require_round(rounds)
    reader = _RoundReader(rounds, id_prefix)
    async with reader.held.released_on_failure():
        await read_all(chunks, reader.feed, lambda: reader.error is not None)
    result = await reader.finish()
    if reader.error is not None:
        raise reader.error
    return result


async def publish(
    publisher: Publisher,
    chunks: Iterable[Any] | AsyncIterable[Any],
    *,
    message_id: str,
    stream_id: str,
    model: str | None = None,
) -> PublishedMessage:
    """Publish one chat-completions response as one whole message, preamble to epilogue.

    ``model`` defaults to the first non-empty ``model`` field of the chunks read before
    any content (``""`` when none names one); input tokens are unknown when the message
    starts, so ``message_start`` says 0 and the epilogue carries the usage the server
    reported. The content goes through one round of a
    :class:`~essessey.adapters.RoundStream` (see :func:`stream_round`). Tool calls end
    the message without results (stop reason ``tool_use``): their results belong to
    the next message. Generated tool call ids are ``f"call_{message_id}_{n}"``.

    A provider error in the stream (see :func:`stream_round`) ends the message with a
    ``message_delta`` (the stop reason and usage so far) and then the provider's
    ``error`` event instead of ``message_stop``: the message does not read as complete.
    ``publish`` then returns with ``error`` set to the provider's type and message.

    If the chunks raise (or publishing fails), an ``error`` event of type
    ``api_error``, naming only the exception class, ends the stream and the exception
    propagates.
    """
    rounds = RoundStream(publisher)
    reader = _RoundReader(rounds, f"call_{message_id}_")
    opened = False
    # Chunks that carry nothing to publish (Azure's content-filter chunk with model "")
    # are read before the preamble, so the model it names is the first real one.
    early: list[_Chunk] = []

    async def open_message() -> None:
        nonlocal opened, model
        if model is None:
            model = next((c.model for c in early if c.model), "")
        await publisher.send_stream_preamble(message_id, stream_id, model, input_tokens=0)
        await rounds.round_start()
        opened = True
        for chunk in early:
            await reader.apply(chunk)
        early.clear()

    async def on_chunk(raw: Any) -> None:
        if opened:
            await reader.feed(raw)
            return
        # The preamble must precede the content, and it names the model: read chunks
        # until one names it or carries content.
        chunk = reader.parse(raw)
        if chunk is None:
            return
        early.append(chunk)
        if chunk.model or chunk.choice is not None or chunk.error is not None:
            await open_message()

    async def read() -> tuple[StreamedRound, Ending]:
        async with reader.held.released_on_failure():
            await read_all(chunks, on_chunk, lambda: reader.error is not None)
        if not opened:
            await open_message()
        result = await reader.finish()
        # A provider's error still gets the message_delta: the stop reason and usage so far.
        return result, Ending(result.stop_reason, result.usage, reader.error, True)

    result = await publish_message(publisher, read, rounds=rounds)
    error = reader.error
    return PublishedMessage(
        message_id=message_id,
        model=model if model is not None else "",
        text=result.text,
        thinking=result.thinking,
        tool_calls=result.tool_calls,
        stop_reason=result.stop_reason,
        usage=dict(result.usage),
        error=None if error is None else {"type": error.error_type, "message": error.message},
    )


# -- reading chunks ---------------------------------------------------------------------


@dataclass(slots=True)
class _Fragment:
    """One entry of ``delta.tool_calls`` (or the legacy ``delta.function_call``)."""

    index: int | None
    id: str | None
    name: str | None
    arguments: str
    legacy: bool = False


# What a chunk's choice carries, in order: ("text" | "reasoning", text), ("signature",
# the reasoning's signature), or ("citation", an annotation of the text).
_Piece: TypeAlias = tuple[str, Any]


@dataclass(slots=True)
class _Delta:
    """What ``choices[0]`` of one chunk carries: its output pieces in order, each
    ``("text", text)`` for answer text, ``("reasoning", text)`` for reasoning,
    ``("signature", signature)`` for the reasoning's signature and ``("citation",
    annotation)`` for an annotation of the text (after the chunk's text)."""

    output: list[_Piece]
    fragments: list[_Fragment]
    finish_reason: str | None
    # What the choice carries that the protocol has no place for (``delta.audio``,
    # ``logprobs``): named once in a log line, never published.
    left_out: tuple[str, ...] = ()


@dataclass(slots=True)
class _Chunk:
    """A chunk, read and type-checked whole before any of it is published."""

    model: str | None
    choice: _Delta | None
    other_choices: bool
    usage: dict[str, int] | None
    error: ProviderStreamError | None


def _read_usage(value: object) -> dict[str, int] | None:
    usage = opt_map(value, "usage")
    if usage is None:
        return None
    prompt = count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    completion = count(usage.get("completion_tokens"), "usage.completion_tokens")
    prompt_details = opt_map(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details")
    completion_details = opt_map(
        usage.get("completion_tokens_details"), "usage.completion_tokens_details"
    )
    cached = reasoning = None
    if prompt_details is not None:
        cached = count(
            prompt_details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens"
        )
    if completion_details is not None:
        reasoning = count(
            completion_details.get("reasoning_tokens"),
            "usage.completion_tokens_details.reasoning_tokens",
        )
    return token_counts(prompt, cached, completion, reasoning)


def _read_fragments(delta: Mapping[str, Any], where: str) -> list[_Fragment]:
    fragments: list[_Fragment] = []
    items = opt_list(delta.get("tool_calls"), f"{where}.tool_calls") or ()
    for k, item in enumerate(items):
        at = f"{where}.tool_calls[{k}]"
        call = opt_map(item, at)
        if call is None:
            raise Malformed(f"{at} is null")
        function = opt_map(call.get("function"), f"{at}.function") or {}
        fragments.append(
            _Fragment(
                index=opt_int(call.get("index"), f"{at}.index"),
                id=opt_str(call.get("id"), f"{at}.id"),
                name=opt_str(function.get("name"), f"{at}.function.name"),
                arguments=opt_str(function.get("arguments"), f"{at}.function.arguments") or "",
            )
        )
    legacy = opt_map(delta.get("function_call"), f"{where}.function_call")
    if legacy is not None:
        fragments.append(
            _Fragment(
                index=None,
                id=None,
                name=opt_str(legacy.get("name"), f"{where}.function_call.name"),
                arguments=opt_str(legacy.get("arguments"), f"{where}.function_call.arguments")
                or "",
                legacy=True,
            )
        )
    return fragments


def _part_text(value: object, where: str) -> str:
    # A part's text is a string, or (Mistral's thinking parts) a list of text parts.
    if isinstance(value, list | tuple):
        return "".join(
            opt_str(part.get("text"), f"{where}[{k}].text") or ""
            for k, part in enumerate(value)
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return opt_str(value, where) or ""


def _read_content(value: object, where: str) -> list[_Piece]:
    """``delta.content``: a string, or (Mistral) a list of typed parts in order."""
    if not isinstance(value, list | tuple):
        text = opt_str(value, where)
        return [("text", text)] if text else []
    pieces: list[_Piece] = []
    for k, part in enumerate(value):
        at = f"{where}[{k}]"
        entry = opt_map(part, at)
        if entry is None:
            raise Malformed(f"{at} is null")
        kind = entry.get("type")
        if kind == "text":
            text, piece = _part_text(entry.get("text"), f"{at}.text"), "text"
        elif kind == "thinking":
            text, piece = _part_text(entry.get("thinking"), f"{at}.thinking"), "reasoning"
        else:
            # An image, a reference...: nothing the protocol's blocks carry.
            logger.info("skipping a content part of type %s in %s", log_label(kind), where)
            continue
        if text:
            pieces.append((piece, text))
    return pieces


def _read_details(value: object, where: str) -> tuple[str, list[str]]:
    """``delta.reasoning_details`` (OpenRouter, Snowflake): the reasoning's text and its
    signatures. Encrypted reasoning (``reasoning.encrypted``) has nothing a thinking
    block carries; it is skipped with a log line."""
    text: list[str] = []
    signatures: list[str] = []
    for k, entry in enumerate(opt_list(value, where) or ()):
        at = f"{where}[{k}]"
        detail = req_map(entry, at)
        kind = detail.get("type")
        if kind == "reasoning.text":
            text.append(opt_str(detail.get("text"), f"{at}.text") or "")
            signature = opt_str(detail.get("signature"), f"{at}.signature")
            if signature:
                signatures.append(signature)
        elif kind == "reasoning.summary":
            text.append(opt_str(detail.get("summary"), f"{at}.summary") or "")
        else:
            logger.info("skipping reasoning details of type %s", dotted_label(kind))
    return "".join(text), signatures


def _read_choice(choice: Mapping[str, Any], where: str) -> _Delta:
    delta = opt_map(choice.get("delta"), f"{where}.delta") or {}
    at = f"{where}.delta"
    reasoning_content = opt_str(delta.get("reasoning_content"), f"{at}.reasoning_content")
    reasoning = opt_str(delta.get("reasoning"), f"{at}.reasoning")
    details, signatures = _read_details(delta.get("reasoning_details"), f"{at}.reasoning_details")
    output: list[_Piece] = []
    # The details repeat the plain field's text where a server sends both (OpenRouter);
    # some send the details alone (Snowflake).
    if reasoning_content or reasoning or details:
        output.append(("reasoning", reasoning_content or reasoning or details))
    output.extend(("signature", signature) for signature in signatures)
    output.extend(_read_content(delta.get("content"), f"{at}.content"))
    refusal = opt_str(delta.get("refusal"), f"{at}.refusal")
    if refusal:
        output.append(("text", refusal))
    found = opt_list(delta.get("annotations"), f"{at}.annotations") or ()
    # (OpenAI's search models, OpenRouter's web search): after the chunk's text, which
    # the citations follow.
    output.extend(
        ("citation", nested_annotation(a, f"{at}.annotations[{j}]")) for j, a in enumerate(found)
    )
    audio, logprobs = delta.get("audio"), choice.get("logprobs")
    left_out: tuple[str, ...] = ()
    if audio is not None:
        left_out += ("delta.audio",)
    if logprobs is not None:
        left_out += ("logprobs",)
    return _Delta(
        output=output,
        fragments=_read_fragments(delta, at),
        finish_reason=opt_str(choice.get("finish_reason"), f"{where}.finish_reason"),
        left_out=left_out,
    )


# The error types of the Anthropic format, for an error that names only its HTTP status.
_ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def _read_error(value: object) -> ProviderStreamError | None:
    """A chunk's ``error`` (OpenRouter), or the body of an SSE ``error`` event (Groq)."""
    if value is None:
        return None
    if isinstance(value, str):
        return ProviderStreamError("api_error", "" if has_lone_surrogate(value) else value)
    error = opt_map(value, "error")
    assert error is not None
    error_type = error.get("type")
    message = error.get("message")
    code = error.get("code")
    if not isinstance(error_type, str) or not error_type or has_lone_surrogate(error_type):
        status = code if type(code) is int else error.get("status_code")
        error_type = _ERROR_TYPES.get(status, "api_error") if type(status) is int else "api_error"
    if not isinstance(message, str) or has_lone_surrogate(message):
        message = ""
    return ProviderStreamError(error_type, message)


def _read_chunk(raw: Any) -> _Chunk:
    data = as_mapping(raw, "chunk")
    error = _read_error(data.get("error"))
    model = opt_str(data.get("model"), "model")
    usage = _read_usage(data.get("usage"))
    choices = opt_list(data.get("choices"), "choices") or ()
    first: _Delta | None = None
    other = False
    for k, choice in enumerate(choices):
        where = f"choices[{k}]"
        entry = opt_map(choice, where)
        if entry is None:
            raise Malformed(f"{where} is null")
        index = opt_int(entry.get("index"), f"{where}.index")
        if (k if index is None else index) != 0:
            other = True
            continue
        if first is not None:
            raise Malformed("two choices have index 0")
        first = _read_choice(entry, where)
    return _Chunk(model=model, choice=first, other_choices=other, usage=usage, error=error)


# -- publishing one round ------------------------------------------------------------------


class _RoundReader:
    """The state of one round while its chunks are read and published.

    What the model sends goes out in the order it came, live, except what waits for an
    open tool call whose arguments are not whole yet: ``HeldCalls`` (in
    ``essessey.adapters._tool_calls``) holds it, in arrival order, and publishes it
    once they are, so that no fragment the server sent is lost.
    """

    __slots__ = (
        "_by_key",
        "_citations",
        "_left_out",
        "_open",
        "_position",
        "_skipped_choices",
        "_text",
        "_thinking",
        "error",
        "finish_reason",
        "held",
        "model",
        "rounds",
        "usage",
    )

    def __init__(self, rounds: RoundStream, id_prefix: str) -> None:
        self.rounds = rounds
        self._position = -1
        self.held: HeldCalls[_Piece] = HeldCalls(
            rounds,
            id_prefix,
            self._output,
            logger=logger,
            noun="tool call",
            where="chunk %d",
            before_start=self._call_starts,
        )
        # The kind of the last block out ("text", "reasoning"; None for a call, or none
        # yet): citations wait for a text block, a signature goes to a thinking block.
        self._open: str | None = None
        self._citations: list[dict[str, Any]] = []
        self._by_key: dict[object, HeldCall] = {}
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._skipped_choices = False
        self._left_out: set[str] = set()  # the fields named in a log line already
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.model: str | None = None
        self.error: ProviderStreamError | None = None

    def parse(self, raw: Any) -> _Chunk | None:
        """Read the next chunk; None (with a warning) when it is malformed."""
        self._position += 1
        try:
            return _read_chunk(raw)
        except Malformed as exc:
            logger.warning("skipping chat completion chunk %d: %s", self._position, exc)
            return None

    async def feed(self, raw: Any) -> None:
        """Read the next chunk and publish what it carries."""
        chunk = self.parse(raw)
        if chunk is not None:
            await self.apply(chunk)

    async def apply(self, chunk: _Chunk) -> None:
        """Publish a chunk already read by :meth:`parse`."""
        if not self.model and chunk.model:
            # The first model named: some servers (Azure) open with a chunk naming none.
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
        if choice is not None:
            for name in choice.left_out:
                if name not in self._left_out:
                    self._left_out.add(name)
                    logger.info(
                        "chunk %d carries %s (first of its round): not published",
                        self._position,
                        name,
                    )
            for piece in choice.output:
                self.held.hold(piece)
            for fragment in choice.fragments:
                await self._fragment(fragment)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
            # Once per chunk: a chunk's fragments for the open call all go out before it
            # may close for what waits.
            await self.held.advance()
        if chunk.error is not None:
            logger.warning(
                "chat completion chunk %d reports an error (%s); the stream ends there",
                self._position,
                log_label(chunk.error.error_type),
            )
            self.error = chunk.error

    async def finish(self) -> StreamedRound:
        """End of the chunks: publish what waits, then declare the round's calls."""
        await self.held.advance(final=True)
        self.held.log_late()
        if self.finish_reason is None and self.error is None and self._position >= 0:
            self._ended_unfinished()
        if self._citations:
            logger.warning(
                "%d citations came with no text after them; not published", len(self._citations)
            )
            self._citations.clear()
        await self.rounds.assistant_message(self.held.requests())
        calls = self.held.published()
        return StreamedRound(
            text="".join(self._text),
            thinking="".join(self._thinking),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            stop_reason=map_stop_reason(self.finish_reason, tool_calls=bool(calls)),
            usage=dict(self.usage),
            model=self.model,
        )

    def _ended_unfinished(self) -> None:
        """No chunk gave a ``finish_reason``: the connection may have dropped. Taken as
        the end, with a warning, unless a call's arguments are cut (not whole JSON):
        then the stream was cut short, which is a failure, never a silent success."""
        cut = [c for c in self.held.published() if c.arguments.strip() and c.input is None]
        if cut:
            logger.warning(
                "the chat completion stream ended without a finish_reason after %d chunks, "
                "%d call(s) with arguments that are not whole JSON; it ends with an error",
                self._position + 1,
                len(cut),
            )
            self.error = ProviderStreamError("api_error", CUT_STREAM)
        else:
            logger.warning(
                "the chat completion stream ended without a finish_reason after %d chunks",
                self._position + 1,
            )

    async def _output(self, piece: _Piece) -> None:
        kind, value = piece
        if kind == "text":
            await self.rounds.delta(text=value)
            self._text.append(value)
            self._open = kind
            if self._citations:
                await self._cite()
        elif kind == "reasoning":
            await self.rounds.delta(reasoning=value)
            self._thinking.append(value)
            self._open = kind
        elif kind == "signature":
            if self._open == "reasoning":
                await self.rounds.delta(signature=value)
            else:
                logger.warning("a reasoning signature came with no reasoning before it; skipped")
        else:
            self._citations.append(value)
            if self._open == "text":
                await self._cite()

    async def _cite(self) -> None:
        """The citations waiting, each a ``citations_delta`` of the open text block."""
        text = "".join(self._text)
        for given in self._citations:
            await self.rounds.raw_delta(
                {"type": "citations_delta", "citation": citation(given, text)}
            )
        self._citations.clear()

    async def _call_starts(self) -> None:
        self._open = None

    def _call_for(self, fragment: _Fragment) -> HeldCall | None:
        key: object
        calls = self.held.calls
        if fragment.legacy:
            key = "function_call"
        elif fragment.index is not None:
            key = fragment.index
        else:
            # No index: a known id continues its call, an id or a name starts the next
            # call, and bare arguments continue the last one.
            if fragment.id:
                for known in calls:
                    if known.given_id == fragment.id:
                        return known
            if not (fragment.id or fragment.name):
                return calls[-1] if calls else None
            return self._new_call()
        call = self._by_key.get(key)
        if call is None:
            call = self._by_key[key] = self._new_call()
        return call

    def _new_call(self) -> HeldCall:
        call = HeldCall(len(self.held.calls))
        self.held.add(call)
        return call

    async def _fragment(self, fragment: _Fragment) -> None:
        if not (fragment.id or fragment.name or fragment.arguments) and fragment.index is None:
            return
        call = self._call_for(fragment)
        if call is None:
            return
        if fragment.id and call.given_id is None:
            call.given_id = fragment.id
        if fragment.name and not call.name:
            call.name = fragment.name
        await self.held.fragment(call, fragment.arguments, self._position)
