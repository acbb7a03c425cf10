"""Anthropic Messages stream events in, the protocol out: a provider's stream proxied.

The Anthropic Messages API streams the protocol's own events, so a proxy's job is
mostly to keep them as they are while essessey owns the stream (its stream id, event
ids, resume). What changes on the way through:

- **Indexes.** A provider numbers each message's blocks from 0. An agent turn puts
  several provider messages, and the tool results between them, into one message, so
  the indexes are :class:`~essessey.adapters.RoundStream`'s. The provider's indexes
  still route each delta to its block; they never reach the output.
- **Empty blocks.** A text or thinking block opens on its first content (protocol rule
  2); a provider block that never gets any is not published.
- **A lost block stop.** A ``content_block_start`` while a block is open waits for the
  next event: content for the new block (or its stop, or the message's end) closes the
  open block there, with a WARNING; the open block's own stop lets it go after it; the
  open block's content means it was stray, and it is skipped.
- **Repeated call ids.** A ``tool_use`` whose id an earlier call of the message has (a
  compatible server's stream: the API's are unique) goes out under a fresh one, with a
  WARNING; the provider's stays as the call's ``given_id``.

:func:`publish` publishes one provider message as a whole message; :func:`stream_round`
publishes one provider message as a round of a turn the caller runs (with
:func:`~essessey.adapters.stream_rounds`, say), tool results and further rounds after it.

Events are dicts (parsed JSON) or the ``anthropic`` SDK's event objects; the SDK is not
imported. Objects are read with ``model_dump(mode="json", by_alias=True,
exclude_unset=True)``: fields the provider did not send stay out (a dump with defaults
would add ``citations: null`` to every text block); their keys come out in the SDK's
field order, so the JSON is the provider's but not its bytes. An event that cannot be
read, comes out of turn, or holds a value orjson cannot write back (nested past 255
levels, an integer past 64 bits) is skipped with a WARNING naming the reason and its
position in the provider's stream; payload content never reaches a log, lengths only.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from essessey import protocol
from essessey._failure import send_failure
from essessey._logsafe import log_label
from essessey.adapters._message import PublishedMessage, PublishedToolCall, parse_arguments
from essessey.adapters._publishing import publish_message, require_round
from essessey.adapters._values import (
    CallIds,
    Malformed,
    call_caller,
    fits_count,
    has_lone_surrogate,
    replace_surrogates,
)
from essessey.adapters.rounds import RoundStream, ToolCallRequest
from essessey.errors import (
    ProtocolError,
    ProviderStreamError,
    SerializationError,
)
from essessey.protocol import BlockType, DeltaType, EventType, given_blocks
from essessey.publisher import Publisher

__all__ = [
    "CUT_MESSAGE",
    "INCOMPLETE_MESSAGE",
    "ProviderStreamError",
    "StreamedMessage",
    "publish",
    "stream_round",
]

logger = logging.getLogger("essessey.adapters.anthropic")

# What a generated tool call id starts with: the provider's own prefix, as the OpenAI
# readers use OpenAI's ("call_"), so a client that looks at ids sees the usual shape.
_ID_PREFIX: Final = "toolu_"

INCOMPLETE_MESSAGE: Final = "the provider stream ended before message_stop"
"""The message of the error a stream cut short ends with."""

CUT_MESSAGE: Final = "the provider began a new message before message_stop"
"""The message of the error a message ends with when the provider began another in it."""

# The events that name a block, and those that end a message: after a held start, the
# first that names the held block, or ends the message, says the open block's stop was
# lost (see _Reader._settle).
_BLOCK_EVENTS: Final = frozenset({EventType.CONTENT_BLOCK_DELTA, EventType.CONTENT_BLOCK_STOP})
_MESSAGE_ENDS: Final = frozenset({EventType.MESSAGE_DELTA, EventType.MESSAGE_STOP, EventType.ERROR})
# What the SDK's MessageStream yields besides the raw events: conveniences derived from
# them (the text so far, a parsed citation). The raw events carry the same content.
_SDK_DERIVED_EVENTS: Final = frozenset({"text", "thinking", "signature", "input_json", "citation"})


@dataclass(slots=True)
class StreamedMessage(PublishedMessage):
    """What the adapter read from one provider message, as it went out.

    Besides :class:`~essessey.adapters.PublishedMessage`'s fields: ``signature`` (the
    last thinking block's), ``stop_sequence``, ``content`` (the published blocks as the
    provider sent them, put together: what a next request sends back as the assistant
    turn, thinking signatures included) and ``error`` (the ``error`` object that ended
    the stream, when one did; :func:`publish` then returns with ``stop_reason`` None).
    """

    signature: str | None = None
    stop_sequence: str | None = None
    content: list[dict[str, Any]] = field(default_factory=list)


def _as_payload(event: object) -> dict[str, Any] | None:
    """An event as a dict: a mapping as it is, an SDK object dumped, else None."""
    if isinstance(event, Mapping):
        return dict(event)
    dump = getattr(event, "model_dump", None)
    if not callable(dump):
        return None
    try:
        # exclude_unset keeps exactly the keys the provider sent (an SDK object records
        # which fields its JSON had); warnings off because objects the SDK built without
        # validation may hold values of other types than declared.
        payload = dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    except Exception as exc:
        logger.debug("model_dump failed: %s", type(exc).__name__)
        return None
    return payload if isinstance(payload, dict) else None


def _int_counts(usage: object) -> dict[str, int]:
    if not isinstance(usage, Mapping):
        return {}
    # A count past 64 bits (Python's json module reads any integer) cannot be written.
    return {
        key: value
        for key, value in usage.items()
        if type(value) is int and isinstance(key, str) and fits_count(value)
    }


class _Block:
    """The provider block that is open, and what became of it."""

    __slots__ = (
        "call",
        "content",
        "given_input",
        "held",
        "index",
        "json_parts",
        "kind",
        "opened",
        "start",
    )

    def __init__(self, index: int, kind: str, start: Mapping[str, Any]) -> None:
        self.index = index
        # "text", "thinking", "tool", "other", or "skip" for a block that was refused.
        self.kind = kind
        # The provider's start object as it came, and a copy that collects the content.
        self.start = dict(start)
        self.content = dict(start)
        # Whether its start went out. Until then the events that come (pings, a text
        # block's citations before its text) are held in order: none may overtake it.
        self.opened = False
        self.held: list[dict[str, Any] | None] = []
        self.json_parts: list[str] = []
        self.call = -1
        # A tool_use start's input, as JSON: the call's arguments unless deltas come,
        # which replace it (as the provider's own SDK reads them).
        self.given_input = ""


class _Stage(enum.Enum):
    """Where a reader is in the provider's message; the value says it in a skip's log
    line."""

    BEFORE_START = "before message_start"
    CONTENT = "inside the message"
    AFTER_DELTA = "after message_delta"
    STOPPED = "after message_stop"


@dataclass(slots=True)
class _HeldStop:
    """A message's stop as its message_delta(s) gave it, not yet published."""

    stop_reason: str | None
    stop_sequence: str | None
    counts: dict[str, int]
    payload: dict[str, Any] | None  # the provider's message_delta (the faithful dialect's)


class _Reader:
    """Reads one provider message into a round; in ``own`` mode also its frame events."""

    def __init__(self, rounds: RoundStream, *, own: bool, stream_id: str = "") -> None:
        self.rounds = rounds
        self.publisher = rounds.publisher
        self.own = own
        self.stream_id = stream_id
        self.faithful = rounds.publisher.dialect == protocol.ANTHROPIC
        self.result = StreamedMessage(message_id="", model="")
        self.stage = _Stage.BEFORE_START
        self.block: _Block | None = None
        # A content_block_start that came while a block was open, with its position: the
        # next event says whether the open block's stop was lost (the held block goes
        # on) or the start was stray (the open block goes on); see _settle.
        self.held_start: tuple[int, dict[str, Any]] | None = None
        self.used: set[int] = set()
        self.calls: list[ToolCallRequest] = []
        # The published ids of the round's calls: the provider's, or a fresh one for a
        # call whose id an earlier call of the message already has (made at the first
        # call, once message_start has settled which round the calls go to).
        self.ids: CallIds | None = None
        self.text_parts: list[str] = []
        self.thinking_parts: list[str] = []
        # The stop reason (and sequence) a message_start's snapshot gave, if any.
        self.given_stop: tuple[str, str | None] | None = None
        # The counts only message_start gave (cache reads and writes, a round's input,
        # ...): the end's usage carries them too, where a message_delta leaves them out.
        self.start_counts: dict[str, int] = {}
        # The message_delta's stop_details (the provider's account of its stop), if any.
        self.stop_details: dict[str, Any] | None = None
        # The message's stop, read and not yet published: it goes out at message_stop, so
        # a further message_delta (a compatible server's second, with the stop reason the
        # first left out) joins it, as the provider's SDK reads them.
        self.held_stop: _HeldStop | None = None

    @property
    def complete(self) -> bool:
        """Whether the provider's message_stop was read."""
        return self.stage is _Stage.STOPPED

    # -- the loop --------------------------------------------------------------------

    async def run(self, events: Iterable[Any] | AsyncIterable[Any]) -> None:
        position = 0
        if isinstance(events, AsyncIterable):
            async for event in events:
                await self.feed(position, event)
                position += 1
        else:
            for event in events:
                await self.feed(position, event)
                position += 1
        if self.stage is not _Stage.STOPPED:
            held = self.held_start
            if held is not None:  # the stream ended as a message's end would
                self.held_start = None
                await self._settle(held, EventType.MESSAGE_STOP, {})
            try:
                await self._send_stop()  # what was read goes out before the stream's error
            except (ProtocolError, SerializationError) as exc:
                _skip(position, EventType.MESSAGE_DELTA, f"refused ({_reason(exc)})")
            logger.warning("provider stream ended after %d events, before message_stop", position)
            raise ProviderStreamError("api_error", INCOMPLETE_MESSAGE)

    async def feed(self, position: int, event: object) -> None:
        payload = _as_payload(event)
        if payload is None:
            _skip(position, "?", f"not a mapping ({type(event).__name__})")
            return
        name = payload.get("type")
        if not isinstance(name, str):
            _skip(position, "?", "no type")
            return
        await self.feed_event(position, name, payload)

    async def feed_event(self, position: int, name: str, payload: dict[str, Any]) -> None:
        """Publish one provider event already read as a dict."""
        held = self.held_start
        if held is not None and name != EventType.PING:
            self.held_start = None
            if await self._settle(held, name, payload):
                await self._dispatch(position, name, payload)
                await self._dispatch(held[0], EventType.CONTENT_BLOCK_START, held[1])
                return
        await self._dispatch(position, name, payload)

    async def _settle(
        self, held: tuple[int, dict[str, Any]], name: str, payload: dict[str, Any]
    ) -> bool:
        """Decide what a start that came while a block was open was, by the event after
        it (``name``): True when it goes out after that event (the open block's own stop
        came late)."""
        held_position, start = held
        block = self.block
        new_index = start["index"]
        if block is None:  # no block is open any more: the held one simply starts
            return True
        index = payload.get("index") if name in _BLOCK_EVENTS else None
        if name == EventType.CONTENT_BLOCK_STOP and index == block.index:
            return True
        if index == new_index or name in _MESSAGE_ENDS:
            # The open block's stop was lost: as the provider's SDK reads such a stream,
            # both blocks hold what came for them.
            logger.warning(
                "provider block %d got no content_block_stop; closed where block %d began",
                block.index,
                new_index,
            )
            stop = {"type": EventType.CONTENT_BLOCK_STOP, "index": block.index}
            await self._dispatch(held_position, EventType.CONTENT_BLOCK_STOP, stop)
            await self._dispatch(held_position, EventType.CONTENT_BLOCK_START, start)
            return False
        stray = f"block {new_index} starts while block {block.index} is open"
        _skip(held_position, EventType.CONTENT_BLOCK_START, stray)
        return False

    async def _dispatch(self, position: int, name: str, payload: dict[str, Any]) -> None:
        """Publish one provider event, or skip it with the reason."""
        try:
            if name == EventType.CONTENT_BLOCK_DELTA:
                await self._delta(position, payload)
            elif name == EventType.CONTENT_BLOCK_START:
                await self._block_start(position, payload)
            elif name == EventType.CONTENT_BLOCK_STOP:
                await self._block_stop(position, payload)
            elif name == EventType.PING:
                await self._ping(position)
            elif name == EventType.MESSAGE_START:
                await self._message_start(position, payload)
            elif name == EventType.MESSAGE_DELTA:
                await self._message_delta(position, payload)
            elif name == EventType.MESSAGE_STOP:
                await self._message_stop(position)
            elif name == EventType.ERROR:
                await self._send_stop()  # what was read before the failure goes out
                self._error(position, payload)
            elif name in _SDK_DERIVED_EVENTS:
                logger.debug("provider event #%d (%s): derived by the SDK; skipped", position, name)
            else:
                _skip(position, name, "unknown event type")
        except (ProtocolError, SerializationError) as exc:
            # Refused by the round's layout (RoundOrderError: text after the round's tool
            # calls, a tool call id used twice), by the checker, or by the Publisher's
            # JSON writer (a value passed through that orjson cannot write: nested past
            # 255 levels, an integer past 64 bits): nothing went out.
            block = self.block
            if block is not None and not block.opened:
                # A block whose start never went out: its deltas and stop are skipped
                # quietly, this warning names the cause.
                block.kind = "skip"
            _skip(position, name, f"refused ({_reason(exc)})")

    # -- frame events ----------------------------------------------------------------

    async def _ping(self, position: int) -> None:
        if self.stage is _Stage.STOPPED:
            # Nothing follows a message's stop in what it publishes: the stream's end
            # must read as its end.
            _skip(position, EventType.PING, "the message already ended")
            return
        block = self.block
        if block is not None and not block.opened:
            block.held.append(None)
        else:
            await self.publisher.send_ping()

    async def _message_start(self, position: int, payload: dict[str, Any]) -> None:
        message = payload.get("message")
        if not isinstance(message, Mapping):
            _skip(position, EventType.MESSAGE_START, "no message object")
            return
        message_id, model = message.get("id"), message.get("model")
        if not isinstance(message_id, str) or not isinstance(model, str):
            _skip(position, EventType.MESSAGE_START, "message id or model is not a string")
            return
        if self.stage is _Stage.STOPPED or (self.stage is not _Stage.BEFORE_START and not self.own):
            if self.stage is not _Stage.STOPPED:
                # In a round of the caller's turn there is no room for a second message:
                # the first is cut, and the turn ends with the error.
                await self._cut(position)
            _skip(position, EventType.MESSAGE_START, "a message already started")
            return
        if self.stage is not _Stage.BEFORE_START:
            # A new message before the last one stopped: end that one with an error
            # (never mix two messages' blocks), then read this one as a new message.
            await self._cut(position)
            await self._restart()
        usage = _int_counts(message.get("usage"))
        if self.own:
            if self.faithful:
                # The provider's payload, key order and all, with essessey's stream id
                # where send_message_start puts it: right after the message id.
                with_id: dict[str, Any] = {}
                for key, value in message.items():
                    if key != "stream_id":
                        with_id[key] = value
                    if key == "id":
                        with_id["stream_id"] = self.stream_id
                body = {
                    key: with_id if key == "message" else value for key, value in payload.items()
                }
                await self.publisher.publish(EventType.MESSAGE_START, body)
            else:
                await self.publisher.send_message_start(
                    message_id, self.stream_id, model, input_tokens=usage.get("input_tokens", 0)
                )
        self.result.message_id = message_id
        self.result.model = model
        self.result.usage.update(usage)
        # The input count too, in a round: the turn's usage is the sum of its rounds'
        # (a message of its own said it in its own start).
        self.start_counts = {
            key: value
            for key, value in usage.items()
            if key != "output_tokens" and not (key == "input_tokens" and self.own)
        }
        self.stage = _Stage.CONTENT
        stop_reason, stop_sequence = message.get("stop_reason"), message.get("stop_sequence")
        if isinstance(stop_reason, str):
            self.given_stop = (
                stop_reason,
                stop_sequence if isinstance(stop_sequence, str) else None,
            )
        content = message.get("content")
        if isinstance(content, list) and content:
            await self._snapshot(position, content)

    async def _snapshot(self, position: int, content: list[Any]) -> None:
        """Blocks the message_start already holds (Anthropic's programmatic tool calls).

        The Anthropic SDK reads message_start's message as the snapshot it accumulates
        into, so these blocks are the message's first ones, at indexes 0..n-1. In the
        ``anthropic`` dialect they went out inside the message_start as given and the
        round's own blocks follow them; otherwise each becomes a block of the round.
        """
        if self.own and self.faithful:
            for k, block in enumerate(content):
                self.used.add(k)
                if isinstance(block, Mapping):
                    self._record_given(dict(block))
            self.rounds = RoundStream(self.publisher, start_index=len(content))
            await self.rounds.round_start()
            return
        for k, given in enumerate(given_blocks(content)):
            if given is None:
                _skip(position, EventType.MESSAGE_START, f"message.content[{k}] has no type")
                continue
            start, deltas = given
            await self.feed_event(
                position,
                EventType.CONTENT_BLOCK_START,
                {
                    "type": EventType.CONTENT_BLOCK_START,
                    "index": k,
                    "content_block": start,
                },
            )
            for delta in deltas:
                await self.feed_event(
                    position,
                    EventType.CONTENT_BLOCK_DELTA,
                    {
                        "type": EventType.CONTENT_BLOCK_DELTA,
                        "index": k,
                        "delta": delta,
                    },
                )
            await self.feed_event(
                position,
                EventType.CONTENT_BLOCK_STOP,
                {
                    "type": EventType.CONTENT_BLOCK_STOP,
                    "index": k,
                },
            )

    def _record_given(self, block: dict[str, Any]) -> None:
        # A block that went out inside message_start: counted in what publish returns.
        result = self.result
        block_type = block.get("type")
        if block_type == BlockType.TEXT and isinstance(block.get("text"), str):
            self.text_parts.append(block["text"])
        elif block_type == BlockType.THINKING and isinstance(block.get("thinking"), str):
            self.thinking_parts.append(block["thinking"])
        elif block_type == BlockType.TOOL_USE:
            given = block.get("input")
            try:
                arguments = orjson.dumps(given).decode() if given else ""
            except orjson.JSONEncodeError:
                arguments = ""
            result.tool_calls.append(
                PublishedToolCall(
                    id=str(block.get("id")),
                    name=str(block.get("name")),
                    arguments=arguments,
                    input=parse_arguments(arguments),
                    given_id=str(block.get("id")),
                )
            )
        result.content.append(block)

    async def _cut(self, position: int) -> None:
        """End the open message where a new one began: its open block closed, then an
        error event (own mode) or ProviderStreamError (in the caller's round)."""
        logger.warning(
            "provider event #%d (message_start): a new message began before message_stop; "
            "the open one ends with an error",
            position,
        )
        block = self.block
        if block is not None:
            await self._close(block)
        await self._send_stop()
        error = ProviderStreamError("api_error", CUT_MESSAGE)
        if not self.own:
            raise error
        await send_failure(self.publisher, error)
        self.result.error = {"type": error.error_type, "message": error.message}
        self.result.stop_reason = None

    async def _restart(self) -> None:
        # The next message is a message of its own: its blocks count from 0 again.
        self.rounds = RoundStream(self.publisher)
        await self.rounds.round_start()
        self.result = StreamedMessage(message_id="", model="")
        self.stage = _Stage.BEFORE_START
        self.block = None
        self.used = set()
        self.calls = []
        self.text_parts = []
        self.thinking_parts = []
        self.given_stop = None
        self.start_counts = {}
        self.stop_details = None

    async def _message_delta(self, position: int, payload: dict[str, Any]) -> None:
        held = self.held_stop
        if self.stage is not _Stage.CONTENT and held is None:
            _skip(position, EventType.MESSAGE_DELTA, self.stage.value)
            return
        delta, usage = payload.get("delta"), payload.get("usage")
        if not isinstance(delta, Mapping) or not isinstance(usage, Mapping):
            _skip(position, EventType.MESSAGE_DELTA, "no delta or usage object")
            return
        stop_reason, stop_sequence = delta.get("stop_reason"), delta.get("stop_sequence")
        if not (stop_reason is None or isinstance(stop_reason, str)) or not (
            stop_sequence is None or isinstance(stop_sequence, str)
        ):
            _skip(position, EventType.MESSAGE_DELTA, "stop_reason or stop_sequence not a string")
            return
        details = delta.get("stop_details")
        self.stop_details = dict(details) if isinstance(details, Mapping) else None
        counts = _int_counts(usage)
        if held is not None:
            # A later message_delta: its stop replaces the held one (a None too, as the
            # SDK reads it), its counts (cumulative totals) replace theirs key by key.
            logger.info(
                "provider event #%d (message_delta): another message_delta; its stop and "
                "counts join the first's",
                position,
            )
            merged = dict(payload)
            merged["usage"] = {**(held.payload or {}).get("usage", {}), **usage}
            held.stop_reason, held.stop_sequence = stop_reason, stop_sequence
            held.counts = {**held.counts, **counts}
            held.payload = merged
            return
        await self._end_output(position, stop_reason, stop_sequence, counts, payload)

    async def _end_output(
        self,
        position: int,
        stop_reason: str | None,
        stop_sequence: str | None,
        counts: dict[str, int],
        payload: dict[str, Any] | None,
    ) -> None:
        """The message's output is complete: its calls are fixed, its stop goes out.

        ``payload`` is the provider's message_delta, or None when the message_start gave
        the stop reason (then the faithful dialect has nothing to add: the start said it).
        The counts only the message_start gave join ``counts`` (the delta's win).
        """
        counts = {**self.start_counts, **counts}
        block = self.block
        if block is not None:
            logger.warning(
                "provider event #%d: block %d was still open at the end of the output; closed",
                position,
                block.index,
            )
            await self._close(block)
        await self.rounds.assistant_message(self.calls)
        self.held_stop = _HeldStop(stop_reason, stop_sequence, counts, payload)
        self.stage = _Stage.AFTER_DELTA

    async def _send_stop(self) -> None:
        """Publish the held stop (see ``held_stop``), if one is held."""
        held = self.held_stop
        if held is None:
            return
        self.held_stop = None
        stop_reason, stop_sequence, counts = held.stop_reason, held.stop_sequence, held.counts
        payload = held.payload
        if self.own:
            if self.faithful:
                if payload is not None:
                    await self.publisher.publish(EventType.MESSAGE_DELTA, payload)
            else:
                extra = {key: value for key, value in counts.items() if key != "output_tokens"}
                await self.publisher.send_message_delta(
                    stop_reason,
                    counts.get("output_tokens", 0),
                    stop_sequence=stop_sequence,
                    stop_details=self.stop_details,
                    **extra,
                )
        else:
            # For the epilogue stream_rounds sends: the turn's stop is its last round's,
            # its token counts the sum of its rounds'.
            rounds = self.rounds
            rounds.stop_reason = stop_reason
            rounds.stop_sequence = stop_sequence
            rounds.stop_details = self.stop_details
            for key, value in counts.items():
                if key == "output_tokens":
                    rounds.output_tokens += value
                else:
                    rounds.usage[key] = rounds.usage.get(key, 0) + value
        result = self.result
        result.stop_reason = stop_reason
        result.stop_sequence = stop_sequence
        result.usage.update(counts)

    async def _message_stop(self, position: int) -> None:
        if self.stage is _Stage.CONTENT and self.given_stop is not None:
            # The start gave the stop reason and no message_delta came (a message that
            # came whole in its start): its output ends here.
            stop_reason, stop_sequence = self.given_stop
            given = self.result.usage.get("output_tokens")
            counts = {} if given is None else {"output_tokens": given}
            await self._end_output(position, stop_reason, stop_sequence, counts, None)
        if self.stage is not _Stage.AFTER_DELTA:
            reason = "before message_delta" if self.stage is _Stage.CONTENT else self.stage.value
            _skip(position, EventType.MESSAGE_STOP, reason)
            return
        await self._send_stop()
        if self.own:
            await self.publisher.send_message_stop()
        self.stage = _Stage.STOPPED

    def _error(self, position: int, payload: dict[str, Any]) -> None:
        if self.stage is _Stage.STOPPED:
            _skip(position, EventType.ERROR, "the message already ended")
            return
        error = payload.get("error")
        error = error if isinstance(error, Mapping) else {}
        error_type, message = error.get("type"), error.get("message")
        request_id = payload.get("request_id")
        logger.warning(
            "provider event #%d (error): the provider's stream failed with %s",
            position,
            log_label(error_type),
        )
        self.result.error = dict(error)
        raise ProviderStreamError(
            error_type if isinstance(error_type, str) else "api_error",
            message if isinstance(message, str) else "",
            request_id if isinstance(request_id, str) else None,
        )

    # -- blocks ------------------------------------------------------------------------

    async def _block_start(self, position: int, payload: dict[str, Any]) -> None:
        name = EventType.CONTENT_BLOCK_START
        if self.stage is not _Stage.CONTENT:
            _skip(position, name, self.stage.value)
            return
        index, content_block = payload.get("index"), payload.get("content_block")
        if type(index) is not int or index < 0 or not isinstance(content_block, Mapping):
            _skip(position, name, "no index or content_block")
            return
        block_type = content_block.get("type")
        if not isinstance(block_type, str):
            _skip(position, name, f"block {index} has no type")
            return
        if index in self.used:
            _skip(position, name, f"block index {index} was used before")
            return
        if self.block is not None:
            self.held_start = (position, payload)  # see _settle
            return
        self.used.add(index)
        if block_type in (BlockType.TEXT, BlockType.THINKING):
            # Opened at its first content (protocol rule 2), wherever it comes: after
            # the round's tool calls too, since the provider's order is the truth. What
            # its start carries (its text, thinking and signature, citations) is that
            # content: it goes on as the deltas that would have carried it.
            carried = _start_content(content_block, block_type)
            self.block = _Block(index, block_type, _emptied(content_block, block_type))
            for delta in carried:
                await self._delta(position, {"index": index, "delta": delta})
            return
        # Marked skipped until the round takes it: a refusal leaves it that way.
        self.block = _Block(index, "skip", content_block)
        start = self.block.start
        if block_type == BlockType.TOOL_USE:
            call_id, tool, given = start.get("id"), start.get("name"), start.get("input")
            if not (isinstance(call_id, str) and call_id and isinstance(tool, str) and tool):
                _skip(position, name, f"tool_use block {index} has no id or name")
                return
            # A streamed tool_use starts with input {} and gets it in deltas; an input the
            # start carries is the arguments of a call that gets no deltas.
            try:
                arguments = (
                    orjson.dumps(given).decode() if isinstance(given, Mapping) and given else ""
                )
            except orjson.JSONEncodeError:
                # Parsed JSON that orjson cannot write back (nested past 255 levels, an
                # integer past 64 bits, not JSON at all): the call cannot go out.
                _skip(position, name, f"tool_use block {index} has an input not writable as JSON")
                return
            ids = self.ids
            if ids is None:
                rounds = self.rounds
                ids = self.ids = CallIds(_ID_PREFIX, rounds.next_index, rounds.call_id_used)
            published = ids.assign(call_id, len(self.calls), f"tool_use block {index}")
            self.block.content["id"] = published
            request = ToolCallRequest(
                published, tool, "", caller=_caller(start.get("caller"), position, index)
            )
            await self.rounds.tool_call_start(len(self.calls), request)
            self.block.kind = "tool"
            self.block.opened = True
            self.block.call = len(self.calls)
            self.block.given_input = arguments
            self.calls.append(request)
        else:
            await self.rounds.block_start(start)
            self.block.kind = "other"
            self.block.opened = True
            if block_type == "fallback":
                # The provider fell back to another model: the one that served the
                # response from here on, as the SDK's accumulator names it.
                served = start.get("to")
                model = served.get("model") if isinstance(served, Mapping) else None
                if isinstance(model, str) and model:
                    self.result.model = model

    async def _delta(self, position: int, payload: dict[str, Any]) -> None:
        name = EventType.CONTENT_BLOCK_DELTA
        if self.stage is not _Stage.CONTENT:
            _skip(position, name, self.stage.value)
            return
        index, delta = payload.get("index"), payload.get("delta")
        if type(index) is not int or not isinstance(delta, Mapping):
            _skip(position, name, "no index or delta object")
            return
        delta_type = delta.get("type")
        if not isinstance(delta_type, str):
            _skip(position, name, f"delta for block {index} has no type")
            return
        block = self.block
        if block is None or block.index != index:
            open_index = "none" if block is None else str(block.index)
            _skip(position, name, f"delta for block {index}, but the open block is {open_index}")
            return
        if block.kind == "skip":
            logger.debug("provider event #%d: delta of skipped block %d", position, index)
            return
        delta = dict(delta)
        if block.kind == "other":
            # Passed through whole; only a server tool's input is kept for the result.
            await self.rounds.block_delta(delta)
            chunk = delta.get("partial_json")
            if delta_type == DeltaType.INPUT_JSON and isinstance(chunk, str):
                block.json_parts.append(chunk)
            elif delta_type == "compaction_delta" and block.content.get("type") == "compaction":
                # The summary the next request sends back: the result's block holds it, as
                # the SDK's accumulator sets it from the delta.
                for key in ("content", "encrypted_content"):
                    if key in delta:
                        block.content[key] = delta[key]
            return
        allowed = protocol.DELTA_FOR_BLOCK[
            BlockType.TOOL_USE if block.kind == "tool" else block.kind
        ]
        if delta_type not in DeltaType.KNOWN:
            await self._raw(block, delta)
            if delta_type == "citations_delta" and isinstance(delta.get("citation"), Mapping):
                citations = block.content.get("citations")
                existing = citations if isinstance(citations, list) else []
                block.content["citations"] = [*existing, dict(delta["citation"])]
            return
        if delta_type not in allowed:
            _skip(position, name, f"{delta_type} does not belong in block {index} ({block.kind})")
            return
        field_name = {
            DeltaType.TEXT: "text",
            DeltaType.THINKING: "thinking",
            DeltaType.SIGNATURE: "signature",
            DeltaType.INPUT_JSON: "partial_json",
        }[delta_type]
        chunk = delta.get(field_name)
        if not isinstance(chunk, str):
            _skip(position, name, f"{delta_type} for block {index} has no string {field_name}")
            return
        if has_lone_surrogate(chunk):
            # Refused here, before it could open its block empty (see _values).
            _skip(position, name, f"{delta_type} for block {index} holds a lone surrogate")
            return
        if not chunk:
            # Nothing to add, but a faithful proxy still passes the provider's empty
            # chunk on (Anthropic opens each tool input with one); the essessey dialect
            # has no use for it, and its thinking deltas name the field otherwise.
            if self.faithful:
                await self._raw(block, delta)
            return
        if block.kind == "tool":
            if block.given_input:
                logger.info("provider block %d: its deltas replace its start's input", index)
                block.given_input = ""
            await self.rounds.tool_call_delta(block.call, chunk)
            block.json_parts.append(chunk)
            return
        await self._open(block)
        if delta_type == DeltaType.TEXT:
            await self.rounds.delta(text=chunk)
            self.text_parts.append(chunk)
            block.content["text"] = str(block.content.get("text") or "") + chunk
        elif delta_type == DeltaType.THINKING:
            await self.rounds.delta(reasoning=chunk)
            self.thinking_parts.append(chunk)
            block.content["thinking"] = str(block.content.get("thinking") or "") + chunk
        else:
            await self.rounds.delta(signature=chunk)
            self.result.signature = chunk
            block.content["signature"] = chunk

    async def _block_stop(self, position: int, payload: dict[str, Any]) -> None:
        name = EventType.CONTENT_BLOCK_STOP
        if self.stage is not _Stage.CONTENT:
            _skip(position, name, self.stage.value)
            return
        index = payload.get("index")
        block = self.block
        if type(index) is not int or block is None or block.index != index:
            open_index = "none" if block is None else str(block.index)
            # The index as sent may be anything (a string, an object): named by its type.
            shown = str(index) if type(index) is int else log_label(index)
            _skip(position, name, f"stop for block {shown}, but the open block is {open_index}")
            return
        await self._close(block)

    # -- helpers -----------------------------------------------------------------------

    async def _open(self, block: _Block) -> None:
        """Open a text or thinking block at its first content, then what it held."""
        if block.opened:
            return
        if self.faithful:
            start = block.start
        elif block.kind == BlockType.TEXT:
            start = protocol.text_block_start(self.publisher.dialect)
        else:
            start = protocol.thinking_block_start(self.publisher.dialect)
        await self.rounds.open_content(start)
        block.opened = True
        for held in block.held:
            if held is None:
                await self.publisher.send_ping()
            else:
                await self.rounds.raw_delta(held)
        block.held = []

    async def _raw(self, block: _Block, delta: dict[str, Any]) -> None:
        if block.opened:
            await self.rounds.raw_delta(delta)
        else:
            block.held.append(delta)

    async def _close(self, block: _Block) -> None:
        self.block = None
        if not block.opened:
            cited = sum(held is not None for held in block.held)
            if cited:
                # What it held for its text (citations) is lost with it: worth a warning.
                logger.warning(
                    "provider block %d (%s) had no content; it and the %d delta(s) it held "
                    "are not published",
                    block.index,
                    block.kind,
                    cited,
                )
            elif block.kind != "skip":
                # Never got content: not published (protocol rule 2).
                logger.info(
                    "provider block %d (%s) had no content; not published",
                    block.index,
                    block.kind,
                )
            # What it held goes with it, except the pings: they belong to the stream.
            for held in block.held:
                if held is None:
                    await self.publisher.send_ping()
            return
        if block.kind == "other":
            await self.rounds.block_stop()
        else:
            if block.given_input:
                await self.rounds.tool_call_delta(block.call, block.given_input)
                block.json_parts.append(block.given_input)
            await self.rounds.close_block()
        if block.kind in ("tool", "other") and block.json_parts:
            block.content["input"] = parse_arguments("".join(block.json_parts))
        if block.kind == "tool":
            arguments = "".join(block.json_parts)
            self.result.tool_calls.append(
                PublishedToolCall(
                    id=str(block.content["id"]),
                    name=str(block.content["name"]),
                    arguments=arguments,
                    input=parse_arguments(arguments),
                    given_id=str(block.start["id"]),
                )
            )
        self.result.content.append(block.content)

    def finish(self) -> StreamedMessage:
        result = self.result
        result.text = "".join(self.text_parts)
        result.thinking = "".join(self.thinking_parts)
        return result


def _emptied(start: Mapping[str, Any], block_type: str) -> dict[str, Any]:
    """A text or thinking block's start with its content taken out (see _start_content)."""
    if block_type == BlockType.TEXT:
        emptied = {**start, "text": ""}
        if start.get("citations") is not None:  # a null holds nothing, and stays as it came
            emptied["citations"] = []
        return emptied
    return {**start, "thinking": "", "signature": ""}


def _start_content(start: Mapping[str, Any], block_type: str) -> list[dict[str, Any]]:
    """The deltas that carry the content a text or thinking block's start holds (the
    API's starts hold none; an Anthropic-compatible server's may): a text block's
    citations, then its text; a thinking block's thinking, then its signature."""
    deltas: list[dict[str, Any]] = []
    if block_type == BlockType.TEXT:
        citations = start.get("citations")
        for given in citations if isinstance(citations, list) else ():
            deltas.append({"type": "citations_delta", "citation": given})
        if start.get("text"):
            deltas.append({"type": DeltaType.TEXT, "text": start["text"]})
    else:
        if start.get("thinking"):
            deltas.append({"type": DeltaType.THINKING, "thinking": start["thinking"]})
        if start.get("signature"):
            deltas.append({"type": DeltaType.SIGNATURE, "signature": start["signature"]})
    return deltas


def _caller(given: object, position: int, index: int) -> dict[str, Any] | None:
    """A programmatic call's ``caller`` (the code that made it); one that is no object
    orjson can write is left out with a warning, the call kept."""
    try:
        return call_caller(given, "tool_use")
    except Malformed:
        logger.warning(
            "provider event #%d: tool_use block %d has a caller not writable as JSON, or "
            "not an object; the call goes out without it",
            position,
            index,
        )
        return None


def _skip(position: int, name: str, reason: str) -> None:
    logger.warning("skipping provider event #%d (%s): %s", position, log_label(name), reason)


def _reason(exc: ProtocolError | SerializationError) -> str:
    # The checker's rule names are fixed strings; its details may quote ids.
    if isinstance(exc, ProtocolError) and exc.violations:
        return f"rule {exc.violations[0].rule}"
    return type(exc).__name__


async def stream_round(
    rounds: RoundStream, events: Iterable[Any] | AsyncIterable[Any]
) -> StreamedMessage:
    """Publish one provider message (``message_start`` .. ``message_stop``) as a round.

    ``rounds`` must be in a started round (:meth:`RoundStream.round_start`); the caller
    owns the message around it. Text, thinking (with its signature) and tool_use blocks
    go through the round's own calls; any other block (``redacted_thinking``, server
    tool blocks) and any delta the round does not model (``citations_delta``) pass
    through unchanged. At ``message_delta`` the round's model output ends
    (:meth:`RoundStream.assistant_message` with the message's tool calls); then send
    the results with :meth:`RoundStream.tool_result` and end the round.

    The provider's stop reason and stop sequence are set on ``rounds`` and its token
    counts added to ``rounds.output_tokens`` and ``rounds.usage``, so the epilogue of
    :func:`~essessey.adapters.stream_rounds` reports the turn's. Its ``message_start``,
    ``message_delta`` and ``message_stop`` are not published; its pings are.

    ``events`` is a sync or async iterable (a sync one is read in the event loop's
    thread). Raises :class:`ProviderStreamError` when the provider sends an ``error``
    event or its stream ends before ``message_stop``; what the iterable raises
    propagates. Either way the round is left as it was when the stream stopped.
    """
    require_round(rounds)
    reader = _Reader(rounds, own=False)
    await reader.run(events)
    return reader.finish()


async def publish(
    publisher: Publisher, events: Iterable[Any] | AsyncIterable[Any], *, stream_id: str
) -> StreamedMessage:
    """Publish one provider message as a whole message of the stream ``stream_id``.

    In the ``anthropic`` dialect the provider's events go out as they came, as parsed
    JSON, with ``stream_id`` added to ``message_start`` (so long as the provider numbers
    its blocks from 0 and sends no empty text or thinking block, indexes are its own
    too). In the ``essessey`` dialect the frame events are the dialect's own, carrying
    the provider's message id, model, stop reason and token counts.

    A tool_use block's start is the round's own (type, id, name, ``input: {}``); a field
    the provider adds to it beyond those is not carried. A message that stops for tool
    use is published without results (they belong to the next request), so its calls
    are left unanswered rather than given error results.

    When the provider sends an ``error`` event, that event is published (it ends the
    message for every client) and ``publish`` returns the message so far with ``error``
    set and ``stop_reason`` None: the stream already says what happened. A provider
    stream that ends before ``message_stop`` is treated the same, with an ``api_error``
    saying so. If ``events`` raises (or publishing fails), an ``error`` event of type
    ``api_error`` naming only the exception's class ends the stream (unless the message
    was already complete) and the exception propagates.
    """
    rounds = RoundStream(publisher)
    reader = _Reader(rounds, own=True, stream_id=stream_id)

    async def read() -> tuple[StreamedMessage, None]:
        await rounds.round_start()
        try:
            await reader.run(events)
        except ProviderStreamError as exc:
            await _publish_error(publisher, reader, exc)
        # The provider's own frame events ended the message (or its error did); the
        # round is not ended: round_end would answer the calls it has no results for.
        return reader.finish(), None

    return await publish_message(
        publisher, read, complete=lambda: reader.complete, what="the provider stream failed"
    )


async def _publish_error(publisher: Publisher, reader: _Reader, exc: ProviderStreamError) -> None:
    error: dict[str, Any] = {"type": exc.error_type, "message": exc.message}
    given = reader.result.error
    if (
        reader.faithful
        and given is not None
        and (given.get("type"), given.get("message")) == (exc.error_type, exc.message)
    ):
        # The provider's object as it came (with any field beyond type and message).
        error = given
    payload: dict[str, Any] = {"type": EventType.ERROR, "error": error}
    if exc.request_id is not None:
        payload["request_id"] = exc.request_id
    try:
        await publisher.publish(EventType.ERROR, payload)
    except SerializationError:
        # The provider's error holds what orjson cannot write (a lone surrogate, nesting
        # past 255 levels): its type and message go out alone, surrogates replaced.
        error = {
            "type": replace_surrogates(exc.error_type),
            "message": replace_surrogates(exc.message),
        }
        await publisher.publish(EventType.ERROR, {"type": EventType.ERROR, "error": error})
    reader.result.error = error
    reader.result.stop_reason = None
