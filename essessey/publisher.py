"""The Publisher: one method per protocol event, plus the composites a turn is made of.

A Publisher turns calls into :class:`~essessey.Event` objects (the payload serialised
once with orjson) and hands them to a :class:`~essessey.Sink`. With ``strict=True`` (the
default) it runs the protocol checker before every event and raises
:class:`~essessey.ProtocolError` instead of emitting one that would break a rule.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, Final, TypeAlias, cast

import orjson

from essessey import protocol
from essessey._logsafe import log_label
from essessey.check import ProtocolChecker
from essessey.errors import ProtocolError, SerializationError
from essessey.event import BatchSink, Event, EventBatch, Sink, TextDeltaSink, new_event
from essessey.protocol import (
    DIALECTS,
    TEXT_DELTA_PAYLOAD,
    DeltaType,
    Dialect,
    EventType,
    delta_template,
)

__all__ = ["Publisher", "TurnProducer"]

logger = logging.getLogger("essessey.publisher")

_PING: Final = Event(EventType.PING, b'{"type":"ping"}')
_MESSAGE_STOP: Final = Event(EventType.MESSAGE_STOP, b'{"type":"message_stop"}')


_SIGNATURE_DELTA: Final = delta_template(DeltaType.SIGNATURE, "signature")
_INPUT_JSON_DELTA: Final = delta_template(DeltaType.INPUT_JSON, "partial_json")
_TOOL_RESULT_DELTA: Final = delta_template(DeltaType.TOOL_RESULT, "text")
_USAGE_ORDER: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


def _not_text(value: object) -> SerializationError:
    """The error for a delta whose text is not a string: written as it is, a number or a
    list would reach readers as a JSON value where every reader expects text."""
    return SerializationError(f"a delta's text is a str, not a {type(value).__name__}")


def writable_text(value: object) -> bytes:
    """``value`` as a delta's JSON text, or :class:`SerializationError` when it cannot be
    one (not a str, or a lone surrogate no UTF-8 text carries): for a writer that checks
    a block's content before it opens the block, so that a refusal emits nothing."""
    if value.__class__ is not str and not isinstance(value, str):
        raise _not_text(value)
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise SerializationError(f"delta is not JSON-serialisable: {exc}") from exc


def _not_index(value: object) -> SerializationError:
    """The error for a block index that is not an int, where nothing else checks it."""
    return SerializationError(f"a block index is an int, not a {type(value).__name__}")


def writable_json(value: object) -> bytes:
    """``value`` as JSON, or :class:`SerializationError` when no JSON holds it (for a
    writer that checks a value before anything of its event goes out)."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        # orjson raises its JSONEncodeError (a TypeError); name the event, never the value.
        raise SerializationError(f"payload is not JSON-serialisable: {exc}") from exc


def _dumps(payload: Any) -> bytes:
    # orjson's bytes keep its whole working buffer (4 KiB at least) however short the
    # JSON; a stored event would carry that forever, so keep an exact-size copy.
    return bytes(memoryview(writable_json(payload)))


class Publisher:
    """Emits the protocol's events into a sink, in one of two dialects.

    ``dialect="essessey"`` writes the shapes of docs/protocol.md byte for byte;
    ``"anthropic"`` writes what the Anthropic Messages API streams, so the official SDKs
    can read it. A Publisher
    serves one stream and is meant to be driven by one task at a time.
    """

    __slots__ = (
        "_block_types",
        "_checker",
        "_debug",
        "_dialect",
        "_emit_many",
        "_emit_text",
        "_input_tokens",
        "_sink",
        "_thinking_field",
        "_thinking_template",
    )

    def __init__(self, sink: Sink, *, dialect: Dialect = "essessey", strict: bool = True) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; expected one of {sorted(DIALECTS)}")
        self._sink = sink
        self._dialect: Dialect = dialect
        self._checker: ProtocolChecker | None = ProtocolChecker() if strict else None
        self._block_types: dict[int, str] = {}
        # Whether deltas log: the level as of the stream's last other event (the block's
        # start, at the latest), which is when a block's type is noted for its lines; a
        # level check per delta would cost as much as the delta's other checks.
        self._debug = False
        self._input_tokens = 0
        self._thinking_field = protocol.thinking_delta_field(dialect)
        # The sink's capabilities, learnt once from its class (an ABC check, cached per
        # class): each event then calls the bound method stored here, or emit.
        kind = type(sink)
        self._emit_many: Callable[[EventBatch], Awaitable[None]] | None = (
            cast(BatchSink, sink).emit_many if issubclass(kind, BatchSink) else None
        )
        self._emit_text: Callable[[int, str, bytes], Awaitable[None] | None] | None = (
            cast(TextDeltaSink, sink).emit_text if issubclass(kind, TextDeltaSink) else None
        )
        self._thinking_template = delta_template(DeltaType.THINKING, self._thinking_field)

    @property
    def sink(self) -> Sink:
        """The sink events go to."""
        return self._sink

    @property
    def dialect(self) -> Dialect:
        """The payload dialect this Publisher writes."""
        return self._dialect

    @property
    def checker(self) -> ProtocolChecker | None:
        """The protocol state of this stream (open message, open block) when strict, else
        None. Read it, do not feed it: the Publisher does."""
        return self._checker

    @property
    def strict(self) -> bool:
        """Whether each event is checked against the protocol before it is emitted."""
        return self._checker is not None

    # -- the single path every event takes -------------------------------------------

    async def _send(self, name: str, payload: dict[str, Any], text_len: int = -1) -> None:
        data = _dumps(payload)
        checker = self._checker
        if checker is not None:
            # Checked on the dict we already hold, so strict mode never re-parses.
            violations = checker.accept(name, payload)
            if violations:
                raise ProtocolError(f"{name} would break the protocol: {violations[0]}", violations)
        if self._debug_now():
            self._log(name, payload, text_len)
        await self._sink.emit(new_event(Event, (name, data, None)))

    async def _send_constant(self, event: Event) -> None:
        checker = self._checker
        if checker is not None:
            payload = {"type": event.event}
            violations = checker.accept(event.event, payload)
            if violations:
                raise ProtocolError(
                    f"{event.event} would break the protocol: {violations[0]}", violations
                )
        if self._debug_now():
            logger.debug("emit %s", event.event)
        await self._sink.emit(event)

    async def _send_delta(
        self, template: bytes, index: int, delta_type: str, field: str, text: str
    ) -> None:
        """A delta's payload, checked and emitted: what every delta method but the text
        one sends (that one writes the same steps out, for its own sink method).

        The hot path: most events of a turn are deltas. The payload is written from a
        template (the same bytes orjson gives for the dict, key order included) and the
        strict check takes the checker's one-comparison fast path; the dict is built only
        to explain a refusal."""
        if text.__class__ is not str and not isinstance(text, str):
            raise _not_text(text)
        try:
            data = template % (index, orjson.dumps(text))
        except TypeError as exc:
            raise SerializationError(f"delta is not JSON-serialisable: {exc}") from exc
        checker = self._checker
        if checker is not None and not checker.accept_delta(index, delta_type, bool(text)):
            self._check_delta(checker, index, delta_type, field, text)
        if self._debug:
            self._log_delta(index, text)
        await self._sink.emit(new_event(Event, (EventType.CONTENT_BLOCK_DELTA, data, None)))

    def _check_delta(
        self, checker: ProtocolChecker, index: int, delta_type: str, field: str, text: str
    ) -> None:
        """A delta the checker's fast path did not take: checked whole, raising
        :class:`~essessey.ProtocolError` saying why when it breaks a rule."""
        payload = {
            "type": EventType.CONTENT_BLOCK_DELTA,
            "index": index,
            "delta": {"type": delta_type, field: text},
        }
        violations = checker.accept(EventType.CONTENT_BLOCK_DELTA, payload)
        if violations:
            raise ProtocolError(
                f"content_block_delta would break the protocol: {violations[0]}", violations
            )

    def _log_delta(self, index: int, text: str) -> None:
        logger.debug(
            "emit content_block_delta index=%s block=%s delta_len=%s",
            index,
            self._block_types.get(index),
            len(text),
        )

    def _debug_now(self) -> bool:
        """Whether this event logs, noted for the deltas that follow it."""
        debug = self._debug = logger.isEnabledFor(logging.DEBUG)
        return debug

    def _log(self, name: str, payload: dict[str, Any], text_len: int) -> None:
        # Names, indexes and lengths only: payload content never reaches a log.
        index = payload.get("index")
        block = payload.get("content_block")
        if isinstance(block, dict) and isinstance(index, int):
            # A pass-through block's type is the provider's string: logged if it is a word.
            self._block_types[index] = log_label(block.get("type"))
        block_type = self._block_types.get(index) if isinstance(index, int) else None
        logger.debug(
            "emit %s index=%s block=%s delta_len=%s",
            name,
            index,
            block_type,
            text_len if text_len >= 0 else None,
        )

    # -- one method per protocol event -----------------------------------------------
    #
    # The other delta methods are plain functions returning the coroutine of
    # _send_delta: awaiting them is the same as awaiting an ``async def``, one coroutine
    # frame fewer. Nothing runs until the result is awaited.

    async def send_message_start(
        self, message_id: str, stream_id: str, model: str, *, input_tokens: int = 0
    ) -> None:
        """Open a message. ``stream_id`` is echoed to clients; essessey never mints one."""
        for field, value in (
            ("message_id", message_id),
            ("stream_id", stream_id),
            ("model", model),
        ):
            if not isinstance(value, str):
                raise TypeError(f"{field} must be a str, not a {type(value).__name__}")
        if type(input_tokens) is not int:
            raise TypeError(f"input_tokens must be an int, not a {type(input_tokens).__name__}")
        await self._send(
            EventType.MESSAGE_START,
            {
                "type": EventType.MESSAGE_START,
                "message": {
                    "id": message_id,
                    "stream_id": stream_id,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 0},
                },
            },
        )
        # Only once the event went out: a refused message_start must not change the
        # input_tokens the open message's message_delta reports.
        self._input_tokens = input_tokens

    async def send_ping(self) -> None:
        """A keep-alive event; allowed anywhere in a stream."""
        await self._send_constant(_PING)

    async def send_content_block_start_text(self, index: int) -> None:
        """Open a text block at ``index``."""
        await self._send(
            EventType.CONTENT_BLOCK_START,
            {
                "type": EventType.CONTENT_BLOCK_START,
                "index": index,
                "content_block": protocol.text_block_start(self._dialect),
            },
        )

    async def send_content_block_delta_text(self, index: int, text: str) -> None:
        """Append answer text to the text block at ``index``."""
        # Nearly every event of a turn: _send_delta's steps written out, with the
        # checker's text path. A sink that takes text deltas (emit_text) takes one
        # without a coroutine of its own when it can write it at once.
        if text.__class__ is not str and not isinstance(text, str):
            raise _not_text(text)
        try:
            text_json = orjson.dumps(text)
        except TypeError as exc:
            raise SerializationError(f"delta is not JSON-serialisable: {exc}") from exc
        checker = self._checker
        if checker is not None:
            if not checker.accept_text_delta(index, text != ""):
                self._check_delta(checker, index, DeltaType.TEXT, "text", text)
        elif index.__class__ is not int and not isinstance(index, int):
            # Unchecked, the index still goes into the payload as a number.
            raise _not_index(index)
        if self._debug:
            self._log_delta(index, text)
        emit_text = self._emit_text
        if emit_text is None:
            data = TEXT_DELTA_PAYLOAD % (index, text_json)
            await self._sink.emit(new_event(Event, (EventType.CONTENT_BLOCK_DELTA, data, None)))
            return
        pending = emit_text(index, text, text_json)
        if pending is not None:
            await pending

    async def send_content_block_deltas_text(self, index: int, texts: Iterable[str]) -> None:
        """Append several chunks of answer text to the text block at ``index`` at once.

        The same events as one :meth:`send_content_block_delta_text` per chunk, in
        order, for when many are ready together (a buffered upstream, a replayed
        model): the chunks are checked together and handed to the sink in one call when
        it takes many (``emit_many``). Raises as the single call would, before any of
        them is emitted (a refused or unserialisable chunk: nothing goes out).
        """
        chunks = texts if isinstance(texts, list) else list(texts)
        if not chunks:
            return
        for text in chunks:
            if text.__class__ is not str and not isinstance(text, str):
                raise _not_text(text)
        if index.__class__ is not int and not isinstance(index, int):
            raise _not_index(index)  # before the template is filled with it
        dumps = orjson.dumps
        # The template's two halves around the text, for this index: a concatenation per
        # chunk instead of a %-format.
        head, tail = (TEXT_DELTA_PAYLOAD % (index, b"\0")).split(b"\0")
        try:
            datas = [head + dumps(text) + tail for text in chunks]
        except TypeError as exc:
            raise SerializationError(f"delta is not JSON-serialisable: {exc}") from exc
        checker = self._checker
        if checker is not None and not checker.accept_deltas(
            index, DeltaType.TEXT, len(chunks), any(chunks)
        ):
            # Not plainly fine: the first chunk through the single path says why.
            for text in chunks:
                await self.send_content_block_delta_text(index, text)
            return
        if self._debug:
            logger.debug(
                "emit %d content_block_delta index=%s block=%s delta_len=%s",
                len(chunks),
                index,
                self._block_types.get(index),
                sum(map(len, chunks)),
            )
        events = EventBatch(EventType.CONTENT_BLOCK_DELTA, datas, block_index=index, texts=chunks)
        emit_many = self._emit_many
        if emit_many is not None:
            await emit_many(events)
            return
        emit = self._sink.emit
        for event in events:
            await emit(event)

    async def send_content_block_start_thinking(self, index: int) -> None:
        """Open a thinking (reasoning) block at ``index``."""
        await self._send(
            EventType.CONTENT_BLOCK_START,
            {
                "type": EventType.CONTENT_BLOCK_START,
                "index": index,
                "content_block": protocol.thinking_block_start(self._dialect),
            },
        )

    def send_content_block_delta_thinking(self, index: int, text: str) -> Coroutine[Any, Any, None]:
        """Append reasoning to the thinking block at ``index``."""
        return self._send_delta(
            self._thinking_template, index, DeltaType.THINKING, self._thinking_field, text
        )

    def send_signature_delta(self, index: int, signature: str) -> Coroutine[Any, Any, None]:
        """Attach a provider's signature to the thinking block at ``index``."""
        return self._send_delta(
            _SIGNATURE_DELTA, index, DeltaType.SIGNATURE, "signature", signature
        )

    async def send_content_block_stop(self, index: int) -> None:
        """Close the block at ``index``."""
        await self._send(
            EventType.CONTENT_BLOCK_STOP,
            {"type": EventType.CONTENT_BLOCK_STOP, "index": index},
        )

    async def send_tool_use_start(
        self,
        index: int,
        tool_use_id: str,
        name: str,
        *,
        item_type: str | None = None,
        caller: Mapping[str, Any] | None = None,
    ) -> None:
        """Open a tool call block; its arguments follow as input deltas. ``item_type``:
        the provider's own type for a call that is not a plain function call;
        ``caller``: what made the call, when the model did not
        (``protocol.tool_use_block_start``)."""
        if not isinstance(tool_use_id, str) or not tool_use_id:
            raise ValueError("a tool call needs an id: a non-empty str")
        block = protocol.tool_use_block_start(tool_use_id, name, item_type=item_type, caller=caller)
        await self._send(
            EventType.CONTENT_BLOCK_START,
            {"type": EventType.CONTENT_BLOCK_START, "index": index, "content_block": block},
        )

    def send_tool_input_delta(self, index: int, partial_json: str) -> Coroutine[Any, Any, None]:
        """Append a fragment of the tool call's JSON arguments."""
        return self._send_delta(
            _INPUT_JSON_DELTA, index, DeltaType.INPUT_JSON, "partial_json", partial_json
        )

    async def send_tool_result_start(
        self, index: int, tool_use_id: str, *, is_error: bool = False
    ) -> None:
        """Open the result block of the tool call ``tool_use_id``."""
        await self._send(
            EventType.CONTENT_BLOCK_START,
            {
                "type": EventType.CONTENT_BLOCK_START,
                "index": index,
                "content_block": protocol.tool_result_block_start(tool_use_id, is_error=is_error),
            },
        )

    def send_tool_result_delta(self, index: int, text: str) -> Coroutine[Any, Any, None]:
        """Append a fragment of a tool's result."""
        return self._send_delta(_TOOL_RESULT_DELTA, index, DeltaType.TOOL_RESULT, "text", text)

    async def send_message_delta(
        self,
        stop_reason: str | None,
        output_tokens: int,
        *,
        stop_sequence: str | None = None,
        stop_details: Mapping[str, Any] | None = None,
        **usage: int,
    ) -> None:
        """Say why the message stopped, with its usage.

        ``stop_details`` is the provider's account of the stop beside its reason (the
        Anthropic API's ``stop_details``, such as a refusal's category), carried in the
        delta as given. Extra keyword arguments are usage counts (``input_tokens``,
        ``cache_read_input_tokens``, ``cache_creation_input_tokens``, ...). The anthropic
        dialect always reports ``input_tokens`` (from message_start when not given),
        because its clients read final usage from this event.
        """
        for key, value in (("output_tokens", output_tokens), *usage.items()):
            if type(value) is not int:
                raise TypeError(f"usage count {key!r} must be an int")
        for field, given in (("stop_reason", stop_reason), ("stop_sequence", stop_sequence)):
            if given is not None and not isinstance(given, str):
                raise TypeError(f"{field} must be a str or None, not a {type(given).__name__}")
        if self._dialect == protocol.ANTHROPIC:
            counts: dict[str, int] = {"input_tokens": usage.pop("input_tokens", self._input_tokens)}
            for key in _USAGE_ORDER[1:]:
                if key in usage:
                    counts[key] = usage.pop(key)
            counts.update(usage)
            counts["output_tokens"] = output_tokens
        else:
            counts = {"output_tokens": output_tokens, **usage}
        delta: dict[str, Any] = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        if stop_details is not None:
            delta["stop_details"] = dict(stop_details)
        await self._send(
            EventType.MESSAGE_DELTA,
            {"type": EventType.MESSAGE_DELTA, "delta": delta, "usage": counts},
        )

    async def send_message_stop(self) -> None:
        """Close the message; a new message_start may follow."""
        await self._send_constant(_MESSAGE_STOP)

    async def send_error(
        self, error_type: str, message: str, *, request_id: str | None = None
    ) -> None:
        """Tell clients the stream failed; it ends the open message (if any)."""
        payload: dict[str, Any] = {
            "type": EventType.ERROR,
            "error": {"type": error_type, "message": message},
        }
        if request_id is not None:
            payload["request_id"] = request_id
        await self._send(EventType.ERROR, payload)

    async def publish(self, event_type: str, payload: Mapping[str, Any]) -> None:
        """Emit a custom event (or a protocol event built by hand).

        ``payload["type"]`` is set to ``event_type`` when missing. Protocol events still
        pass the strict checker; unknown events pass through.
        """
        if not isinstance(event_type, str):
            raise TypeError(f"event_type must be a str, not a {type(event_type).__name__}")
        if not event_type or any(c in event_type for c in "\r\n\0"):
            raise ValueError("event_type must be a non-empty name without CR, LF or NUL")
        if not event_type.isascii():
            try:
                event_type.encode()
            except UnicodeEncodeError:  # a lone surrogate: no transport could write it
                raise ValueError("event_type must be text UTF-8 can write") from None
        body = dict(payload)
        body.setdefault("type", event_type)
        await self._send(event_type, body)

    # -- composites ------------------------------------------------------------------

    async def send_stream_preamble(
        self, message_id: str, stream_id: str, model: str, *, input_tokens: int = 0
    ) -> None:
        """``message_start`` then ``ping``: how every turn begins."""
        async with _step("send_stream_preamble", "message_start"):
            await self.send_message_start(message_id, stream_id, model, input_tokens=input_tokens)
        async with _step("send_stream_preamble", "ping"):
            await self.send_ping()

    async def send_stream_epilogue(
        self,
        stop_reason: str | None,
        output_tokens: int,
        *,
        stop_sequence: str | None = None,
        stop_details: Mapping[str, Any] | None = None,
        **usage: int,
    ) -> None:
        """``message_delta`` then ``message_stop``: how every turn ends."""
        async with _step("send_stream_epilogue", "message_delta"):
            await self.send_message_delta(
                stop_reason,
                output_tokens,
                stop_sequence=stop_sequence,
                stop_details=stop_details,
                **usage,
            )
        async with _step("send_stream_epilogue", "message_stop"):
            await self.send_message_stop()

    async def send_tool_use_block(
        self, index: int, tool_use_id: str, name: str, input_json: str | Mapping[str, Any]
    ) -> None:
        """A whole tool call block: start, its arguments in one delta, stop.

        ``input_json`` is the arguments as JSON text, or a mapping to serialise (done
        before anything is emitted, so a bad mapping emits nothing).
        """
        async with _step("send_tool_use_block", "input_json"):
            if isinstance(input_json, Mapping):
                arguments = _dumps(input_json).decode()
            else:
                writable_text(input_json)  # before the block opens: a refusal emits nothing
                arguments = input_json
        async with _step("send_tool_use_block", "content_block_start"):
            await self.send_tool_use_start(index, tool_use_id, name)
        if arguments:
            async with _step("send_tool_use_block", "content_block_delta"):
                await self.send_tool_input_delta(index, arguments)
        async with _step("send_tool_use_block", "content_block_stop"):
            await self.send_content_block_stop(index)

    async def send_tool_result_block(
        self, index: int, tool_use_id: str, text: str, *, is_error: bool = False
    ) -> None:
        """A whole tool result block: start, the result in one delta (if any), stop."""
        writable_text(text)  # before the block opens: a refusal emits nothing
        async with _step("send_tool_result_block", "content_block_start"):
            await self.send_tool_result_start(index, tool_use_id, is_error=is_error)
        if text:
            async with _step("send_tool_result_block", "content_block_delta"):
                await self.send_tool_result_delta(index, text)
        async with _step("send_tool_result_block", "content_block_stop"):
            await self.send_content_block_stop(index)

    async def send_approval_request(
        self,
        index: int,
        request_id: str,
        tool_use_id: str,
        *,
        reason: str | None = None,
        expires_at: int | None = None,
    ) -> None:
        """A whole ``approval_request`` block: the message asks its client to approve
        its call ``tool_use_id`` (docs/asking.md)."""
        block = protocol.approval_request_block_start(
            request_id, tool_use_id, reason=reason, expires_at=expires_at
        )
        await self._send_whole_block("send_approval_request", index, block)

    async def send_question(
        self,
        index: int,
        request_id: str,
        question: str,
        *,
        schema: Mapping[str, Any] | None = None,
        expires_at: int | None = None,
        tool_use_id: str | None = None,
    ) -> None:
        """A whole ``question`` block: the message asks its client ``question``
        (``tool_use_id``: asked by that call's run, whose result waits for the answer)."""
        block = protocol.question_block_start(
            request_id, question, schema=schema, expires_at=expires_at, tool_use_id=tool_use_id
        )
        await self._send_whole_block("send_question", index, block)

    async def send_approval_response(
        self, index: int, request_id: str, approved: bool, *, reason: str | None = None
    ) -> None:
        """A whole ``approval_response`` block: the record of an approval's answer."""
        block = protocol.approval_response_block_start(request_id, approved, reason=reason)
        await self._send_whole_block("send_approval_response", index, block)

    async def send_answer(self, index: int, request_id: str, value: Any) -> None:
        """A whole ``answer`` block: the record of a question's answer (any JSON)."""
        block = protocol.answer_block_start(request_id, value)
        await self._send_whole_block("send_answer", index, block)

    async def _send_whole_block(self, composite: str, index: int, block: dict[str, Any]) -> None:
        async with _step(composite, "content_block_start"):
            await self._send(
                EventType.CONTENT_BLOCK_START,
                {"type": EventType.CONTENT_BLOCK_START, "index": index, "content_block": block},
            )
        async with _step(composite, "content_block_stop"):
            await self.send_content_block_stop(index)


class _step:
    """Adds "which composite, which step" to an exception without changing its type."""

    __slots__ = ("_composite", "_step")

    def __init__(self, composite: str, step: str) -> None:
        self._composite = composite
        self._step = step

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception):
            exc.add_note(f"{self._composite} stopped at its {self._step} step")


TurnProducer: TypeAlias = Callable[[Publisher], Awaitable[None]]
"""An async function that publishes one turn through the Publisher it is given: what
``StreamHub.start`` runs, and what an ``EventStreamResponse`` streams."""
