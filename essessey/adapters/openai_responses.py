"""Publish an OpenAI Responses API stream as the protocol.

The events are what ``client.responses.create(..., stream=True)`` yields: plain mappings
(decoded JSON) or the ``openai`` SDK's event objects, read through their
``model_dump(mode="json", exclude_unset=True)``. The SDK is never imported here.

The mapping:

============================================  =========================================
Responses API event                           published as
============================================  =========================================
``response.reasoning_summary_text.delta``,    a thinking block (``delta``)
``response.reasoning_text.delta``
a reasoning item's ``encrypted_content``      that thinking block's ``signature_delta``,
                                              or a ``redacted_thinking`` block when the
                                              item has no text
``response.output_text.delta``,               a text block (``delta``; a refusal is the
``response.refusal.delta``                    model's answer too)
``response.output_item.added`` of a           a tool_use block: ``call_id`` is its id,
``function_call``                             ``name`` its name
an output item the client must answer         a tool_use block once the item is whole
(``custom_tool_call``, ``apply_patch_call``,  (its input: the item's input, operation,
``shell_call``, ``local_shell_call``, a       action or arguments, as JSON); see
client ``tool_search_call``)                  ``_CLIENT_CALLS`` and ``_runs_on_client``
                                              (a shell in a container the provider
                                              hosts, a custom tool the request did not
                                              declare: the provider's, as below)
``mcp_approval_request``                      the MCP call it asks about, a tool_use
                                              block (id ``<item id>_call``, the tool's
                                              name and arguments, ``item_type``
                                              ``mcp_call``), then (``publish``) an
                                              ``approval_request`` block of the item's
                                              id gating it: the turn waits for the
                                              approval (docs/asking.md)
``response.function_call_arguments.delta``    an ``input_json_delta`` of that call's block
``response.completed``                        the epilogue: ``end_turn``, or ``tool_use``
                                              when the response made function calls
``response.incomplete``                       the epilogue: ``max_tokens`` for
                                              ``max_output_tokens``, else ``end_turn``
                                              (see :func:`map_stop_reason`)
``response.failed``, ``error``                an ``error`` event with the provider's
                                              code (``api_error`` without one) and
                                              message; the message is not complete
``response.usage`` of the last three          ``input_tokens`` (less the cached ones),
                                              ``cache_read_input_tokens``,
                                              ``output_tokens``, ``reasoning_tokens``
``response.created``                          the model name of ``message_start``
a ``compaction`` item                         a ``compaction`` block, whole, once the
                                              item is: ``{"type": "compaction",
                                              "content": null, "encrypted_content"}``,
                                              as the Anthropic format has it
============================================  =========================================

Each reasoning part (a summary part, a reasoning item's text) is a thinking block of its
own, and each text part (a message item's content part) a text block of its own: the
stream marks where one part ends only by its index (``summary_index``, ``content_index``,
the item), and summaries that each open with a heading, or a model's preamble and its
answer (two message items), would run together in one block. Nothing is added to the
text the provider sent.

The ``*.done`` events (``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``, ..., and the output of ``response.completed``) carry each
part whole: what the deltas left out is published from them (see :func:`stream_round`).
A part is known by its item's ``output_index`` and its part index (0 when absent), the
item id only where an event gives no index: gateways rename items (in the terminal
output, at every event, in the done events), and a renamed item must not be published
again as a new part.
A tool the provider ran itself (web search, file search, code interpreter, image
generation, an MCP call or tool list, a server tool search, a hosted shell, xAI's search
tools), and an output such a tool makes as an item of its own (``shell_call_output``,
``tool_search_output``), is a ``server_tool_use`` block and its result block once its
item is whole (see ``_HOSTED``); its progress
events are read quietly. The lifecycle events with nothing to publish
(``response.in_progress``, ``response.content_part.added``, ...) are read quietly too.
A text part's annotations (``response.output_text.annotation.added``, a message
part's ``annotations``) are its text block's ``citations_delta`` (see ``_citations``).
Every other event (audio, ...) and every output item of another type is skipped, with
one log line per type naming only the type.

The blocks follow :class:`~essessey.adapters.RoundStream`'s layout, in output order (text
after a function call is a block after it); the arguments of calls whose fragments
interleave are kept whole (see :func:`stream_round`). An event that cannot be read (not
a mapping, a field of the wrong type, a string with a lone surrogate, a count past 64
bits) is skipped with a warning naming its position and the reason. Logs carry
positions, types and lengths, never text or arguments.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import orjson

from essessey._logsafe import dotted_label, log_label
from essessey.adapters._citations import annotation, citation
from essessey.adapters._compaction import compaction_block
from essessey.adapters._message import PublishedMessage, PublishedToolCall, parse_arguments
from essessey.adapters._publishing import Ending, publish_message, require_round
from essessey.adapters._tool_calls import HeldCall, HeldCalls
from essessey.adapters._values import (
    MAX_COUNT,
    Malformed,
    as_mapping,
    call_caller,
    count,
    has_lone_surrogate,
    kind,
    opt_int,
    opt_list,
    opt_map,
    opt_str,
    read_all,
    replace_surrogates,
    req_map,
    req_str,
    token_counts,
    writable,
)
from essessey.adapters.rounds import RoundStream, ToolCallRequest
from essessey.errors import ProviderStreamError
from essessey.protocol import StopReason, thinking_block_start
from essessey.publisher import Publisher

__all__ = [
    "FAILED_MESSAGE",
    "INCOMPLETE_MESSAGE",
    "PublishedResponse",
    "StreamedResponse",
    "approval_call_id",
    "map_stop_reason",
    "publish",
    "stream_round",
]

logger = logging.getLogger("essessey.adapters.openai_responses")

INCOMPLETE_MESSAGE: Final = "the provider stream ended before the response did"
"""The message of the error a stream cut short (no terminal event) ends with."""

FAILED_MESSAGE: Final = "the response failed"
"""The message of the error a failure without a message of its own is published with."""


def map_stop_reason(
    status: str | None, incomplete_reason: str | None = None, *, tool_calls: bool = False
) -> str:
    """The protocol's stop reason for a response's final ``status``.

    ``status`` is what the terminal event says: ``"completed"`` for
    ``response.completed``, ``"incomplete"`` for ``response.incomplete`` (with
    ``incomplete_reason``, its ``response.incomplete_details.reason``), None when no
    terminal event was read (a stream without one ends with an error, whatever this
    says). ``tool_calls`` says whether the response made function
    calls. The table:

    - ``"completed"``, None or ``""`` -> ``"tool_use"`` when ``tool_calls``, else
      ``"end_turn"``.
    - ``"incomplete"`` with ``"max_output_tokens"`` -> ``"max_tokens"``, with or without
      tool calls (their arguments may be cut off, and the caller must know).
    - ``"incomplete"`` with ``"content_filter"`` -> ``"refusal"``; for any other reason
      (``"max_messages"``, ``"steered"``, none) -> ``"end_turn"``; either even with tool
      calls: the output was cut, so its calls are not to be run.
    - anything else (``"cancelled"``, ...) -> passed through unchanged (stop reasons are
      an open set). A failed response has no stop reason: it ends with an ``error``.
    """
    if not status or status == "completed":
        return StopReason.TOOL_USE if tool_calls else StopReason.END_TURN
    if status == "incomplete":
        if incomplete_reason == "max_output_tokens":
            return StopReason.MAX_TOKENS
        if incomplete_reason == "content_filter":
            return StopReason.REFUSAL
        return StopReason.END_TURN
    return status


@dataclass(slots=True)
class StreamedResponse:
    """What :func:`stream_round` published for one response.

    ``text`` and ``thinking`` are what went out. ``tool_calls`` are the calls that went
    out, in order. ``status`` is the terminal event's
    (``"completed"`` or ``"incomplete"``, None when the stream had none) and
    ``incomplete_reason`` its ``incomplete_details.reason``; ``stop_reason`` is them
    mapped by :func:`map_stop_reason`. ``usage`` holds the token counts the terminal
    event reported (empty when it had none), ``model`` the first non-empty
    ``response.model`` and ``response_id`` the first ``response.id``.
    ``approvals`` pairs each ``mcp_approval_request``'s id with the call it gates (among
    ``tool_calls``): a caller that owns the round asks them once it ends
    (``rounds.ask_approval(call_id, request_id=request_id, expires_in=None)``), as
    :func:`publish` does, so that an ``mcp_approval_response`` answers them.
    ``hosted_calls`` are the ``call_id`` of the calls the provider ran itself (a shell in
    its container, say), published as server tools with their outputs: an output that
    comes for one of them later has gone out already.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: list[PublishedToolCall] = field(default_factory=list)
    status: str | None = None
    incomplete_reason: str | None = None
    stop_reason: str = StopReason.END_TURN
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    response_id: str | None = None
    approvals: list[tuple[str, str]] = field(default_factory=list)
    hosted_calls: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PublishedResponse(PublishedMessage):
    """What :func:`publish` returns: the message's content as it went out.

    Besides :class:`~essessey.adapters.PublishedMessage`'s fields (``error`` is the
    ``{"type", "message"}`` of the ``error`` event that ended the message when the
    response failed; ``stop_reason`` is None then): ``response_id`` (the provider's
    ``response.id``), ``status`` (``"failed"`` then) and ``incomplete_reason`` (as in
    :class:`StreamedResponse`).
    """

    response_id: str | None = None
    status: str | None = None
    incomplete_reason: str | None = None


async def stream_round(
    rounds: RoundStream,
    events: Iterable[Any] | AsyncIterable[Any],
    *,
    id_prefix: str = "call_",
) -> StreamedResponse:
    """Publish one response's events into the open round of ``rounds``.

    The caller owns the round: it calls ``round_start`` before, and sends tool results
    and calls ``round_end`` after. When the events end, this calls
    ``rounds.assistant_message`` with the response's function calls, so results may
    follow.

    Function calls are keyed by their ``output_index`` (or their ``item_id``). A call's
    tool_use block opens when its ``function_call`` item arrives and its arguments
    stream as they come. Several calls may be in flight at once: the first streams
    live; while its arguments are not whole (its
    ``response.function_call_arguments.done`` or ``response.output_item.done`` has not
    come, and they are not whole JSON), whatever comes for anything else (the other
    calls' fragments, text, reasoning) is held, and goes out in output order, each
    fragment as it came, once they are (or the events end). Text and reasoning keep
    their place among the calls: text after a call is a block after it. A fragment for
    a call already closed cannot go out; it is counted in a warning. A call without a
    ``call_id`` (or with a repeated one) gets ``f"{id_prefix}{n}"``, ``n`` unique
    within the message; a call that never gets a name is dropped with a warning.

    A done event carries a call's whole arguments. The streamed fragments are taken as
    the provider sent them; the done value only fills in what they lack: when the
    fragments are a prefix of it (none at all, say), the rest goes out as one more
    fragment; when they differ and are whole JSON, they win; when they differ and are
    not, the done value replaces them if the call's block is not out yet (else what went
    out stays, with a warning). Text and reasoning parts are completed from their done
    values the same way (a part whose done value differs keeps what streamed).

    A sync iterable is read in the event loop's thread: give it events already in
    memory, and a network stream as an async iterable (the SDK's ``AsyncStream``).
    When the response fails (``response.failed`` or an ``error`` event), nothing after
    it is read: what came before goes out, the round's calls are declared, and
    :class:`~essessey.ProviderStreamError` is raised with the provider's code (else
    ``api_error``) and message, so :func:`~essessey.adapters.stream_rounds` ends the
    turn with that error. What the iterable raises propagates.
    """
    require_round(rounds)
    reader = _Reader(rounds, id_prefix)
    async with reader.held.released_on_failure():
        await read_all(events, reader.feed, lambda: reader.error is not None)
    reader.end_of_events()
    result = await reader.finish()
    if reader.error is not None:
        raise reader.error
    return result


async def publish(
    publisher: Publisher,
    events: Iterable[Any] | AsyncIterable[Any],
    *,
    message_id: str,
    stream_id: str,
    model: str | None = None,
) -> PublishedResponse:
    """Publish one response as one whole message, preamble to epilogue.

    The model name is the first non-empty ``response.model`` (``response.created``
    carries it), else ``model``, else ``""``: ``message_start`` goes out once it is
    known, or before the first content. Input tokens are unknown then, so it says 0 and
    the epilogue carries the usage the terminal event reported. The content goes through
    one round of a :class:`~essessey.adapters.RoundStream` (see :func:`stream_round`).
    Function calls end the message without results (stop reason ``tool_use``): their
    results belong to the next request. Generated tool call ids are
    ``f"call_{message_id}_{n}"``.

    When the response fails (``response.failed``, an ``error`` event), what came before
    goes out, the open block is closed and an ``error`` event with the provider's code
    and message ends the message (no ``message_delta``, no ``message_stop``: it is not
    complete; when nothing went out before, the ``error`` event is all there is);
    ``publish`` returns what went out with ``error`` set and ``stop_reason`` None. If the events
    raise (or publishing fails), an ``error`` event of type ``api_error``, naming only
    the exception class, ends the stream and the exception propagates.
    """
    rounds = RoundStream(publisher)
    opened: list[str] = []  # the model name message_start went out with

    async def open_message() -> None:
        name = reader.model or model or ""
        await publisher.send_stream_preamble(message_id, stream_id, name, input_tokens=0)
        opened.append(name)
        await rounds.round_start()

    reader = _Reader(rounds, f"call_{message_id}_", opener=open_message)

    async def read() -> tuple[StreamedResponse, Ending]:
        async with reader.held.released_on_failure():
            await read_all(events, reader.feed, lambda: reader.error is not None)
        reader.end_of_events()
        if reader.error is not None and not (opened or reader.pending):
            # Nothing went out, nothing waits: the error alone ends the stream.
            result = reader.summary()
        else:
            result = await reader.finish()
        if result.approvals and reader.error is None:
            # The MCP calls the provider asks to approve: the turn waits for the answers,
            # whatever else ended the response (its output cut short, say), so the message
            # ends as a message that asks does.
            if rounds.in_round:
                await rounds.round_end(answer_missing=False)
            for request_id, call_id in result.approvals:
                await rounds.ask_approval(call_id, request_id=request_id, expires_in=None)
            result.stop_reason = StopReason.TOOL_USE
        # The error ends the message: no message_delta, no message_stop.
        return result, Ending(result.stop_reason, result.usage, reader.error)

    result = await publish_message(publisher, read, rounds=rounds)
    error = reader.error
    return PublishedResponse(
        message_id=message_id,
        model=opened[0] if opened else reader.model or model or "",
        text=result.text,
        thinking=result.thinking,
        tool_calls=result.tool_calls,
        stop_reason=None if error is not None else result.stop_reason,
        usage=dict(result.usage),
        error=None if error is None else {"type": error.error_type, "message": error.message},
        response_id=result.response_id,
        status="failed" if error is not None else result.status,
        incomplete_reason=result.incomplete_reason,
    )


# -- reading events ---------------------------------------------------------------------


# Where an output item is: its output_index, or (only where no event gave it one) its item
# id. Gateways rename items (a reasoning item's id in the terminal output, an id minted
# per event, done events naming another id at the same index): the index is what holds.
_Anchor: TypeAlias = tuple[Literal["index"], int] | tuple[Literal["item"], str | None]

# A text or reasoning part: (kind, its item's anchor, part index, a missing one read as 0).
# The kinds: "message" (an output_text or refusal part, by content_index), "summary" (a
# reasoning summary part, by summary_index), "reasoning" (a reasoning_text part, by
# content_index).
_PartKey: TypeAlias = tuple[str, _Anchor, int]


@dataclass(slots=True)
class _Part:
    """A chunk of a text or reasoning part (``done``: the part's whole text), with the
    names its event gave its item and its place in it."""

    kind: str
    item_id: str | None
    output_index: int | None
    index: int | None
    text: str
    done: bool = False
    annotations: list[dict[str, Any]] | None = None  # a whole message part's citations


@dataclass(slots=True)
class _CallItem:
    """A ``function_call`` output item, or another call the client must answer."""

    output_index: int | None
    item_id: str | None
    call_id: str | None
    name: str | None
    arguments: str | None
    item_type: str | None = None  # the item's own type, when not a function_call
    approval: str | None = None  # an MCP call's approval request: the request's id
    caller: dict[str, Any] | None = None  # a program's call: the program that made it
    namespace: str | None = None  # the namespace tool it names (not carried: logged)


@dataclass(slots=True)
class _ContentItem:
    """A ``message`` or ``reasoning`` output item: its parts, whole."""

    parts: list[_Part]
    # A whole reasoning item's encrypted_content: what a client that keeps no state with
    # the provider (store=false) sends back for the model to go on from its reasoning.
    encrypted: str | None = None
    item_id: str | None = None
    output_index: int | None = None
    phase: str | None = None  # a message's phase (not carried: logged)


@dataclass(slots=True)
class _OtherItem:
    """An output item of a type not published."""

    item_type: str


@dataclass(slots=True)
class _HostedItem:
    """A tool the provider ran itself (web search, code interpreter, ...): published as a
    server tool block and its result block once whole (``item`` None before)."""

    output_index: int | None
    item_id: str | None
    item_type: str
    item: dict[str, Any] | None
    name: str  # the server tool's name (see _HOSTED; a custom tool's own name)


@dataclass(slots=True)
class _BlockItem:
    """An output item published as one block of its own, once whole (``block`` None
    before): a ``compaction`` item, as the ``compaction`` block the Anthropic format has
    for the same thing. Its ``encrypted_content`` is the conversation so far, compacted:
    what a client that keeps no state with the provider sends back in its place."""

    output_index: int | None
    item_id: str | None
    block: dict[str, Any] | None


_Item: TypeAlias = _CallItem | _ContentItem | _OtherItem | _HostedItem | _BlockItem

# A hosted tool's progress events (in_progress, searching, a partial image, its code as it
# is written): its item's done event carries what they say, whole.
_HOSTED_PROGRESS: Final = (
    "response.web_search_call.",
    "response.file_search_call.",
    "response.code_interpreter_call.",
    "response.code_interpreter_call_code.",
    "response.image_generation_call.",
    "response.mcp_call.",
    "response.mcp_call_arguments.",
    "response.mcp_list_tools.",
    "response.shell_call_command.",
    "response.shell_call_output_content.",
    "response.x_search_call.",
    "response.code_execution_call.",
)

# A hosted tool's item type -> the server tool's name and the fields its input carries
# (what it was asked); its result block carries the item whole.
_HOSTED: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "web_search_call": ("web_search", ("action",)),
    "file_search_call": ("file_search", ("queries",)),
    "code_interpreter_call": ("code_interpreter", ("code", "container_id")),
    "image_generation_call": ("image_generation", ()),
    "mcp_call": ("mcp", ("server_label", "name", "arguments")),
    "mcp_list_tools": ("mcp_list_tools", ("server_label",)),
    "tool_search_call": ("tool_search", ("arguments",)),
    # What a server tool made as an item of its own after its call's item: a hosted
    # shell's output, a server tool search's tools.
    "tool_search_output": ("tool_search", ("call_id",)),
    "shell_call_output": ("shell", ("call_id",)),
    # A shell in a container the provider hosts (see _runs_on_client).
    "shell_call": ("shell", ("action",)),
    # A custom tool the request did not declare: the provider's own (xAI's X search runs
    # its searches as such calls); its name is the item's.
    "custom_tool_call": ("", ("input",)),
    # xAI's server tools' own items.
    "x_search_call": ("x_search", ("name", "arguments", "action")),
    "code_execution_call": ("code_execution", ("name", "arguments", "action")),
    "view_image_call": ("view_image", ("name", "arguments", "action")),
    "view_x_video_call": ("view_x_video", ("name", "arguments", "action")),
    # Programmatic tool calling: the program the model wrote, which the provider runs
    # (the client's function calls it makes name it as their caller), and its result,
    # an item of a later response once the calls have their outputs.
    "program": ("programmatic_tool_calling", ("code",)),
    "program_output": ("programmatic_tool_calling", ("call_id",)),
}


@dataclass(slots=True)
class _ItemEvent:
    """``response.output_item.added`` (``done`` False) or ``.done``."""

    item: _Item
    done: bool


@dataclass(slots=True)
class _Arguments:
    """``response.function_call_arguments.delta`` or (``done``) ``.done``."""

    output_index: int | None
    item_id: str | None
    text: str
    done: bool


@dataclass(slots=True)
class _Lifecycle:
    """``response.created``, ``response.in_progress``, ``response.queued``."""

    model: str | None
    response_id: str | None
    declared: frozenset[str] | None = None  # see _declared_tools


@dataclass(slots=True)
class _Terminal:
    """``response.completed``, ``response.incomplete`` or ``response.failed``."""

    status: str
    model: str | None
    response_id: str | None
    usage: dict[str, int] | None
    incomplete_reason: str | None
    error: tuple[str, str] | None
    items: list[tuple[int, _Item]]


@dataclass(slots=True)
class _ErrorEvent:
    """The ``error`` event."""

    error_type: str
    message: str


@dataclass(slots=True)
class _Unmodelled:
    """An event type this adapter does not publish."""

    name: str


@dataclass(slots=True)
class _Annotation:
    """``response.output_text.annotation.added``: a citation of a text part."""

    item_id: str | None
    output_index: int | None
    index: int | None
    annotation_index: int | None
    annotation: dict[str, Any]


_Op: TypeAlias = (
    _Part
    | _ItemEvent
    | _Arguments
    | _Lifecycle
    | _Terminal
    | _ErrorEvent
    | _Unmodelled
    | _Annotation
    | None
)

_LIFECYCLE: Final = frozenset({"response.created", "response.in_progress", "response.queued"})
_TERMINAL: Final = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
# Events read for nothing: what they announce comes with the deltas and done events.
_QUIET: Final = frozenset(
    {
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        # A custom tool call's freeform input: its item's done event carries it whole.
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        # The provider compacting the conversation: its compaction item's done event
        # carries the result.
        "response.compaction.compacting",
    }
)
# event type -> (part kind, the field of its part index, the field of its text)
_DELTAS: Final = {
    "response.output_text.delta": ("message", "content_index", "delta"),
    "response.refusal.delta": ("message", "content_index", "delta"),
    "response.reasoning_summary_text.delta": ("summary", "summary_index", "delta"),
    "response.reasoning_text.delta": ("reasoning", "content_index", "delta"),
}
_DONES: Final = {
    "response.output_text.done": ("message", "content_index", "text"),
    "response.refusal.done": ("message", "content_index", "refusal"),
    "response.reasoning_summary_text.done": ("summary", "summary_index", "text"),
    "response.reasoning_text.done": ("reasoning", "content_index", "text"),
}
# A content part's type -> (part kind, the field of its text)
_PART_TYPES: Final = {
    "output_text": ("message", "text"),
    "refusal": ("message", "refusal"),
    "reasoning_text": ("reasoning", "text"),
}


def _error_text(value: object) -> str | None:
    # An error's words go out whatever they hold: a lone surrogate is replaced, not a
    # reason to lose the failure.
    if isinstance(value, str) and value:
        return replace_surrogates(value)
    return None


def _read_usage(value: object) -> dict[str, int] | None:
    usage = opt_map(value, "response.usage")
    if usage is None:
        return None
    at = "response.usage"
    given = count(usage.get("input_tokens"), f"{at}.input_tokens")
    output = count(usage.get("output_tokens"), f"{at}.output_tokens")
    input_details = opt_map(usage.get("input_tokens_details"), f"{at}.input_tokens_details")
    output_details = opt_map(usage.get("output_tokens_details"), f"{at}.output_tokens_details")
    cached = reasoning = None
    if input_details is not None:
        cached = count(
            input_details.get("cached_tokens"), f"{at}.input_tokens_details.cached_tokens"
        )
    if output_details is not None:
        reasoning = count(
            output_details.get("reasoning_tokens"), f"{at}.output_tokens_details.reasoning_tokens"
        )
    # Cache writes (input_tokens_details.cache_write_tokens) stay in input_tokens, as in
    # the chat-completions adapter, so the counts still add up to what was billed.
    return token_counts(given, cached, output, reasoning)


def _read_parts(
    item: Mapping[str, Any],
    list_field: str,
    kind: str | None,
    item_id: str | None,
    output_index: int | None,
    where: str,
) -> list[_Part]:
    """The parts of ``item[list_field]``; ``kind`` None reads each part's own type."""
    parts: list[_Part] = []
    for k, entry in enumerate(opt_list(item.get(list_field), f"{where}.{list_field}") or ()):
        at = f"{where}.{list_field}[{k}]"
        part = req_map(entry, at)
        part_kind, text_field = kind, "text"
        if kind is None:
            part_type = opt_str(part.get("type"), f"{at}.type")
            if part_type not in _PART_TYPES:
                continue  # no text of its own to publish
            part_kind, text_field = _PART_TYPES[part_type]
        text = opt_str(part.get(text_field), f"{at}.{text_field}")
        if text is not None and part_kind is not None:
            found = opt_list(part.get("annotations"), f"{at}.annotations") or ()
            annotations = [annotation(a, f"{at}.annotations[{j}]") for j, a in enumerate(found)]
            parts.append(_Part(part_kind, item_id, output_index, k, text, True, annotations))
    return parts


# The output items that are calls the client must answer, beside function_call: the
# tool_use block's name (None: the item's own ``name``) and the fields its input carries.
_CLIENT_CALLS: Final[dict[str, tuple[str | None, tuple[str, ...]]]] = {
    "custom_tool_call": (None, ("input",)),
    "apply_patch_call": ("apply_patch", ("operation",)),
    "shell_call": ("shell", ("action",)),
    "local_shell_call": ("local_shell", ("action",)),
    "tool_search_call": ("tool_search", ("arguments",)),
    # Computer use: the client performs the actions and answers with a screenshot.
    "computer_call": ("computer", ("action", "actions", "pending_safety_checks")),
}


def _client_call(
    item: Mapping[str, Any],
    item_type: str,
    output_index: int | None,
    item_id: str | None,
    whole: bool,
    where: str,
) -> _CallItem:
    """A call the client must answer as a function call: its input the item's fields as
    JSON, taken from the item whole (its ``done``, or the terminal output) only."""
    name, fields = _CLIENT_CALLS[item_type]
    if name is None:
        name = opt_str(item.get("name"), f"{where}.name")
    call_id = opt_str(item.get("call_id"), f"{where}.call_id")
    arguments = None
    if whole:
        given = {key: item[key] for key in fields if key in item}
        try:
            arguments = orjson.dumps(given).decode()
        except TypeError as exc:  # a value JSON cannot hold
            raise Malformed(f"{where} cannot be written as JSON") from exc
    return _CallItem(output_index, item_id, call_id, name, arguments, item_type)


def approval_call_id(request_id: str) -> str:
    """The id of the tool_use block of the MCP call an ``mcp_approval_request`` (of id
    ``request_id``) asks about: what its approval request gates, and what an answer names."""
    return f"{request_id}_call"


def _approval_call(
    item: Mapping[str, Any], output_index: int | None, item_id: str | None, where: str
) -> _CallItem:
    """An ``mcp_approval_request``: the MCP call it asks about, a tool_use block (id
    ``<request id>_call``, the tool's name and arguments, ``item_type`` ``mcp_call``)
    that an approval request (the item's id) then gates (docs/asking.md)."""
    if item_id is None:
        raise Malformed(f"{where} has no id: an approval request is answered by its id")
    return _CallItem(
        output_index,
        item_id,
        approval_call_id(item_id),
        opt_str(item.get("name"), f"{where}.name"),
        opt_str(item.get("arguments"), f"{where}.arguments"),
        "mcp_call",
        approval=item_id,
    )


def _read_item(
    value: object,
    output_index: int | None,
    where: str,
    *,
    whole: bool = True,
    declared: frozenset[str] | None = None,
) -> _Item:
    item = req_map(value, where)
    item_type = req_str(item.get("type"), f"{where}.type")
    item_id = opt_str(item.get("id"), f"{where}.id")
    if item_type == "mcp_approval_request":
        return _approval_call(item, output_index, item_id, where)
    if item_type in _CLIENT_CALLS and _runs_on_client(item, item_type, declared):
        if output_index is None and item_id is None:
            raise Malformed(f"{where} has neither an output_index nor an id")
        call = _client_call(item, item_type, output_index, item_id, whole, where)
        call.namespace = _namespace(item, where)
        return call
    if item_type == "function_call":
        if output_index is None and item_id is None:
            raise Malformed(f"{where} has neither an output_index nor an id")
        caller = _caller(item.get("caller"), where)
        return _CallItem(
            output_index=output_index,
            item_id=item_id,
            call_id=opt_str(item.get("call_id"), f"{where}.call_id"),
            name=opt_str(item.get("name"), f"{where}.name"),
            arguments=opt_str(item.get("arguments"), f"{where}.arguments"),
            caller=caller,
            namespace=_namespace(item, where),
        )
    if item_type == "message":
        parts = _read_parts(item, "content", None, item_id, output_index, where)
        phase = opt_str(item.get("phase"), f"{where}.phase")
        return _ContentItem(parts, None, item_id, output_index, phase)
    if item_type == "reasoning":
        summary = _read_parts(item, "summary", "summary", item_id, output_index, where)
        content = _read_parts(item, "content", "reasoning", item_id, output_index, where)
        encrypted = None
        if whole:
            encrypted = opt_str(item.get("encrypted_content"), f"{where}.encrypted_content")
        return _ContentItem(summary + content, encrypted or None, item_id, output_index)
    if item_type == "compaction":
        block = None
        if whole:
            encrypted = opt_str(item.get("encrypted_content"), f"{where}.encrypted_content")
            block = compaction_block(None, encrypted, None)
            if block is None:
                raise Malformed(f"{where} is a compaction without its encrypted_content")
        return _BlockItem(output_index, item_id, block)
    if item_type in _HOSTED:
        name = _HOSTED[item_type][0] or opt_str(item.get("name"), f"{where}.name") or item_type
        # Published whole, as its result block's content.
        given = dict(writable(item, where)) if whole else None
        return _HostedItem(output_index, item_id, item_type, given, name)
    return _OtherItem(item_type)


def _namespace(item: Mapping[str, Any], where: str) -> str | None:
    """A call's ``namespace`` (the namespace tool whose tool it calls), if it names one."""
    return opt_str(item.get("namespace"), f"{where}.namespace")


def _caller(value: object, where: str) -> dict[str, Any] | None:
    """A call's ``caller`` (the program that made it); one that cannot be read is left
    out with a warning, the call kept."""
    try:
        return call_caller(value, where)
    except Malformed as exc:
        logger.warning("%s; the call goes out without its caller", exc)
        return None


def _runs_on_client(
    item: Mapping[str, Any], item_type: str, declared: frozenset[str] | None
) -> bool:
    """Whether a call item of one of the ``_CLIENT_CALLS`` types is the client's to run;
    otherwise the provider runs it and it is published as a hosted tool."""
    if item_type == "tool_search_call":
        return item.get("execution") == "client"
    if item_type == "shell_call":
        # A shell in a container the provider hosts runs there, and its output comes as
        # an item of the same response; a local one (or one that names no environment) is
        # the client's.
        environment = item.get("environment")
        return not isinstance(environment, Mapping) or environment.get("type") in (None, "local")
    if item_type == "custom_tool_call" and declared is not None:
        # A client answers only the custom tools its request declared; a call of another
        # is the provider's own (xAI's X search makes its searches such calls).
        name = item.get("name")
        return not isinstance(name, str) or name in declared
    return True


def _declared_tools(response: Mapping[str, Any]) -> frozenset[str] | None:
    """The names of the function and custom tools a response lists (the request's,
    echoed), or None when it lists no tools: a gateway that leaves them out says nothing
    about which calls are the client's."""
    tools = response.get("tools")
    if not isinstance(tools, list | tuple) or not tools:
        return None
    # A namespace tool groups function and custom tools: its calls name the inner tool.
    listed: list[Any] = list(tools)
    for tool in tools:
        if isinstance(tool, Mapping) and tool.get("type") == "namespace":
            inner = tool.get("tools")
            if isinstance(inner, list | tuple):
                listed.extend(inner)
    return frozenset(
        tool["name"]
        for tool in listed
        if isinstance(tool, Mapping)
        and tool.get("type") in ("function", "custom")
        and isinstance(tool.get("name"), str)
    )


def _read_response(data: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None, str | None]:
    response = req_map(data.get("response"), "response")
    model = opt_str(response.get("model"), "response.model")
    response_id = opt_str(response.get("id"), "response.id")
    return response, model or None, response_id


def _read_terminal(
    data: Mapping[str, Any], status: str, declared: frozenset[str] | None
) -> tuple[_Terminal, list[str]]:
    """The terminal event, and why any of its output items could not be read."""
    response, model, response_id = _read_response(data)
    listed = _declared_tools(response)
    declared = declared if listed is None else listed
    usage = _read_usage(response.get("usage"))
    details = opt_map(response.get("incomplete_details"), "response.incomplete_details")
    reason = None
    if details is not None:
        reason = opt_str(details.get("reason"), "response.incomplete_details.reason")
    error = None
    if status == "failed":
        given = response.get("error")
        given = given if isinstance(given, Mapping) else {}
        error = (
            _error_text(given.get("code")) or _error_text(given.get("type")) or "api_error",
            _error_text(given.get("message")) or FAILED_MESSAGE,
        )
    items: list[tuple[int, _Item]] = []
    refused: list[str] = []
    if status != "failed":
        # The output, whole: each item read on its own, so one that cannot be read
        # does not cost the response its stop reason.
        output = response.get("output")
        for k, entry in enumerate(output if isinstance(output, list | tuple) else ()):
            try:
                read = _read_item(entry, k, f"response.output[{k}]", declared=declared)
                items.append((k, read))
            except Malformed as exc:
                refused.append(str(exc))
    terminal = _Terminal(status, model, response_id, usage, reason, error, items)
    return terminal, refused


def _read_event(
    name: str, data: Mapping[str, Any], declared: frozenset[str] | None = None
) -> tuple[_Op, list[str]]:
    """What the event ``name`` carries; ``declared``: the tools the response listed as
    the client's (see :func:`_declared_tools`)."""
    if name in _DELTAS or name in _DONES:
        kind, index_field, text_field = _DELTAS.get(name) or _DONES[name]
        item_id = opt_str(data.get("item_id"), "item_id")
        output_index = opt_int(data.get("output_index"), "output_index")
        index = opt_int(data.get(index_field), index_field)
        text = req_str(data.get(text_field), text_field)
        return _Part(kind, item_id, output_index, index, text, done=name in _DONES), []
    if name in ("response.function_call_arguments.delta", "response.function_call_arguments.done"):
        done = name.endswith(".done")
        output_index = opt_int(data.get("output_index"), "output_index")
        item_id = opt_str(data.get("item_id"), "item_id")
        if output_index is None and item_id is None:
            raise Malformed("neither output_index nor item_id")
        text = req_str(data.get("arguments" if done else "delta"), "arguments" if done else "delta")
        return _Arguments(output_index, item_id, text, done), []
    if name in ("response.output_item.added", "response.output_item.done"):
        output_index = opt_int(data.get("output_index"), "output_index")
        done = name.endswith(".done")
        item = _read_item(data.get("item"), output_index, "item", whole=done, declared=declared)
        return _ItemEvent(item, done=done), []
    if name in ("response.content_part.done", "response.reasoning_summary_part.done"):
        summary = name == "response.reasoning_summary_part.done"
        item_id = opt_str(data.get("item_id"), "item_id")
        output_index = opt_int(data.get("output_index"), "output_index")
        index_field = "summary_index" if summary else "content_index"
        index = opt_int(data.get(index_field), index_field)
        part = req_map(data.get("part"), "part")
        part_type = opt_str(part.get("type"), "part.type")
        if summary:
            kind, text_field = "summary", "text"
        elif part_type is not None and part_type in _PART_TYPES:
            kind, text_field = _PART_TYPES[part_type]
        else:
            return None, []  # no text of its own to publish
        whole = opt_str(part.get(text_field), f"part.{text_field}")
        if whole is None:
            return None, []
        # A message part's citations, which may come here alone (no annotation.added
        # events): published while its block is open, once each.
        found = () if summary else opt_list(part.get("annotations"), "part.annotations") or ()
        annotations = [annotation(a, f"part.annotations[{j}]") for j, a in enumerate(found)]
        return _Part(kind, item_id, output_index, index, whole, True, annotations or None), []
    if name in _LIFECYCLE:
        response, model, response_id = _read_response(data)
        return _Lifecycle(model, response_id, _declared_tools(response)), []
    if name in _TERMINAL:
        return _read_terminal(data, _TERMINAL[name], declared)
    if name == "error":
        # The Responses API puts code and message at the top; some servers nest them in
        # an "error" object, as chat completions does.
        nested = data.get("error")
        nested = nested if isinstance(nested, Mapping) else {}
        return _ErrorEvent(
            _error_text(data.get("code"))
            or _error_text(nested.get("code"))
            or _error_text(nested.get("type"))
            or "api_error",
            _error_text(data.get("message"))
            or _error_text(nested.get("message"))
            or FAILED_MESSAGE,
        ), []
    if name == "response.output_text.annotation.added":
        return _Annotation(
            opt_str(data.get("item_id"), "item_id"),
            opt_int(data.get("output_index"), "output_index"),
            opt_int(data.get("content_index"), "content_index"),
            opt_int(data.get("annotation_index"), "annotation_index"),
            annotation(data.get("annotation"), "annotation"),
        ), []
    if name in _QUIET or name.startswith(_HOSTED_PROGRESS):
        return None, []
    return _Unmodelled(name), []


# The deltas, most of a response's events, read straight off the event: a dict by key, a
# pydantic model (the SDK's event objects) by attribute, without the whole-event reader
# and without a model_dump. Only the exact types the reader takes are read here; an event
# with any field of another type (or a mapping of another class, an object of another
# kind) goes the whole way, so what is read and what is refused stay the reader's.
_QUICK: Final[dict[str, tuple[str, str | None]]] = {
    # event type -> (part kind, or "arguments" for a call's; the field of its part index)
    "response.output_text.delta": ("message", "content_index"),
    "response.refusal.delta": ("message", "content_index"),
    "response.reasoning_summary_text.delta": ("summary", "summary_index"),
    "response.reasoning_text.delta": ("reasoning", "content_index"),
    "response.function_call_arguments.delta": ("arguments", None),
}

# A delta read quickly: (part kind, item id, output index, part index, text).
_Delta: TypeAlias = tuple[str, str | None, int | None, int | None, str]

_pydantic_models: dict[type, bool] = {}


# The fields the fast path reads.
_QUICK_FIELDS: Final = frozenset(
    {"type", "delta", "item_id", "output_index", "content_index", "summary_index"}
)


def _is_model(cls: type) -> bool:
    """Whether ``cls`` is a pydantic model whose ``model_dump`` is pydantic's own and
    whose fields the fast path reads have no default (so a field is in its ``__dict__``
    exactly when ``model_dump(exclude_unset=True)`` would hold it), remembered per
    class."""
    known = _pydantic_models.get(cls)
    if known is None:
        # Never imported here: without pydantic loaded, no object is one of its models.
        base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
        known = (
            isinstance(base, type)
            and issubclass(cls, base)
            and getattr(cls, "model_dump", None) is getattr(base, "model_dump", None)
            and all(
                field.is_required()
                for name, field in cls.model_fields.items()  # type: ignore[attr-defined]
                if name in _QUICK_FIELDS
            )
        )
        _pydantic_models[cls] = known
    return known


def _quick_delta(raw: object) -> _Delta | None:
    """A delta event's fields, when it is one and every field is of the type the whole
    reader takes; None sends the event the whole way."""
    if type(raw) is dict:
        data: dict[str, Any] = raw
    else:
        known = _pydantic_models.get(type(raw))
        if not (known or (known is None and _is_model(type(raw)))):
            return None
        # A pydantic model keeps its fields' values in its __dict__; a required field
        # never set is absent, as model_dump(exclude_unset=True) leaves it out.
        data = raw.__dict__
    name = data.get("type")
    spec = _QUICK.get(name) if type(name) is str else None
    if spec is None:
        return None
    text = data.get("delta")
    item_id = data.get("item_id")
    output_index = data.get("output_index")
    index = None if spec[1] is None else data.get(spec[1])
    # Each as the whole reader takes it: a str (no lone surrogate), an int (not a bool)
    # within 64 bits, None where a field may be absent.
    if type(text) is not str or (not text.isascii() and has_lone_surrogate(text)):
        return None
    if item_id is not None and (
        type(item_id) is not str or (not item_id.isascii() and has_lone_surrogate(item_id))
    ):
        return None
    if output_index is not None and (
        type(output_index) is not int or not -MAX_COUNT - 1 <= output_index <= MAX_COUNT
    ):
        return None
    if index is not None and (type(index) is not int or not -MAX_COUNT - 1 <= index <= MAX_COUNT):
        return None
    if spec[1] is None and output_index is None and item_id is None:
        return None  # a call's fragment must name its call: the reader refuses it
    return (spec[0], item_id, output_index, index, text)


# -- publishing one response ------------------------------------------------------------


class _Call(HeldCall):
    """One function call of the response, with the keys its events name it by."""

    __slots__ = ("item_id", "output_index")

    def __init__(self, ordinal: int) -> None:
        super().__init__(ordinal)
        self.output_index: int | None = None
        self.item_id: str | None = None


@dataclass(slots=True)
class _Piece:
    """Text or reasoning waiting to go out, or (``hosted``) a hosted tool's item whole, or
    (``citation``) a citation of the text before it."""

    key: _PartKey
    text: str
    hosted: _HostedItem | None = None
    block: dict[str, Any] | None = None  # a block carried whole (a _BlockItem's)
    citation: dict[str, Any] | None = None  # an annotation as the provider gave it
    signature: str | None = None  # a reasoning item's encrypted_content


def _complete_json(arguments: str) -> bool:
    return bool(arguments.strip()) and parse_arguments(arguments) is not None


class _Reader:
    """The state of one response while its events are read and published.

    What the model sends goes out in output order, live, except what waits for an open
    function call whose arguments are not whole yet (its done event has not come, and
    they are not whole JSON): ``HeldCalls`` (in ``essessey.adapters._tool_calls``) holds
    it, in output order, and publishes it once they are, so that no fragment the
    provider sent is lost.
    """

    __slots__ = (
        "_anchor_of_index",
        "_anchor_of_item",
        "_approvals",
        "_by_index",
        "_by_item",
        "_cited",
        "_declared",
        "_differs",
        "_early_citations",
        "_hosted",
        "_hosted_calls",
        "_last_call",
        "_last_call_at",
        "_last_key",
        "_last_received",
        "_last_where",
        "_logged_types",
        "_open_part",
        "_opener",
        "_position",
        "_received",
        "_reused",
        "_signed",
        "_text",
        "_thinking",
        "ended",
        "error",
        "held",
        "incomplete_reason",
        "model",
        "response_id",
        "rounds",
        "status",
        "usage",
    )

    def __init__(
        self,
        rounds: RoundStream,
        id_prefix: str,
        *,
        opener: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.rounds = rounds
        # Held pieces and calls go out in output order (then arrival order).
        self.held: HeldCalls[_Piece] = HeldCalls(
            rounds,
            id_prefix,
            self._publish,
            logger=logger,
            noun="function call",
            where="event #%d",
            before_start=self._before_start,
        )
        # Called once before the first thing goes out (publish sends the preamble).
        self._opener = opener
        self._position = -1
        self._by_index: dict[int, _Call] = {}
        self._by_item: dict[str, _Call] = {}
        self._anchor_of_index: dict[int, _Anchor] = {}
        self._anchor_of_item: dict[str, _Anchor] = {}
        self._reused: set[str] = set()  # item ids that name more than one item
        self._hosted_calls: list[str] = []  # the call_id of each hosted call published
        self._received: dict[_PartKey, list[str]] = {}
        self._differs: set[_PartKey] = set()
        # The items published whole (hosted tools, compactions), each once.
        self._hosted: set[_PartKey] = set()
        self._signed: set[_PartKey] = set()  # the reasoning items whose signature went
        self._cited: dict[_PartKey, int] = {}  # each text part's citations taken
        # Citations of a text part that has no text yet, given as the provider sent them:
        # they go out after its first text (a citations_delta needs its block open).
        self._early_citations: dict[_PartKey, list[dict[str, Any]]] = {}
        # The text or reasoning part whose block is the last one published (None when
        # something else went out since): each part is a block of its own, a citation
        # goes to an open text part's block, a signature to an open reasoning part's.
        self._open_part: _PartKey | None = None
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._logged_types: set[tuple[str, str]] = set()
        # The part and the call the last deltas named, with what they were found as: a
        # part's deltas come in a row, and finding it again costs more than the rest.
        # Exact: _key gives the same key for the same names once it has seen them (its
        # maps only gain entries), and _call_for's maps change only in _call_for.
        self._last_where: tuple[str, str | None, int | None, int | None] | None = None
        self._last_key: _PartKey = ("", ("item", None), 0)
        self._last_received: list[str] = []
        self._last_call_at: tuple[int | None, str | None] | None = None
        self._last_call: _Call | None = None
        self._approvals: dict[int, str] = {}  # a call's ordinal: its approval request's id
        # The tools the response lists as the client's (see _declared_tools).
        self._declared: frozenset[str] | None = None
        self.ended = False  # a terminal event (or an error) was read
        self.error: ProviderStreamError | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.status: str | None = None
        self.incomplete_reason: str | None = None
        self.usage: dict[str, int] = {}

    # -- the loop --------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether anything read waits to go out."""
        return self.held.pending

    async def feed(self, raw: Any) -> None:
        """Read the next event and publish what it carries."""
        self._position += 1
        if not self.ended:
            quick = _quick_delta(raw)
            if quick is not None:
                await self._delta(*quick)
                return
        name: object = None
        try:
            data = as_mapping(raw, "event")
            name = data.get("type")
            if name is None:
                raise Malformed("it has no type")
            if not isinstance(name, str):
                raise Malformed(f"type is a {kind(name)}, not a string")
            op, refused = _read_event(name, data, self._declared)
        except Malformed as exc:
            self._skip(name, str(exc))
            return
        for reason in refused:
            self._warn(name, f"{reason}; that output item is ignored")
        if op is None:
            return
        if self.ended:
            self._skip(name, "it came after the response ended")
            return
        await self._apply(name, op)

    async def _apply(self, name: str, op: _Op) -> None:
        if isinstance(op, _Part):
            if op.done:
                await self._settle_part(op)
            else:
                await self._delta(op.kind, op.item_id, op.output_index, op.index, op.text)
        elif isinstance(op, _Arguments):
            if op.done:
                await self._call_done(self._call_for(op.output_index, op.item_id), op.text)
            else:
                await self._delta("arguments", op.item_id, op.output_index, None, op.text)
        elif isinstance(op, _ItemEvent):
            await self._item(op.item, done=op.done)
        elif isinstance(op, _Lifecycle):
            if op.declared is not None:
                self._declared = op.declared
            self._lifecycle(op.model, op.response_id)
            if self.model is not None:
                await self._ready()  # message_start can name the model now
        elif isinstance(op, _Terminal):
            await self._terminal(op)
        elif isinstance(op, _ErrorEvent):
            self._fail(name, ProviderStreamError(op.error_type, op.message))
        elif isinstance(op, _Annotation):
            part = _Part("message", op.item_id, op.output_index, op.index, "")
            await self._cite(self._key(part), op.output_index, [op.annotation], op.annotation_index)
        elif isinstance(op, _Unmodelled):
            self._once("event", op.name)

    async def _delta(
        self,
        kind: str,
        item_id: str | None,
        output_index: int | None,
        index: int | None,
        text: str,
    ) -> None:
        """A delta of a text or reasoning part (``kind``), or of a call's arguments
        (``"arguments"``): straight to the round when it goes out now (its part's block,
        or its open call's, with nothing waiting), else through what holds it."""
        held = self.held
        if kind == "arguments":
            call = self._call_for(output_index, item_id)
            if text and call is held.open and not call.done and not held.pending:
                await self.rounds.tool_call_delta(call.slot, text)
                call.parts.append(text)
            else:
                await self._fragment(call, text)
            return
        where = (kind, item_id, output_index, index)
        if where == self._last_where:
            key, received = self._last_key, self._last_received
        else:
            key = self._key(_Part(kind, item_id, output_index, index, text))
            received = self._received.setdefault(key, [])
            self._last_where, self._last_key, self._last_received = where, key, received
        received.append(text)
        if not text:
            return
        if held.open is None and not held.pending and self._opener is None:
            if kind == "message" and key == self._open_part:
                # _publish_text's case of nearly every delta, one call fewer per delta
                await self.rounds.delta(text=text)
                self._text.append(text)
            else:
                await self._publish_text(key, text)
        else:
            await held.put(_Piece(key, text), output_index)

    async def finish(self) -> StreamedResponse:
        """End of the events: publish what waits, then declare the round's calls."""
        await self.held.advance(final=True)
        self.held.log_late()
        if self._early_citations:
            logger.warning(
                "%d citation(s) came before their text part's text, which never came; "
                "not published",
                sum(len(cited) for cited in self._early_citations.values()),
            )
            self._early_citations.clear()
        await self._ready()
        result = self.summary()
        await self.rounds.assistant_message(
            [ToolCallRequest(c.id, c.name, c.arguments) for c in result.tool_calls]
        )
        return result

    def end_of_events(self) -> None:
        """The events ended: without a terminal event the stream was cut short, which
        is a failure (an ``api_error``), never a silent success."""
        if not self.ended:
            logger.warning(
                "the Responses API stream ended after %d events without a terminal event",
                self._position + 1,
            )
            self.ended = True
            self.error = ProviderStreamError("api_error", INCOMPLETE_MESSAGE)

    def summary(self) -> StreamedResponse:
        """What went out so far."""
        calls = self.held.published()
        approvals = [
            (self._approvals[call.ordinal], call.id)
            for call in self.held.started
            if call.ordinal in self._approvals
        ]
        return StreamedResponse(
            text="".join(self._text),
            thinking="".join(self._thinking),
            tool_calls=calls,
            status=self.status,
            incomplete_reason=self.incomplete_reason,
            stop_reason=map_stop_reason(
                self.status, self.incomplete_reason, tool_calls=bool(calls)
            ),
            usage=dict(self.usage),
            model=self.model,
            response_id=self.response_id,
            approvals=approvals,
            hosted_calls=list(self._hosted_calls),
        )

    # -- logging ---------------------------------------------------------------------

    def _skip(self, name: object, reason: str) -> None:
        logger.warning(
            "skipping Responses API event #%d (%s): %s", self._position, dotted_label(name), reason
        )

    def _warn(self, name: object, what: str) -> None:
        logger.warning("Responses API event #%d (%s): %s", self._position, dotted_label(name), what)

    def _not_carried(self, item_type: str, field: str) -> None:
        # Once per response and field: the protocol's blocks have no place for it (a
        # call goes out under its tool's name, a message's text as text).
        if (field, item_type) in self._logged_types:
            return
        self._logged_types.add((field, item_type))
        logger.info(
            "Responses API %s items carry a %s (first at event #%d): not published",
            dotted_label(item_type),
            field,
            self._position,
        )

    def _once(self, what: str, type_name: str) -> None:
        # One line per type: a hosted tool's call streams many events of a few types.
        if (what, type_name) in self._logged_types:
            return
        self._logged_types.add((what, type_name))
        kind = "events" if what == "event" else "output items"
        logger.info(
            "skipping Responses API %s of type %s (first at event #%d): not published",
            kind,
            dotted_label(type_name),
            self._position,
        )

    # -- the response ----------------------------------------------------------------

    async def _ready(self) -> None:
        opener = self._opener
        if opener is not None:
            self._opener = None
            await opener()

    def _lifecycle(self, model: str | None, response_id: str | None) -> None:
        if self.model is None and model:
            self.model = model
        if self.response_id is None and response_id:
            self.response_id = response_id

    def _fail(self, name: str, error: ProviderStreamError) -> None:
        # The response ends here: nothing after it is read (see read_all).
        self._warn(name, f"the response failed with {log_label(error.error_type)}")
        self.ended = True
        self.error = error

    async def _terminal(self, op: _Terminal) -> None:
        self._lifecycle(op.model, op.response_id)
        if op.usage is not None:
            self.usage = op.usage
        if op.error is not None:
            self._fail(f"response.{op.status}", ProviderStreamError(*op.error))
            return
        self.ended = True
        # Whatever the events before left out of the output goes out now.
        for _, item in op.items:
            await self._item(item, done=True)
        self.status = op.status
        self.incomplete_reason = op.incomplete_reason

    async def _item(self, item: _Item, *, done: bool) -> None:
        if not done and not isinstance(item, _OtherItem):
            self._note_added(item.item_id, item.output_index)
        if isinstance(item, _CallItem):
            call = self._call_for(item.output_index, item.item_id)
            if item.call_id and call.given_id is None:
                call.given_id = item.call_id
            if item.name and not call.name:
                call.name = item.name
            if item.item_type and call.item_type is None:
                call.item_type = item.item_type
            if item.approval is not None:
                self._approvals.setdefault(call.ordinal, item.approval)
            if item.caller is not None and call.caller is None:
                call.caller = item.caller
            if item.namespace:
                self._not_carried(item.item_type or "function_call", "namespace")
            if done:
                await self._call_done(call, item.arguments or "")
            else:
                # A call announced with arguments: they are its first fragment.
                if item.arguments and not call.parts:
                    await self._fragment(call, item.arguments)
                else:
                    await self.held.advance()
        elif isinstance(item, _ContentItem):
            if item.phase:
                self._not_carried("message", "phase")
            # An item added says nothing yet (its parts stream); an item done is whole.
            if done:
                for part in item.parts:
                    await self._settle_part(part)
                if item.encrypted is not None:
                    await self._sign(item, item.encrypted)
        elif isinstance(item, _HostedItem):
            if done and item.item is not None:
                anchor = self._key(_Part("hosted", item.item_id, item.output_index, 0, ""))
                if anchor not in self._hosted:  # its done and the terminal output: once
                    self._hosted.add(anchor)
                    await self.held.put(_Piece(anchor, "", item), item.output_index)
        elif isinstance(item, _BlockItem):
            if done and item.block is not None:
                anchor = self._key(_Part("block", item.item_id, item.output_index, 0, ""))
                if anchor not in self._hosted:  # its done and the terminal output: once
                    self._hosted.add(anchor)
                    piece = _Piece(anchor, "", block=item.block)
                    await self.held.put(piece, item.output_index)
        else:
            self._once("item", item.item_type)

    def _note_added(self, item_id: str | None, output_index: int | None) -> None:
        """An item added at an output_index of its own under an id that already names the
        item at another index: the id names more than one item (the Agents SDK gives
        every item of a Chat Completions stream one id), so from here on only the indexes
        tell the items apart."""
        if item_id is None or output_index is None or item_id in self._reused:
            return
        anchor = self._anchor_of_item.get(item_id)
        call = self._by_item.get(item_id)
        if (
            anchor is not None
            and anchor != self._anchor_of_index.get(output_index, ("index", output_index))
        ) or (call is not None and call.output_index not in (None, output_index)):
            self._reused.add(item_id)

    # -- text and reasoning ----------------------------------------------------------

    def _key(self, part: _Part) -> _PartKey:
        """The part's key: its item found by output_index, by item id where the index is
        absent; what one event names the item by is remembered for the others, so an id
        renamed or minted anew at a known index is the same item. An id already seen
        at another index wins over the index (a terminal output that lists only some
        items, at other positions), unless it names more than one item."""
        output_index, item_id = part.output_index, part.item_id
        found = (
            None
            if item_id is None or item_id in self._reused
            else self._anchor_of_item.get(item_id)
        )
        if found is None and output_index is not None:
            found = self._anchor_of_index.get(output_index)
        anchor: _Anchor
        if found is not None:
            anchor = found
        elif output_index is not None:
            anchor = ("index", output_index)
        else:
            anchor = ("item", item_id)
        if output_index is not None:
            self._anchor_of_index.setdefault(output_index, anchor)
        if item_id is not None:
            self._anchor_of_item.setdefault(item_id, anchor)
        return (part.kind, anchor, part.index or 0)

    async def _content(self, key: _PartKey, text: str, output_index: int | None) -> None:
        if text:
            await self.held.put(_Piece(key, text), output_index)

    async def _sign(self, item: _ContentItem, encrypted: str) -> None:
        """A reasoning item's encrypted content, once (its done and the terminal output
        both carry it), after its text."""
        key = self._key(_Part("signature", item.item_id, item.output_index, 0, ""))
        if key not in self._signed:
            self._signed.add(key)
            await self.held.put(_Piece(key, "", signature=encrypted), item.output_index)

    async def _publish_signature(self, anchor: _Anchor, signature: str) -> None:
        """The signature of the item's thinking block while it is the open block, else
        (an item with no text, or whose block closed) a ``redacted_thinking`` block: the
        protocol's two ways to carry reasoning a client cannot read but must send back."""
        open_part = self._open_part
        if open_part is not None and open_part[0] != "message" and open_part[1] == anchor:
            await self.rounds.delta(signature=signature)
        else:
            await self._whole_block({"type": "redacted_thinking", "data": signature})

    async def _publish(self, piece: _Piece) -> None:
        await self._ready()
        if piece.signature is not None:
            await self._publish_signature(piece.key[1], piece.signature)
            return
        if piece.hosted is not None:
            await self._publish_hosted(piece.hosted)
            return
        if piece.block is not None:
            await self._whole_block(piece.block)
            return
        if piece.citation is not None:
            await self._publish_citation(piece.key, piece.citation)
            return
        await self._publish_text(piece.key, piece.text)

    async def _publish_citation(self, key: _PartKey, given: dict[str, Any]) -> None:
        """A citation of the text part ``key``, on that part's block: now when it is the
        open block, after its first text when it has none yet; a part whose block closed
        cannot take it (logged, left out)."""
        text = "".join(self._received.get(key, ()))
        if key == self._open_part:
            cited = citation(given, text)
            await self.rounds.raw_delta({"type": "citations_delta", "citation": cited})
        elif not text:
            self._early_citations.setdefault(key, []).append(given)
        else:
            logger.warning(
                "a %s citation came after its text block closed; not published",
                dotted_label(given.get("type")),
            )

    async def _whole_block(self, block: dict[str, Any]) -> None:
        """A block carried whole in its start (redacted reasoning, a hosted tool's call
        or result, a compaction): it closes the open text or reasoning part's block."""
        await self.rounds.block_start(block)
        await self.rounds.block_stop()
        self._open_part = None

    async def _publish_text(self, key: _PartKey, text: str) -> None:
        """Text or reasoning of the part ``key``, into its block."""
        open_part = self._open_part
        if open_part is not None and key != open_part:
            # Another part (summary parts each open with their own heading, a preamble
            # and its answer): a block of its own, so the parts do not run together
            # ("**A****B**") and nothing is added to what the provider sent.
            await self.rounds.close_block()
        if key[0] == "summary" and key != open_part:
            # A summary of the model's reasoning, not the reasoning itself: its block
            # says so, and the Responses dialect writes it back as a summary part.
            start = thinking_block_start(self.rounds.publisher.dialect)
            await self.rounds.open_content({**start, "summary": True})
        self._open_part = key
        if key[0] == "message":
            await self.rounds.delta(text=text)
            self._text.append(text)
            for given in self._early_citations.pop(key, ()):
                await self._publish_citation(key, given)
        else:
            await self.rounds.delta(reasoning=text)
            self._thinking.append(text)

    async def _publish_hosted(self, hosted: _HostedItem) -> None:
        """A hosted tool as the Anthropic format has its server tools: a
        ``server_tool_use`` block with what it was asked, then its result block with the
        provider's item whole (docs/adapters.md)."""
        item = hosted.item or {}
        name, fields = hosted.name, _HOSTED[hosted.item_type][1]
        tool_id = hosted.item_id or f"hosted_{len(self._hosted)}"
        use: dict[str, Any] = {"type": "server_tool_use", "id": tool_id, "name": name}
        use["input"] = {key: item[key] for key in fields if key in item}
        use["item_type"] = hosted.item_type  # what a dialect writes it back as
        call_id = item.get("call_id")
        if isinstance(call_id, str) and call_id:
            self._hosted_calls.append(call_id)
        await self._whole_block(use)
        result = {"type": f"{name}_tool_result", "tool_use_id": tool_id, "content": item}
        await self._whole_block(result)

    async def _cite(
        self,
        key: _PartKey,
        output_index: int | None,
        annotations: list[dict[str, Any]],
        first: int | None = None,
    ) -> None:
        """Publish the citations of a text part not published yet: ``annotations`` from
        its ``first`` (the annotation_index of one event, or all of a whole part's)."""
        taken = self._cited.get(key, 0)
        start = 0 if first is None else first
        for n, given in enumerate(annotations, start):
            if n < taken:
                continue  # its event came before the part's whole list
            self._cited[key] = n + 1
            await self.held.put(_Piece(key, "", citation=given), output_index)

    async def _settle_part(self, part: _Part) -> None:
        await self._settle_text(part)
        if part.annotations:
            key = self._key(part)
            await self._cite(key, part.output_index, part.annotations)

    async def _settle_text(self, part: _Part) -> None:
        key = self._key(part)
        received = self._received.setdefault(key, [])
        got = "".join(received)
        if part.text == got:
            return
        if part.text.startswith(got):
            # The deltas left the rest out (or there were none): it goes out now.
            rest = part.text[len(got) :]
            received.append(rest)
            await self._content(key, rest, part.output_index)
        elif key not in self._differs:
            self._differs.add(key)
            logger.warning(
                "event #%d: a %s part's done text (%d characters) differs from its deltas "
                "(%d characters); the streamed text is kept",
                self._position,
                part.kind,
                len(part.text),
                len(got),
            )

    # -- function calls --------------------------------------------------------------

    def _call_for(self, output_index: int | None, item_id: str | None) -> _Call:
        at = (output_index, item_id)
        call = self._last_call
        if call is not None and at == self._last_call_at:
            return call  # what the last lookup found: the maps changed only in it
        call = self._find_call(output_index, item_id)
        self._last_call, self._last_call_at = call, at
        return call

    def _find_call(self, output_index: int | None, item_id: str | None) -> _Call:
        call = self._by_index.get(output_index) if output_index is not None else None
        if call is None and item_id and item_id not in self._reused:
            call = self._by_item.get(item_id)
        if call is None:
            call = _Call(len(self.held.calls))
            self.held.add(call, output_index)
        if output_index is not None and call.output_index is None:
            call.output_index = output_index
            self._by_index.setdefault(output_index, call)
        if item_id and call.item_id is None:
            call.item_id = item_id
            self._by_item.setdefault(item_id, call)
        return call

    async def _fragment(self, call: _Call, text: str) -> None:
        if not text:
            return
        await self.held.fragment(call, text, self._position)
        if self.held.pending:
            await self.held.advance()

    async def _call_done(self, call: _Call, full: str) -> None:
        if not call.done:
            await self._settle_arguments(call, full)
            call.done = True
        await self.held.advance()

    async def _settle_arguments(self, call: _Call, full: str) -> None:
        """Reconcile the fragments with the done value (see :func:`stream_round`)."""
        got = "".join(call.parts)
        if not full or full == got:
            return
        if full.startswith(got):
            # The fragments left the rest out (or there were none): one more fragment
            # (one that cannot go out when the call closed already, with whole JSON).
            await self.held.fragment(call, full[len(got) :], self._position)
            return
        if _complete_json(got):
            logger.info(
                "function call %d: its done arguments (%d characters) differ from the "
                "streamed ones (%d characters), which are whole JSON and kept",
                call.ordinal,
                len(full),
                len(got),
            )
        elif call.slot < 0:
            logger.warning(
                "function call %d: its streamed arguments (%d characters) are not whole "
                "JSON; the done value (%d characters) replaces them",
                call.ordinal,
                len(got),
                len(full),
            )
            call.parts = [full]
        else:
            logger.warning(
                "function call %d: its streamed arguments (%d characters) went out and "
                "differ from the done value (%d characters); they are kept",
                call.ordinal,
                len(got),
                len(full),
            )

    async def _before_start(self) -> None:
        await self._ready()
        # A call's block closes the open part's: text or reasoning after it opens a new one.
        self._open_part = None
