"""A framework's run state, kept where every replica finds it: the stream store itself.

A run that stops to ask (an approval, a question) goes on when the answer comes, and the
answer may reach another replica than the one the run started on. The framework's state
of the run (Pydantic AI's message history, the Agents SDK's ``RunState``, the thread a
LangGraph checkpointer keeps) must be there too. :class:`RunStates` keeps it as events of
a side stream of the store the hub already shares (memory, Redis, JetStream), under a key
the continuation knows: the id of the first request the asking message wrote.
"""

from __future__ import annotations

import logging
from typing import Final

from essessey.event import Event
from essessey.protocol.asking import Answered
from essessey.stores import EventStore, InMemoryEventStore

__all__ = ["MAX_STATE_BYTES", "RunStates"]

logger = logging.getLogger("essessey.adapters")

_SUFFIX: Final = "~run"
_PART: Final = "part"
_WHOLE: Final = "whole"
# A store's events are bounded (a NATS message is at most 1 MiB by default): a state is
# written in parts well below that.
_PART_BYTES: Final = 256 * 1024

MAX_STATE_BYTES: Final = 16 * 1024 * 1024
"""The largest state :meth:`RunStates.save` keeps; a larger one is refused."""


class RunStates:
    """Keeps a framework run's state by key, in an event store.

    ``store`` is the hub's store, so the state is where the stream is, on every replica
    sharing it; ``None`` keeps it in this process (one replica). A state lives as long as
    the store keeps a stream (its ``max_age``); a continuation that finds none says so.
    """

    __slots__ = ("store",)

    def __init__(self, store: EventStore | None = None) -> None:
        self.store: EventStore = store if store is not None else InMemoryEventStore()

    async def save(self, key: str, state: bytes) -> None:
        """Keep ``state`` under ``key``, in place of what was kept there. Raises
        ``ValueError`` for a state over :data:`MAX_STATE_BYTES`, before writing."""
        if len(state) > MAX_STATE_BYTES:
            raise ValueError(
                f"a run state of {len(state)} bytes is over the {MAX_STATE_BYTES} kept"
            )
        stream = key + _SUFFIX
        await self.store.clear(stream)
        parts = [state[i : i + _PART_BYTES] for i in range(0, len(state), _PART_BYTES)]
        for part in parts:
            await self.store.append(stream, Event(_PART, part))
        # The count last: a save cut short reads as no state, never as a shorter one.
        await self.store.append(stream, Event(_WHOLE, str(len(parts)).encode()))

    async def load(self, key: str) -> bytes | None:
        """The state kept under ``key``, or None when none is (never saved, cut short, or
        gone with the store's retention)."""
        events, known = await self.store.since(key + _SUFFIX, None)
        if not known or not events or events[-1].event != _WHOLE:
            return None
        count = int(events[-1].data)
        parts = events[:-1]
        if len(parts) != count or any(event.event != _PART for event in parts):
            logger.warning(
                "a run state of %d parts has %d in the store; taken as none", count, len(parts)
            )
            return None
        return b"".join(event.data for event in parts)

    async def drop(self, key: str) -> None:
        """Forget the state under ``key`` (a run that went on and ended)."""
        await self.store.clear(key + _SUFFIX)

    @staticmethod
    def key_of(answered: Answered) -> str:
        """The key of the run that ``answered`` answers: the id of the first request its
        asking message wrote, under which the run that asked kept its state."""
        return answered.requests[0].id

    async def load_answered(self, answered: Answered) -> bytes:
        """The state of the run that ``answered`` answers. Raises ``LookupError`` when
        none is kept (the answer came after the store's retention, or to a replica on
        another store)."""
        state = await self.load(self.key_of(answered))
        if state is None:
            raise LookupError(
                "no run state is kept for this answer's requests (expired, or another store)"
            )
        return state
