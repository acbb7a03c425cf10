"""Tool calls whose fragments interleave, published one block at a time.

Both OpenAI adapters read streams in which parallel tool calls may arrive in turns (a
fragment of call 0, one of call 1, one of call 0, ...), while the protocol has one block
open at a time and a tool_use block cannot reopen once closed. :class:`HeldCalls` is the
one place that reconciles the two: the open call's fragments go out live; whatever comes
for anything else (another call's fragments, text, reasoning) is held, in order, until
the open call's arguments are whole, and then goes out.

A held fragment goes out as its own ``input_json_delta`` when its call's block opens,
exactly as the provider sent it, never joined with the others. So a call's deltas are
the provider's fragments one for one whether they were held or not: the event shape of
a call does not depend on how the provider interleaved it, a reader that renders deltas
as they come sees the same steps either way, and every delta's bytes are a fragment the
provider sent (a joined delta would be text no provider event ever carried).

The adapters keep what is theirs: how a provider event names its call (an ``index``, an
``output_index``, an item id), what order held things go out in (arrival, or output
index then arrival), and how text and reasoning are published (``emit``).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Generic, TypeVar

import anyio

from essessey._logsafe import log_failure
from essessey.adapters._message import PublishedToolCall, parse_arguments
from essessey.adapters._values import CallIds, arguments_complete
from essessey.adapters.rounds import RoundStream, ToolCallRequest

__all__ = ["HeldCall", "HeldCalls"]

P = TypeVar("P")

# The place of what has no order of its own: after everything that has one, by arrival.
_LAST: Final = 2**63


class HeldCall:
    """One tool call, from its first fragment to its block.

    ``parts`` are its argument fragments as they came; ``done`` says a provider event
    gave its arguments whole (nothing more may come for it); ``slot`` is its number in
    the round once its block opened (-1 before) and ``id`` the id it went out with.
    """

    __slots__ = (
        "caller",
        "done",
        "given_id",
        "id",
        "item_type",
        "name",
        "ordinal",
        "parts",
        "slot",
    )

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal  # order of first appearance, to name it in a log line
        self.given_id: str | None = None
        self.name: str | None = None
        self.item_type: str | None = None  # the provider's own type, when not a function
        self.caller: dict[str, Any] | None = None  # what made it, when the model did not
        self.parts: list[str] = []
        self.done = False
        self.slot = -1
        self.id = ""

    def complete(self) -> bool:
        """Whether its arguments are whole (so its block may close)."""
        return self.done or arguments_complete(self.parts)


def _order(entry: tuple[tuple[int, int], object]) -> tuple[int, int]:
    return entry[0]


class HeldCalls(Generic[P]):
    """The tool calls of one round and what waits for the open one to close.

    ``P`` is the adapter's piece of text or reasoning; ``emit`` publishes one. A call
    without an id (or with one used before) gets ``f"{id_prefix}{n}"``. ``noun``
    names a call in log lines (``"tool call"``), ``where`` a provider position
    (``"chunk %d"``); the lines go to the adapter's ``logger`` and carry counts and
    lengths only. ``before_start`` runs before each call's block opens.
    """

    __slots__ = (
        "_before_start",
        "_emit",
        "_first_late",
        "_ids",
        "_late_chars",
        "_logger",
        "_noun",
        "_queue",
        "_seq",
        "_where",
        "calls",
        "open",
        "rounds",
        "started",
    )

    def __init__(
        self,
        rounds: RoundStream,
        id_prefix: str,
        emit: Callable[[P], Awaitable[None]],
        *,
        logger: logging.Logger,
        noun: str,
        where: str,
        before_start: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.rounds = rounds
        self.calls: list[HeldCall] = []  # every call seen, in order of first appearance
        self.started: list[HeldCall] = []  # the calls whose block opened, in order
        self.open: HeldCall | None = None  # the started call whose block is open
        # A round's n calls take block indexes from here on and the next round starts
        # at least 2n further, so base + call number never repeats within a message.
        self._ids = CallIds(id_prefix, rounds.next_index, rounds.call_id_used)
        self._emit = emit
        self._before_start = before_start
        self._logger = logger
        self._noun = noun
        self._where = where
        # What waits for the open call to close, sorted by (order, arrival).
        self._queue: list[tuple[tuple[int, int], HeldCall | P]] = []
        self._seq = 0
        self._late_chars = 0
        self._first_late = -1

    @property
    def pending(self) -> bool:
        """Whether anything waits to go out."""
        return bool(self._queue)

    def add(self, call: HeldCall, order: int | None = None) -> None:
        """A call seen for the first time: its block opens at its place in the queue.

        ``order`` places it (and :meth:`hold` a piece) among what waits; without one it
        goes after everything, in arrival order.
        """
        self.calls.append(call)
        self.hold(call, order)

    def hold(self, item: HeldCall | P, order: int | None = None) -> None:
        """Queue ``item`` without publishing anything yet (see :meth:`advance`)."""
        self._seq += 1
        key = (_LAST if order is None else order, self._seq)
        bisect.insort(self._queue, (key, item), key=_order)

    async def put(self, piece: P, order: int | None = None) -> None:
        """Publish ``piece`` now when nothing waits and no call is open, else queue it."""
        if not self._queue and self.open is None:
            await self._emit(piece)
            return
        self.hold(piece, order)
        await self.advance()

    async def fragment(self, call: HeldCall, text: str, position: int) -> None:
        """An argument fragment: live for the open call, held for a call not started.

        A fragment for a call whose block already closed (or whose arguments a provider
        event gave whole) cannot go out: it could only break arguments a client already
        has. It is counted, and :meth:`log_late` says so once. ``position`` is the
        provider event it came in.
        """
        if not text:
            return
        if call.done or (call.slot >= 0 and call is not self.open):
            if self._first_late < 0:
                self._first_late = position
            self._late_chars += len(text)
            return
        if call is self.open:
            await self.rounds.tool_call_delta(call.slot, text)
        call.parts.append(text)

    async def close_open(self) -> None:
        """Close the open call's block now (the provider's message that streamed it
        ended), so that no later :meth:`advance` closes it again."""
        if self.open is not None:
            await self.rounds.close_block()
            self.open = None

    async def advance(self, *, final: bool = False) -> None:
        """Publish what can go out now, in order (everything when ``final``).

        Each item leaves the queue before it is published, so that an advance cut short
        (its task cancelled) and made again publishes nothing twice."""
        queue = self._queue
        while queue:
            open_call = self.open
            if open_call is not None:
                if not (final or open_call.complete()):
                    break  # its arguments are not whole: it stays open
                self.open = None
                await self.rounds.close_block()
            item = queue[0][1]
            if isinstance(item, HeldCall) and not item.name and not final:
                break  # an unnamed call holds back what comes after it: it may get a name
            del queue[0]
            if not isinstance(item, HeldCall):
                await self._emit(item)
            elif item.name:
                await self._start(item)
            else:
                self._logger.warning(
                    "%s %d never got a name; dropped with %d characters of arguments",
                    self._noun,
                    item.ordinal,
                    sum(map(len, item.parts)),
                )

    async def release_after_failure(self) -> None:
        """Publish what waits behind the open call when the round's reading failed or was
        cancelled (the failure goes on after it): what the provider sent before the
        failure goes out, as at the round's end. Shielded, as a cancelled turn's ending
        is; a failure to publish is logged, never raised over the first."""
        if not self._queue:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.advance(final=True)
            except Exception as exc:
                log_failure(
                    self._logger, exc, "what waited behind an open %s could not go out", self._noun
                )

    @contextlib.asynccontextmanager
    async def released_on_failure(self) -> AsyncIterator[None]:
        """:meth:`release_after_failure` when the body raises (a cancellation too)."""
        try:
            yield
        except BaseException:
            await self.release_after_failure()
            raise

    def log_late(self) -> None:
        """Warn once about the fragments that came for calls already closed."""
        if self._late_chars:
            self._logger.warning(
                "%d characters of arguments came for %ss already closed (first in %s); "
                "they cannot go out",
                self._late_chars,
                self._noun,
                self._where % self._first_late,
            )

    def requests(self) -> list[ToolCallRequest]:
        """The started calls as the round declares them: id, name, arguments."""
        return [
            ToolCallRequest(c.id, c.name or "", "".join(c.parts), c.item_type, c.caller)
            for c in self.started
        ]

    def published(self) -> list[PublishedToolCall]:
        """The started calls as an adapter reports them, the id each was given beside
        the id it went out with."""
        calls = []
        for call in self.started:
            arguments = "".join(call.parts)
            calls.append(
                PublishedToolCall(
                    call.id, call.name or "", arguments, parse_arguments(arguments), call.given_id
                )
            )
        return calls

    async def _start(self, call: HeldCall) -> None:
        if self._before_start is not None:
            await self._before_start()
        call.slot = len(self.started)
        call.id = self._ids.assign(call.given_id, call.slot, f"{self._noun} {call.ordinal}")
        request = ToolCallRequest(
            call.id, call.name or "", item_type=call.item_type, caller=call.caller
        )
        await self.rounds.tool_call_start(call.slot, request)
        self.started.append(call)
        self.open = call
        # What was held for it, each fragment as its own delta, as the provider sent it
        # (the module docstring says why they are not joined).
        for part in call.parts:
            await self.rounds.tool_call_delta(call.slot, part)
