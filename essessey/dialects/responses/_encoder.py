"""The responses dialect's encoder: the protocol's events as its frames (see the package)."""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import orjson

from essessey.dialects._payload import (
    QUESTION_TOOL,
    TurnUsage,
    call_arguments,
    message_delta_totals,
)
from essessey.dialects.base import DialectEncoder
from essessey.event import Event
from essessey.protocol import BlockType, DeltaType, StopReason
from essessey.protocol.asking import AskReader, ClientToolCall, Waiting

__all__ = ["APPROVAL_SERVER_LABEL", "DEFAULT_MAX_BUFFER", "ResponsesEncoder", "error_object"]

logger = logging.getLogger("essessey.dialects.responses")

DEFAULT_MAX_BUFFER: Final = 16 * 1024 * 1024
"""Bytes of one output item's content held until its stop (the ``done`` events repeat it
whole)."""


_TEXT_DELTA: Final = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":%%d,"item_id":%b,'
    b'"output_index":%d,"content_index":0,"delta":%%b,"logprobs":[]}\n\n'
)
"""A text delta's event, as ``_emit`` writes it: filled once per text item with its id
and index (``_Item.text_frame``), then per delta with its number and text."""
APPROVAL_SERVER_LABEL: Final = "essessey"
"""The ``server_label`` of an ``mcp_approval_request`` item written for an approval
request whose call names no ``server_label`` of its own."""


def client_calls(asked: Waiting | None) -> frozenset[str]:
    """The client calls of what ``asked`` asks: the ``tool_result`` blocks of these that
    open a continuation record the client's outputs."""
    if asked is None:
        return frozenset()
    return frozenset(r.id for r in asked.requests if isinstance(r, ClientToolCall))


def error_object(error_type: str, message: str) -> bytes:
    """The JSON of an error as OpenAI answers one (``{"error": {...}}``)."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    )


class _Item:
    __slots__ = (
        "annotations",
        "block",
        "closed",
        "deltas",
        "held",
        "id",
        "id_json",
        "kind",
        "output_index",
        "parts",
        "signature",
        "size",
        "summaries",
        "text_frame",
    )

    def __init__(self, kind: str, item_id: str, output_index: int, block: dict[str, Any]) -> None:
        self.kind = kind
        self.id = item_id
        self.id_json = orjson.dumps(item_id)  # for the frames spliced without a dict
        self.output_index = output_index
        self.block = block
        self.parts: list[str] = []
        self.deltas: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        self.signature: str | None = None
        # A reasoning item of summary parts: the parts done so far (None: not one).
        self.summaries: list[str] | None = None
        self.size = 0
        self.held = False  # a call held until its round's approvals are known
        self.closed = False  # a held call whose block has stopped
        # A text item's delta frame, all but the number and the text filled in.
        self.text_frame = (
            _TEXT_DELTA % (self.id_json, output_index) if kind == BlockType.TEXT else None
        )


_INCOMPLETE: Final[dict[str, str]] = {
    StopReason.MAX_TOKENS: "max_output_tokens",
    StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED: "max_output_tokens",
    StopReason.REFUSAL: "content_filter",
}
"""The stop reasons that end a response ``incomplete``, and its ``incomplete_details``
reason; a cancelled turn ends ``cancelled``, any other ``completed``."""


_ANNOTATION_TYPES: Final = frozenset(
    {"url_citation", "file_citation", "container_file_citation", "file_path"}
)
"""The Responses API's own annotation types: a citation of one of them goes out as given."""


def _annotation(citation: object) -> dict[str, Any] | None:
    """A text block's citation as a Responses annotation: one of its own types as given,
    a web search result with its span (as the Responses adapter writes a
    ``url_citation``) as a ``url_citation``; None for any other."""
    if not isinstance(citation, dict):
        return None
    kind = citation.get("type")
    if kind in _ANNOTATION_TYPES:
        return citation
    start, end = citation.get("start_index"), citation.get("end_index")
    if kind == "web_search_result_location" and type(start) is int and type(end) is int:
        return {
            "type": "url_citation",
            "start_index": start,
            "end_index": end,
            "title": str(citation.get("title") or ""),
            "url": str(citation.get("url") or ""),
        }
    return None


_HOSTED_ITEM_TYPES: Final = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_call",
        "mcp_list_tools",
        "tool_search_call",
        "tool_search_output",
        "shell_call",
        "shell_call_output",
        "custom_tool_call",
        "x_search_call",
        "code_execution_call",
        "view_image_call",
        "view_x_video_call",
        "program",
        "program_output",
    }
)
"""The Responses API items of a tool the provider ran itself: a ``server_tool_use`` block
whose ``item_type`` names one, and its result block carrying the item, are written back
as that item."""

_HOSTED_CALL: Final = "hosted-call"
"""The kind of an open ``server_tool_use`` block whose item its result block writes."""

_QUIET: Final = "quiet"
"""The kind of an open block that writes nothing: an approval request (written with its
round's calls), a question (written whole at its start), the record of an answer."""

_GATED: Final = "gated"
"""The kind of a call an approval request holds back: not the client's to run."""

_CALLERS: Final = frozenset({"program", "direct"})
"""The Responses API's own kinds of a function call's ``caller``: a tool_use block's
``caller`` of one of them is written back on its ``function_call`` item (another
provider's, such as Anthropic's code execution, means nothing there)."""

_COMPACTION: Final = "compaction"
"""A ``compaction`` block (the conversation compacted, as the Anthropic format and the
Responses adapter publish it): written back as a ``compaction`` item."""

_CLIENT_ITEM_TYPES: Final = frozenset(
    {
        "custom_tool_call",
        "apply_patch_call",
        "shell_call",
        "local_shell_call",
        "tool_search_call",
        "computer_call",
        "mcp_approval_request",
    }
)
"""The Responses API items, besides ``function_call``, that are calls the client answers:
a tool_use block whose ``item_type`` names one is written back as that item."""


def _client_item_type(block: dict[str, Any]) -> str | None:
    item_type = block.get("item_type")
    return item_type if item_type in _CLIENT_ITEM_TYPES else None


class ResponsesEncoder(DialectEncoder):
    """One turn's protocol events, in order, as Responses stream events (a
    :class:`~essessey.bindings.sse.FrameEncoder`).

    ``response_id`` names the response (``resp_...``), ``model`` fills its ``model``
    until the turn's first message names one. ``max_buffer`` bounds the bytes of one item
    held for its ``done`` events.

    A turn that asks (docs/asking.md): an approval request is an ``mcp_approval_request``
    item, and the call it gates is not written (a client would run it); so a round's
    calls (and its results) are held until the block after them that is none of a call,
    a result and an approval request (or the message's end), then written, each call's
    events at once. A question
    is a ``function_call`` of ``ask_user``. The response ends ``completed`` with the
    message that asks. ``after`` makes it the response that continues the turn after
    that event (the asking message's last): the events up to it are read, not written,
    and the records of the client's answers that open the continuation are not written
    either (the client sent them).
    """

    log = logger

    def __init__(
        self,
        response_id: str,
        *,
        model: str = "essessey",
        created_at: int | None = None,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        after: str | None = None,
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.response_id = response_id
        self.model = model
        self.created_at = int(time.time()) if created_at is None else created_at
        self.max_buffer = max_buffer
        self.sequence_number = 0
        """The sequence number the next event gets."""
        self._started = False
        self.ended = False
        self._items: dict[int, _Item] = {}  # open blocks, by block index
        # A reasoning item of summary parts whose last part ended, unsigned: the block
        # at ``_reasoning_next``, if it is a summary part too, is its next part.
        self._reasoning: _Item | None = None
        self._reasoning_next = -1
        self._output: list[dict[str, Any]] = []  # done items, for the final response
        self._next_output = 0
        self._stop_reason: str | None = None
        self._usage = TurnUsage()
        self._final: dict[str, Any] = {}
        self._records: frozenset[str] = frozenset()  # client calls the answers record
        self._asked = AskReader()  # what the turn asked, read up to ``after``
        self.start_after(after)
        # The message's calls held until their round's approvals are known (items), and
        # its approval requests (blocks), in order; the calls those gate.
        self._queue: list[_Item | dict[str, Any]] = []
        self._gated: set[str] = set()
        self._calls: dict[str, _Item] = {}  # the message's calls, by id
        # The last message's calls left without a result: a message that continues it
        # may ask to approve one again (a call let run that asks before it ends).
        self._earlier: dict[str, _Item] = {}
        self._results: set[str] = set()  # the calls the message gives results of
        self._asks = False  # the message asks for an approval or an answer

    # -- FrameEncoder --------------------------------------------------------------------

    def read_before(self, event: Event) -> None:
        """An event up to ``after``: read for what the turn asked, nothing written."""
        self._asked.feed(event)

    def reached_after(self) -> None:
        """The answers' records name the client calls the turn asked: not written."""
        self._records = client_calls(self._asked.waiting())

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """One ``response.output_text.delta`` of ``text`` for block ``index``; None when
        that is not an open text block."""
        item = None if self.ended else self._items.get(index)
        if item is None or (frame := item.text_frame) is None:
            return None
        size = item.size + len(text)
        if size <= self.max_buffer:
            # _hold's common case, inline: this runs once per token.
            item.size = size
            item.parts.append(text)
        else:
            self._hold(item, text)
        number = self.sequence_number
        self.sequence_number = number + 1
        return frame % (number, text_json)

    def finish(self) -> bytes:
        """The response's end if no message ended it yet."""
        if self.ended:
            return b""
        frames = []
        if not self._started:
            frames += self._start({})
        frames += self._close_open()
        frames += self._release()
        frames += self._end()
        return b"".join(frames)

    def _close_open(self) -> list[bytes]:
        """The done events of the items still open (a stream that ended, or failed,
        inside its message): the response's output holds what they got, and a client
        that accumulates the events finds no item unfinished at the response's end."""
        frames: list[bytes] = []
        for index in sorted(self._items):
            frames += self.on_block_stop(index)
        return frames

    def fail(self, error_type: str, message: str) -> bytes:
        """``error`` then ``response.failed``."""
        if self.ended:
            return b""
        frames = self._close_open() + self._release() if self._started else self._start({})
        return b"".join(frames + self._failed(error_type, message))

    def response(self) -> dict[str, Any]:
        """The response as the events so far make it: ``completed`` (or how it ended)
        with every output item and the usage once the turn ended, ``in_progress``
        before. What a request without ``stream`` is answered with."""
        if not self.ended:
            return self._response("in_progress")
        return self._final

    # -- writing -------------------------------------------------------------------------

    def _emit(self, kind: str, body: dict[str, Any]) -> list[bytes]:
        number = self.sequence_number
        self.sequence_number += 1
        data = orjson.dumps({"type": kind, "sequence_number": number, **body})
        return [b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"]

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        counts = self._usage
        prompt, output = counts.prompt_tokens, counts.output_tokens
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {
                "cached_tokens": counts.count("cache_read_input_tokens"),
                "cache_write_tokens": counts.count("cache_creation_input_tokens"),
            },
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": counts.count("reasoning_tokens")},
            "total_tokens": prompt + output,
        }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": list(self._output) if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "usage": usage if status != "in_progress" else None,
            **extra,
        }

    # -- the events ----------------------------------------------------------------------

    # -- the hooks (essessey.dialects.base) -------------------------------------------------

    def in_message(self) -> bool:
        """Whether the turn's first message started the response."""
        return self._started

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """``response.created`` and ``response.in_progress``, for the first message only."""
        return self._start(message)

    def on_error(self, error: Any) -> list[bytes]:
        """``response.failed`` (after the response's start when nothing started it)."""
        frames = self._close_open() + self._release() if self._started else self._start({})
        kind = str(error.get("type") or "api_error")
        return frames + self._failed(kind, str(error.get("message") or ""))

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """The calls held (the message ends); the stop reason and usage go into the
        response's end."""
        reason, _ = message_delta_totals(payload)
        if reason is not None:
            self._stop_reason = reason
        self._usage.message_delta(payload)
        return self._release()

    def on_message_stop(self) -> list[bytes]:
        """The response's end, unless the turn goes on (tool use, the message asking
        nothing: its calls have their results)."""
        frames = self._release()
        reason = self._stop_reason
        if reason is None:
            return frames
        if reason != StopReason.TOOL_USE or self._message_asks():
            return frames + self._end()
        return frames

    def _message_asks(self) -> bool:
        """Whether the message waits for its client: an approval, a question, a call
        without a result."""
        return self._asks or any(call not in self._results for call in self._calls)

    def _start(self, message: dict[str, Any]) -> list[bytes]:
        frames = self._release()
        self._items.clear()
        self._earlier = {k: v for k, v in self._calls.items() if k not in self._results}
        self._calls.clear()
        self._results.clear()
        self._gated.clear()
        self._asks = False
        self._stop_reason = None
        self._usage.message_start(message)
        if self._started:
            return frames  # the next round of the same turn: one response
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
        response = self._response("in_progress")
        return self._emit("response.created", {"response": response}) + self._emit(
            "response.in_progress", {"response": response}
        )

    def _place(self, prefix: str) -> tuple[str, int]:
        output_index = self._next_output
        self._next_output += 1
        return f"{prefix}_{self.response_id}_{output_index}", output_index

    def _open(self, kind: str, prefix: str, index: int, block: dict[str, Any]) -> _Item:
        item_id, output_index = self._place(prefix)
        item = _Item(kind, item_id, output_index, block)
        self._items[index] = item
        return item

    def on_block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
        """An output item's start (and its first part's), by the block's kind; a call,
        a result after it and an approval request are held (see the class)."""
        # A block is written whole later (its done item, the response's output): one no
        # JSON writer can write (nested past 255 levels) is refused here, not there.
        orjson.dumps(block)
        kind = str(block.get("type"))
        pending = self._reasoning
        if pending is not None:
            if _is_summary(block) and index == self._reasoning_next:
                return self._next_summary(index, pending)
            return self._finish_reasoning() + self.on_block_start(index, block)
        if kind == BlockType.TOOL_USE:
            return self._hold_call(index, block)
        if kind == BlockType.APPROVAL_REQUEST:
            self._items[index] = _Item(_QUIET, "", -1, block)
            self._asks = True
            self._queue.append(block)
            self._gated.add(str(block["tool_use_id"]))
            return []
        is_record = str(block.get("tool_use_id")) in self._records
        if kind == BlockType.TOOL_RESULT and self._queue and not is_record:
            # A result of the round held: its calls' items come first.
            self._results.add(str(block.get("tool_use_id")))
            item = self._items[index] = _Item(kind, "", -1, block)
            item.held = True
            self._queue.append(item)
            return []
        if kind == BlockType.QUESTION and isinstance(block.get("tool_use_id"), str):
            # A call's question: the app runs that call, not the client.
            self._gated.add(block["tool_use_id"])
        frames = self._release()
        if kind == BlockType.QUESTION:
            self._items[index] = _Item(_QUIET, "", -1, block)
            self._asks = True
            return frames + self._question(block)
        if kind in BlockType.RESPONSES or (kind == BlockType.TOOL_RESULT and is_record):
            self._items[index] = _Item(_QUIET, "", -1, block)  # the client's own answer
            return frames
        if kind == BlockType.TOOL_RESULT:
            self._results.add(str(block.get("tool_use_id")))
        return frames + self._open_block(kind, index, block)

    def _hold_call(self, index: int, block: dict[str, Any]) -> list[bytes]:
        item = _Item(BlockType.TOOL_USE, "", -1, block)
        item.held = True
        self._items[index] = item
        self._calls[str(block["id"])] = item
        self._queue.append(item)
        return []

    def _release(self) -> list[bytes]:
        """The held calls, results and approval requests, in order: each call not gated
        by an approval request as its items (whole when its block stopped, else its start
        and arguments so far), each result as its item (at its stop when still open),
        each approval request as an ``mcp_approval_request``."""
        frames = self._finish_reasoning()
        if not self._queue:
            return frames
        queue, self._queue = self._queue, []
        for entry in queue:
            if isinstance(entry, dict):
                frames += self._approval(entry)
                continue
            entry.held = False
            if entry.kind == BlockType.TOOL_RESULT:
                entry.id, entry.output_index = self._place("item")
                entry.id_json = orjson.dumps(entry.id)
                if entry.closed:
                    frames += self._result_done(entry)
                continue
            if str(entry.block["id"]) in self._gated:
                entry.kind = _GATED
                continue
            entry.id, entry.output_index = self._place("fc")
            entry.id_json = orjson.dumps(entry.id)
            if entry.closed:
                frames += self._call_whole(entry)
            else:
                frames += self._call_start(entry)
        return frames

    def _approval(self, block: dict[str, Any]) -> list[bytes]:
        request_id = str(block["id"])
        call_id = str(block["tool_use_id"])
        call = self._calls.get(call_id) or self._earlier.get(call_id)
        name = arguments = ""
        label: object = None
        if call is not None:
            name, arguments = str(call.block.get("name", "")), "".join(call.parts)
            label = call.block.get("server_label")
        body: dict[str, Any] = {"id": request_id, "type": "mcp_approval_request"}
        body.update(
            name=name,
            arguments=arguments,
            server_label=label if isinstance(label, str) and label else APPROVAL_SERVER_LABEL,
        )
        return self._item_whole(body)

    def _question(self, block: dict[str, Any]) -> list[bytes]:
        fields: dict[str, Any] = {"question": str(block.get("question", ""))}
        schema = block.get("schema")
        if isinstance(schema, dict):
            fields["schema"] = schema
        arguments = orjson.dumps(fields).decode()
        item_id, output_index = self._place("fc")
        call: dict[str, Any] = {"id": item_id, "type": "function_call", "call_id": str(block["id"])}
        call.update(name=QUESTION_TOOL, arguments="", status="in_progress")
        done = dict(call, arguments=arguments, status="completed")
        at = {"item_id": item_id, "output_index": output_index}
        return (
            self._emit("response.output_item.added", {"output_index": output_index, "item": call})
            + self._emit("response.function_call_arguments.delta", dict(at, delta=arguments))
            + self._emit(
                "response.function_call_arguments.done",
                dict(at, arguments=arguments, name=QUESTION_TOOL),
            )
            + self._finished(output_index, done)
        )

    def _item_whole(self, body: dict[str, Any]) -> list[bytes]:
        """An item written whole: added and done at once."""
        _, output_index = self._place("")
        added = self._emit(
            "response.output_item.added", {"output_index": output_index, "item": body}
        )
        return added + self._finished(output_index, body)

    def _finished(self, output_index: int, body: dict[str, Any]) -> list[bytes]:
        self._output.append(body)
        return self._emit("response.output_item.done", {"output_index": output_index, "item": body})

    def _call_start(self, item: _Item) -> list[bytes]:
        """A released call still open: its start and its arguments so far; the rest
        streams as it comes."""
        if _client_item_type(item.block) is not None:
            return []  # added and done at its stop, whole
        call = self._call_item(item, "", "in_progress")
        frames = self._emit(
            "response.output_item.added", {"output_index": item.output_index, "item": call}
        )
        for fragment in item.parts:
            body = {"item_id": item.id, "output_index": item.output_index, "delta": fragment}
            frames += self._emit("response.function_call_arguments.delta", body)
        return frames

    def _call_whole(self, item: _Item) -> list[bytes]:
        """A released call whose block had stopped: all its events."""
        return self._call_start(item) + self._call_done(item)

    def _open_block(self, kind: str, index: int, block: dict[str, Any]) -> list[bytes]:
        if kind == BlockType.TEXT:
            item = self._open(kind, "msg", index, block)
            added: dict[str, Any] = {"id": item.id, "type": "message", "role": "assistant"}
            added.update(status="in_progress", content=[])
            part = {"type": "output_text", "text": "", "annotations": []}
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": added}
            ) + self._emit("response.content_part.added", self._at(item, part=part))
        if kind in (BlockType.THINKING, "redacted_thinking"):
            item = self._open(kind, "rs", index, block)
            if kind == "redacted_thinking":
                item.signature = str(block.get("data", ""))
            reasoning = {"id": item.id, "type": "reasoning", "summary": []}
            frames = self._emit(
                "response.output_item.added",
                {"output_index": item.output_index, "item": reasoning},
            )
            if _is_summary(block):
                item.summaries = []
                frames += self._summary_part("response.reasoning_summary_part.added", item, "")
            return frames
        if kind == "server_tool_use" and block.get("item_type") in _HOSTED_ITEM_TYPES:
            # A hosted tool's call: its result block carries the provider's item whole,
            # which is what goes out (one output item, no index of its own here).
            self._items[index] = _Item(_HOSTED_CALL, "", -1, block)
            return []
        if kind == _COMPACTION:
            self._open(kind, "cmp", index, block)  # at its stop, whole
            return []
        self._open(kind, "item", index, block)  # a tool result or another block: at its stop
        return []

    def _at(self, item: _Item, **body: Any) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index, "content_index": 0, **body}

    def _in_summary(self, item: _Item, **body: Any) -> dict[str, Any]:
        """The fields that place an event in the summary part ``item`` is writing."""
        summaries = item.summaries or []
        place = {"item_id": item.id, "output_index": item.output_index}
        return {**place, "summary_index": len(summaries), **body}

    def _summary_part(self, name: str, item: _Item, text: str) -> list[bytes]:
        part = {"type": "summary_text", "text": text}
        return self._emit(name, self._in_summary(item, part=part))

    def _next_summary(self, index: int, item: _Item) -> list[bytes]:
        """Block ``index`` is the next summary part of the reasoning item ``item``."""
        self._reasoning = None
        self._items[index] = item
        return self._summary_part("response.reasoning_summary_part.added", item, "")

    def _finish_reasoning(self) -> list[bytes]:
        """The end of the reasoning item whose summary parts are done."""
        item, self._reasoning = self._reasoning, None
        if item is None:
            return []
        parts = [{"type": "summary_text", "text": text} for text in item.summaries or []]
        reasoning: dict[str, Any] = {"id": item.id, "type": "reasoning", "summary": parts}
        if item.signature is not None:
            reasoning["encrypted_content"] = item.signature
        return self._done(item, reasoning)

    def _hold(self, item: _Item, text: str) -> bool:
        size = item.size = item.size + len(text)
        if size > self.max_buffer:
            if size - len(text) <= self.max_buffer:
                logger.warning(
                    "a %s block passed %d bytes; its done events hold what came before",
                    item.kind,
                    self.max_buffer,
                )
            return False
        item.parts.append(text)
        return True

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A delta the quick path did not take: reasoning, tool arguments, held content."""
        item = self._items.get(index)
        if item is None:
            logger.warning("skipped a delta for block %d, which is not open", index)
            return []
        if item.kind in (_HOSTED_CALL, _QUIET, _GATED):
            return []
        kind = delta.get("type")
        if item.kind == BlockType.TEXT and kind == DeltaType.TEXT:
            text = str(delta["text"])
            self._hold(item, text)
            return self._emit("response.output_text.delta", self._at(item, delta=text, logprobs=[]))
        if item.kind == BlockType.TEXT and kind == "citations_delta":
            annotation = _annotation(delta.get("citation"))
            if annotation is None:
                return []  # a citation Responses has no annotation for (docs/dialects.md)
            item.annotations.append(annotation)
            body = self._at(item, annotation_index=len(item.annotations) - 1)
            body["annotation"] = annotation
            return self._emit("response.output_text.annotation.added", body)
        if item.kind == BlockType.THINKING and kind == DeltaType.THINKING:
            text = str(delta.get("thinking", delta.get("text")))  # the two dialects
            self._hold(item, text)
            if item.summaries is not None:
                body = self._in_summary(item, delta=text)
                return self._emit("response.reasoning_summary_text.delta", body)
            return self._emit("response.reasoning_text.delta", self._at(item, delta=text))
        if item.kind == BlockType.THINKING and kind == DeltaType.SIGNATURE:
            # Sent whole: each signature_delta replaces the one before (docs/protocol.md).
            item.signature = str(delta["signature"])
            return []
        if item.kind == BlockType.TOOL_USE and kind == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            if item.held:
                if item.size + len(fragment) <= self.max_buffer:
                    self._hold(item, fragment)
                    return []
                # Too large to hold: the round's calls go out now, approvals or not
                # (docs/dialects.md), and this one streams on.
                frames = self._release()
                return frames + self.on_delta(index, delta)
            self._hold(item, fragment)
            if _client_item_type(item.block) is not None:
                return []  # its item carries the input whole, at its stop
            body = {"item_id": item.id, "output_index": item.output_index, "delta": fragment}
            return self._emit("response.function_call_arguments.delta", body)
        if item.kind == BlockType.TOOL_RESULT and kind == DeltaType.TOOL_RESULT:
            self._hold(item, str(delta["text"]))
            return []
        if len(orjson.dumps(delta)) + item.size <= self.max_buffer:
            item.deltas.append(delta)
        return []

    def _call_item(self, item: _Item, arguments: str, status: str) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": item.id,
            "type": "function_call",
            "call_id": str(item.block["id"]),
            "name": str(item.block["name"]),
            "arguments": arguments,
            "status": status,
        }
        caller = item.block.get("caller")
        if isinstance(caller, dict) and caller.get("type") in _CALLERS:
            # A program's call: the client sends it back with the program that made it.
            call["caller"] = caller
        return call

    def _client_item(self, item: _Item, fields: dict[str, Any], status: str) -> dict[str, Any]:
        # status: what the item says of itself where its type has the field.
        """The output item of a call the client answers, as the provider sent it: its
        type, its ids, then the fields its input carried (docs/dialects.md)."""
        item_type = _client_item_type(item.block)
        call_id = str(item.block["id"])
        if item_type == "mcp_approval_request":
            # Answered by the request's own id (``approval_request_id``).
            return {"id": call_id, "type": item_type, **fields}
        body: dict[str, Any] = {"id": item.id, "type": item_type, "call_id": call_id}
        if item_type == "custom_tool_call":
            body["name"] = str(item.block["name"])
        # A custom tool call's too: OpenAI's done item carries it, and the AI SDK's OpenAI
        # provider refuses one without it.
        body["status"] = status
        if item_type == "tool_search_call":
            body["execution"] = "client"  # the only tool search a client answers
        body.update(fields)
        return body

    def _call_done(self, item: _Item) -> list[bytes]:
        """A call's done events (a call of the client's own kind: added and done)."""
        whole = "".join(item.parts)
        frames: list[bytes] = []
        if not whole and _client_item_type(item.block) is None:
            # No arguments came (a tool with no parameters): its start's input, as a
            # delta too, for a client that adds the deltas up.
            whole = call_arguments([], item.block)
            body = {"item_id": item.id, "output_index": item.output_index, "delta": whole}
            frames = self._emit("response.function_call_arguments.delta", body)
        if _client_item_type(item.block) is not None:
            try:
                given = orjson.loads(whole) if whole else {}
            except orjson.JSONDecodeError:
                given = {}
            fields = given if isinstance(given, dict) else {}
            body = self._client_item(item, fields, "completed")
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": body}
            ) + self._done(item, body)
        call = self._call_item(item, whole, "completed")
        body = {"item_id": item.id, "output_index": item.output_index, "arguments": whole}
        body["name"] = call["name"]
        frames += self._emit("response.function_call_arguments.done", body)
        return frames + self._done(item, call)

    def _done(self, item: _Item, body: dict[str, Any]) -> list[bytes]:
        self._output.append(body)
        return self._emit(
            "response.output_item.done", {"output_index": item.output_index, "item": body}
        )

    def on_block_stop(self, index: int) -> list[bytes]:
        """The item's done events."""
        item = self._items.pop(index, None)
        if item is None:
            logger.warning("skipped the stop of block %d, which is not open", index)
            return []
        if item.held:
            item.closed = True  # written once its round's approvals are known
            return []
        if item.kind in (_QUIET, _GATED):
            return []
        if item.kind == BlockType.TOOL_USE:
            return self._call_done(item)
        whole = "".join(item.parts)
        if item.kind == BlockType.TEXT:
            part = {"type": "output_text", "text": whole, "annotations": item.annotations}
            message: dict[str, Any] = {"id": item.id, "type": "message", "role": "assistant"}
            message.update(status="completed", content=[part])
            return (
                self._emit("response.output_text.done", self._at(item, text=whole, logprobs=[]))
                + self._emit("response.content_part.done", self._at(item, part=part))
                + self._done(item, message)
            )
        if item.summaries is not None:
            # A summary part's end; the item goes on while the next block is another of
            # its parts, and ends with its encrypted content (its last part's signature).
            frames = self._emit(
                "response.reasoning_summary_text.done", self._in_summary(item, text=whole)
            )
            frames += self._summary_part("response.reasoning_summary_part.done", item, whole)
            item.summaries.append(whole)
            item.parts, item.size = [], 0
            self._reasoning, self._reasoning_next = item, index + 1
            if item.signature is not None:
                frames += self._finish_reasoning()
            return frames
        if item.kind in (BlockType.THINKING, "redacted_thinking"):
            reasoning: dict[str, Any] = {"id": item.id, "type": "reasoning", "summary": []}
            if item.kind == BlockType.THINKING:  # a redacted block has no text, only its data
                reasoning["content"] = [{"type": "reasoning_text", "text": whole}]
            if item.signature is not None:
                reasoning["encrypted_content"] = item.signature
            frames = []
            if item.kind == BlockType.THINKING:
                frames = self._emit("response.reasoning_text.done", self._at(item, text=whole))
            return frames + self._done(item, reasoning)
        if item.kind == BlockType.TOOL_RESULT:
            return self._result_done(item)
        if item.kind == _HOSTED_CALL:
            return []  # its result block writes the item
        hosted = item.block.get("content")
        if isinstance(hosted, dict) and hosted.get("type") in _HOSTED_ITEM_TYPES:
            # A hosted tool's result: the provider's item, as it sent it.
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": hosted}
            ) + self._done(item, hosted)
        if item.kind == _COMPACTION and (encrypted := _compacted(item)) is not None:
            # The conversation compacted: the item a client that keeps no state with the
            # provider sends back in its place.
            body = {"id": item.id, "type": _COMPACTION, "encrypted_content": encrypted}
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": body}
            ) + self._done(item, body)
        other: dict[str, Any] = {"id": item.id, "type": "essessey_block", "block": item.block}
        other["deltas"] = item.deltas
        return self._done(item, other)

    def _result_done(self, item: _Item) -> list[bytes]:
        """A tool result's item, added and done at once."""
        output: dict[str, Any] = {
            "id": item.id,
            "type": "function_call_output",
            "call_id": str(item.block["tool_use_id"]),
            "output": "".join(item.parts),
            "status": "completed",
        }
        if item.block.get("is_error"):
            output["is_error"] = True  # Responses has no field for it: kept as sent
        return self._emit(
            "response.output_item.added", {"output_index": item.output_index, "item": output}
        ) + self._done(item, output)

    def _end(self) -> list[bytes]:
        self.ended = True
        reason = self._stop_reason
        incomplete = _INCOMPLETE.get(reason or "")
        if incomplete is not None:
            details = {"reason": incomplete}
            self._final = self._response("incomplete", incomplete_details=details)
            return self._emit("response.incomplete", {"response": self._final})
        if reason == StopReason.CANCELLED:
            self._final = self._response("cancelled")
            return self._emit("response.incomplete", {"response": self._final})
        self._final = self._response("completed")
        return self._emit("response.completed", {"response": self._final})

    def _failed(self, error_type: str, message: str) -> list[bytes]:
        self.ended = True
        error = {"code": error_type, "message": message, "param": None}
        failure = {"code": "server_error", "message": message}
        self._final = self._response("failed", error=failure)
        return self._emit("error", error) + self._emit("response.failed", {"response": self._final})


def _compacted(item: _Item) -> str | None:
    """A compaction block's ``encrypted_content``: its start's, replaced by each
    ``compaction_delta``'s (as the Anthropic format streams it); None without one."""
    encrypted = item.block.get("encrypted_content")
    for delta in item.deltas:
        if delta.get("type") == "compaction_delta" and delta.get("encrypted_content") is not None:
            encrypted = delta["encrypted_content"]
    return encrypted if isinstance(encrypted, str) and encrypted else None


def _is_summary(block: dict[str, Any]) -> bool:
    """Whether a block is a thinking block of a provider's summary of its reasoning
    (docs/protocol.md): a summary part of a Responses reasoning item."""
    return block.get("type") == BlockType.THINKING and block.get("summary") is True


# -- serving it ---------------------------------------------------------------------------
