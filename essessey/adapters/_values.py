"""What a value read from a provider must be before it is published, and the readers of
its typed fields that the adapters share.

Python's json module (and the SDKs built on it) reads two things no JSON writer takes
back: a ``"\\ud800"`` escape becomes a lone surrogate, which no UTF-8 text (so no
published event) can carry, and an integer of any size, where orjson writes none past
64 bits. Nor does orjson write what is nested past 255 levels, though it reads 1,024. The
adapters refuse all three at the edge, before anything of the value went out; a
framework's own values (a tool's output) go out as exact JSON text instead.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import orjson

from essessey.adapters._message import parse_arguments

__all__ = [
    "MAX_COUNT",
    "CallIds",
    "Malformed",
    "add_count",
    "arguments_complete",
    "as_mapping",
    "call_caller",
    "clean",
    "count",
    "fits_count",
    "has_lone_surrogate",
    "json_text",
    "json_value",
    "kind",
    "opt_int",
    "opt_list",
    "opt_map",
    "opt_str",
    "output_text",
    "read_all",
    "replace_surrogates",
    "req_map",
    "req_str",
    "token_counts",
    "writable",
]

logger = logging.getLogger("essessey.adapters")

MAX_COUNT: Final = 2**63 - 1
"""The largest integer orjson writes (a signed 64-bit one)."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point (it cannot be written as UTF-8)."""
    # isascii() is O(1) in CPython: the common case costs nothing.
    return not text.isascii() and _SURROGATE.search(text) is not None


def replace_surrogates(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def clean(text: str) -> str:
    """``text`` as UTF-8 carries it: a lone surrogate replaced by U+FFFD (the common
    case, none, costs one test)."""
    return replace_surrogates(text) if has_lone_surrogate(text) else text


def fits_count(value: int) -> bool:
    """Whether the integer ``value`` can be written back (within 64 bits, signed)."""
    return -MAX_COUNT - 1 <= value <= MAX_COUNT


def add_count(into: dict[str, int], key: str, value: int) -> None:
    """Add ``value`` to the token count ``into[key]``; a total past 64 bits cannot be
    written, and is left out with a warning."""
    total = into.get(key, 0) + value
    if fits_count(total):
        into[key] = total
    else:
        into.pop(key, None)
        logger.warning("a usage count (%s) past 64 bits is not published", key)


# -- typed fields of a provider's JSON ---------------------------------------------------
#
# The OpenAI adapters read each chunk or event whole, field by field, before anything of
# it is published; a field of the wrong type makes the whole chunk malformed (skipped with
# a warning naming the field and the type, never the value).


class Malformed(Exception):
    """A provider chunk or event that cannot be read; the message names the field and
    its type, never a value."""


def kind(value: object) -> str:
    """A value's type name, for a reason in a log line."""
    return type(value).__name__


def opt_str(value: object, where: str) -> str | None:
    """A string field (None when absent); a lone surrogate makes it malformed."""
    if value is None:
        return None
    if isinstance(value, str):
        if has_lone_surrogate(value):
            raise Malformed(f"{where} holds a lone surrogate")
        return value
    raise Malformed(f"{where} is a {kind(value)}, not a string")


def req_str(value: object, where: str) -> str:
    """A string field that must be there."""
    text = opt_str(value, where)
    if text is None:
        raise Malformed(f"{where} is missing")
    return text


def opt_int(value: object, where: str) -> int | None:
    """An integer field (None when absent) that fits in 64 bits."""
    if value is None:
        return None
    if type(value) is not int:
        raise Malformed(f"{where} is a {kind(value)}, not an integer")
    if not fits_count(value):
        raise Malformed(f"{where} does not fit in 64 bits")
    return value


def count(value: object, where: str) -> int | None:
    """A token count: a non-negative integer field, or None when absent."""
    number = opt_int(value, where)
    if number is not None and number < 0:
        raise Malformed(f"{where} is negative")
    return number


def opt_map(value: object, where: str) -> Mapping[str, Any] | None:
    """An object field (None when absent)."""
    if value is None or isinstance(value, Mapping):
        return value
    raise Malformed(f"{where} is a {kind(value)}, not an object")


def req_map(value: object, where: str) -> Mapping[str, Any]:
    """An object field that must be there."""
    mapping = opt_map(value, where)
    if mapping is None:
        raise Malformed(f"{where} is missing")
    return mapping


def opt_list(value: object, where: str) -> list[Any] | tuple[Any, ...] | None:
    """A list field (None when absent)."""
    if value is None or isinstance(value, list | tuple):
        return value
    raise Malformed(f"{where} is a {kind(value)}, not a list")


# How deep a value passed on whole sits in an event's payload: a block's field
# (``content_block.content``) or a delta's (``delta.citation``). orjson's nesting limit
# counts the levels around it.
_FIELD_DEPTH: Final = 2


def _dumps_at(value: object, depth: int, default: Callable[[Any], Any] | None = None) -> bytes:
    """``value`` written ``depth`` levels down (the levels an event's payload puts around
    it count toward orjson's nesting limit); orjson's JSONEncodeError, a TypeError, when
    it cannot be."""
    nested = value
    for _ in range(depth):
        nested = [nested]
    return orjson.dumps(nested, default=default)


def writable(value: Any, where: str, *, depth: int = _FIELD_DEPTH) -> Any:
    """``value`` as it is, when orjson can write it ``depth`` levels down in an event's
    payload (a block's or a delta's field by default; for a value passed on whole, not
    read field by field): no lone surrogate, no integer past 64 bits, not nested too
    deeply."""
    try:
        _dumps_at(value, depth)
    except TypeError:
        raise Malformed(f"{where} cannot be written as JSON") from None
    return value


def call_caller(value: object, where: str) -> dict[str, Any] | None:
    """A tool call's ``caller`` (what made it when the model did not: a provider's
    programmatic tool calling), None when it names none; raises :class:`Malformed` for
    one that is no object orjson can write (the adapter then sends the call without it,
    with a warning)."""
    if value is None:
        return None
    return dict(writable(req_map(value, f"{where}.caller"), f"{where}.caller"))


# -- a framework's values ----------------------------------------------------------------
#
# What a framework hands over (a tool's output, arguments a model gave whole) is a
# Python value that ran: refusing it would lose what happened. It goes out as exact
# JSON text instead, which any value has.


def json_text(value: object) -> str:
    """A framework's value as JSON text: what is not JSON as its ``str()``; a value
    orjson cannot write (an integer past 64 bits, a lone surrogate, deep nesting) as the
    json module writes it, the integer's digits kept and the surrogate escaped."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        pass
    try:
        return json.dumps(value, default=str)
    except (ValueError, RecursionError):  # circular, or deeper than the interpreter goes
        pass
    try:
        return json.dumps(str(value))
    except RecursionError:
        return json.dumps(type(value).__name__)


def json_value(value: object, *, depth: int = _FIELD_DEPTH) -> Any:
    """A framework's value as JSON values for an event's payload, ``depth`` levels down
    (a block's or a delta's field by default; what is not JSON as its ``str()``); one
    that cannot be written there goes as its :func:`json_text`, a string."""
    try:
        found = orjson.loads(_dumps_at(value, depth, default=str))
    except TypeError:
        return json_text(value)
    for _ in range(depth):
        found = found[0]
    return found


def output_text(output: object) -> str:
    """A tool's output as its result's text: a string as it is (a lone surrogate, which
    no UTF-8 text carries, replaced by U+FFFD), anything else as :func:`json_text`."""
    return clean(output) if isinstance(output, str) else json_text(output)


def as_mapping(raw: object, what: str) -> Mapping[str, Any]:
    """A chunk or event as a mapping: as it is, or an SDK object through its
    ``model_dump``; anything else is malformed (``what`` names it in the reason)."""
    if not isinstance(raw, Mapping):
        dump = getattr(raw, "model_dump", None)
        if callable(dump):
            try:
                try:
                    # exclude_unset keeps the keys the provider sent; warnings off, since
                    # an object the SDK built without validation may hold other types.
                    raw = dump(mode="json", exclude_unset=True, warnings=False)
                except TypeError:
                    raw = dump()  # a model_dump that takes no options
            except Exception as exc:
                raise Malformed(f"model_dump() failed with {kind(exc)}") from None
    if not isinstance(raw, Mapping):
        raise Malformed(f"the {what} is a {kind(raw)}, not a mapping")
    return raw


def token_counts(
    given_input: int | None, cached: int | None, output: int | None, reasoning: int | None
) -> dict[str, int]:
    """OpenAI's token counts in the protocol's (Anthropic's) terms, each only when sent.

    OpenAI's input count includes the cached tokens; Anthropic's ``input_tokens`` does
    not (cache reads are counted apart, as ``cache_read_input_tokens``), and clients add
    the two up.
    """
    counts: dict[str, int] = {}
    if given_input is not None:
        counts["input_tokens"] = max(given_input - (cached or 0), 0)
    if cached is not None:
        counts["cache_read_input_tokens"] = cached
    if output is not None:
        counts["output_tokens"] = output
    if reasoning is not None:
        counts["reasoning_tokens"] = reasoning
    return counts


def arguments_complete(parts: list[str]) -> bool:
    """Whether a tool call's argument fragments so far make a whole JSON object or array.

    Parsed only when the last non-blank fragment ends like one: a call streamed in many
    fragments is not parsed again at every one of them.
    """
    for part in reversed(parts):
        tail = part.rstrip()
        if tail:
            return tail[-1] in "}]" and parse_arguments("".join(parts)) is not None
    return False


class CallIds:
    """Tool call ids of one round, unique within its message: the provider's, or
    generated.

    A call with no id, or with one an earlier call of the round or of the message
    already used (``taken``: what the message's earlier rounds used), gets
    ``f"{prefix}{n}"`` (``n`` is ``base`` plus the call's number in its round, with a
    suffix when even that is taken), so a result can always be matched to its call.
    """

    __slots__ = ("_base", "_prefix", "_taken", "_used")

    def __init__(self, prefix: str, base: int, taken: Callable[[str], bool]) -> None:
        self._prefix = prefix
        self._base = base
        self._taken = taken
        self._used: set[str] = set()

    def _free(self, call_id: str) -> bool:
        return call_id not in self._used and not self._taken(call_id)

    def assign(self, given: str | None, slot: int, label: str) -> str:
        """The id of the round's call number ``slot``; ``label`` names it in a warning."""
        call_id = given
        if not call_id or not self._free(call_id):
            if call_id:
                logger.warning("%s repeats an earlier call's id; using a generated id", label)
            n = self._base + slot
            call_id = f"{self._prefix}{n}"
            suffix = 0
            while not self._free(call_id):
                suffix += 1
                call_id = f"{self._prefix}{n}_{suffix}"
        self._used.add(call_id)
        return call_id


async def read_all(
    items: Iterable[Any] | AsyncIterable[Any],
    feed: Callable[[Any], Awaitable[None]],
    stop: Callable[[], bool],
) -> None:
    """Feed each item of a sync or async iterable until ``stop()`` says the stream ended.

    A loop per kind instead of an async-generator wrapper: a wrapper left unfinished by
    an exception would be closed later by the event loop, not here. Nothing after the
    end (a provider's error, a terminal event) is read.
    """
    if isinstance(items, AsyncIterable):
        async for raw in items:
            await feed(raw)
            if stop():
                return
    else:
        for raw in items:
            await feed(raw)
            if stop():
                return
