"""Helpers for the chaos and seam tests: a store that records every event it is given,
seeded turns that can be replayed exactly, and a Starlette app serving a hub.

A turn is built from a seed (:func:`build_script`), so the test can rebuild, without
the server, exactly what a producer published (:func:`expected_events`), and compare
it with what each client read over its dropped and resumed connections.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from essessey import Event, InMemoryEventStore, InMemorySink, Publisher, StreamHub, stream_turn
from essessey.bindings.sse import hub_routes
from essessey.stores import StreamAppender

Pace = Callable[[], Awaitable[None]]
"""Called by a producer after each event it emits: where it yields to other tasks."""

# Events every turn adds around its deltas: preamble 2, thinking start/signature/stop
# 3, first text start/stop 2, tool_use start/stop 2, tool_result start/delta/stop 3,
# second text start/stop 2, epilogue 2.
FRAME_EVENTS = 16
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFXYZ 0123456789 .,;:!?-\"'\\/\n\té€漢字🙂"


class RecordingStore(InMemoryEventStore):
    """An :class:`InMemoryEventStore` that remembers, per stream, every event appended
    (with the id it was given): what the producers published, as the store saw it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.published: defaultdict[str, list[Event]] = defaultdict(list)

    def _append_fields(
        self,
        stream_id: str,
        name: str,
        data: bytes,
        index: int = 0,
        text: str | None = None,
        text_json: bytes = b"",
    ) -> None:
        super()._append_fields(stream_id, name, data, index, text, text_json)
        self.note(stream_id)

    def appender(self, stream_id: str) -> StreamAppender | None:
        inner = super().appender(stream_id)
        return None if inner is None else _RecordingAppender(self, stream_id, inner)

    def note(self, stream_id: str) -> None:
        """Remember the stream's newest event (once: an append the appender hands back
        to the store is seen by both)."""
        newest = self._newest(stream_id)
        published = self.published[stream_id]
        if not published or published[-1].id != newest.id:
            published.append(newest)


class _RecordingAppender:
    """A running stream's appender that notes each event in its :class:`RecordingStore`."""

    def __init__(self, store: RecordingStore, stream_id: str, inner: StreamAppender) -> None:
        self._store = store
        self._stream_id = stream_id
        self._inner = inner

    def append(self, name: str, data: bytes) -> None:
        self._inner.append(name, data)
        self._store.note(self._stream_id)

    def emit_text(self, index: int, text: str, text_json: bytes) -> None:
        self._inner.emit_text(index, text, text_json)
        self._store.note(self._stream_id)


@dataclass(frozen=True, slots=True)
class TurnScript:
    """Everything one seeded turn publishes, chunk by chunk."""

    message_id: str
    thinking: tuple[str, ...]
    signature: str
    text1: tuple[str, ...]
    tool_use_id: str
    tool_name: str
    arguments: tuple[str, ...]
    result: str
    text2: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join(self.text1) + "".join(self.text2)


def _chunk(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 12)))


def _split(rng: random.Random, total: int, parts: int) -> list[int]:
    """``parts`` positive sizes adding up to ``total``."""
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def _bounds(sizes: list[int]) -> list[tuple[int, int]]:
    bounds: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def build_script(seed: int, events: int = 500) -> TurnScript:
    """The turn of ``seed``: ``events`` events in all, preamble and epilogue included."""
    rng = random.Random(seed)
    n_thinking, n_text1, n_arguments, n_text2 = _split(rng, events - FRAME_EVENTS, 4)
    # The arguments are JSON text cut anywhere: a fragment need not be JSON itself.
    query = "".join(_chunk(rng) for _ in range(n_arguments))
    arguments_json = orjson.dumps({"query": query, "limit": rng.randint(1, 99)}).decode()
    arguments = tuple(
        arguments_json[a:b] for a, b in _bounds(_split(rng, len(arguments_json), n_arguments))
    )
    return TurnScript(
        message_id=f"msg_{seed}",
        thinking=tuple(_chunk(rng) for _ in range(n_thinking)),
        signature=f"sig-{rng.getrandbits(64):016x}",
        text1=tuple(_chunk(rng) for _ in range(n_text1)),
        tool_use_id=f"toolu_{seed}",
        tool_name=rng.choice(["search", "read_file", "run"]),
        arguments=arguments,
        result=" ".join(_chunk(rng) for _ in range(rng.randint(1, 20))),
        text2=tuple(_chunk(rng) for _ in range(n_text2)),
    )


async def _no_pace() -> None:
    return None


async def play(
    publisher: Publisher, script: TurnScript, stream_id: str, pace: Pace = _no_pace
) -> None:
    """Publish ``script`` as one turn, calling ``pace`` after every event."""
    async with stream_turn(
        publisher, message_id=script.message_id, stream_id=stream_id, model="chaos"
    ) as turn:
        await pace()
        thinking = await turn.thinking()
        for chunk in script.thinking:
            await thinking.write(chunk)
            await pace()
        await thinking.write_signature(script.signature)
        await pace()
        text = await turn.text()
        for chunk in script.text1:
            await text.write(chunk)
            await pace()
        tools = await turn.tools()
        await pace()
        await tools.start_call(script.tool_use_id, script.tool_name)
        for chunk in script.arguments:
            await tools.write_arguments(script.tool_use_id, chunk)
            await pace()
        await tools.write_result(script.tool_use_id, script.result)
        await pace()
        text = await turn.text()
        for chunk in script.text2:
            await text.write(chunk)
            await pace()
    await pace()


async def expected_events(seed: int, stream_id: str, events: int = 500) -> list[Event]:
    """What the producer of ``seed`` publishes, rebuilt without a server (no ids)."""
    sink = InMemorySink()
    await play(Publisher(sink), build_script(seed, events), stream_id)
    return list(sink.events)


def random_pace(rng: random.Random, pause_every: int = 2, pause: float = 0.03) -> Pace:
    """Yield after every event; about once in ``pause_every`` events, sleep up to
    ``pause`` seconds, so concurrent turns interleave and last a while."""

    async def pace() -> None:
        if rng.randrange(pause_every) == 0:
            await anyio.sleep(rng.uniform(0, pause))
        else:
            await anyio.lowlevel.checkpoint()

    return pace


def make_app(
    store: RecordingStore, events_per_turn: int = 500, **hub_options: Any
) -> tuple[Starlette, StreamHub]:
    """A Starlette app: the hub's SSE routes plus ``POST /turns/{stream_id}?seed=N``,
    which starts the seeded turn on the hub (the hub lives in the app's lifespan)."""
    hub = StreamHub(store, **hub_options)

    async def start_turn(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        seed = int(request.query_params["seed"])
        script = build_script(seed, events_per_turn)
        # Most turns outlast their client's reading; some end early, so their
        # clients resume a finished stream.
        pace_rng = random.Random(seed ^ 0x5EED)
        pace = random_pace(pace_rng, pause_every=pace_rng.choice((2, 2, 3, 50)))

        async def produce(publisher: Publisher) -> None:
            await play(publisher, script, stream_id, pace)

        await hub.start(stream_id, produce)
        return Response(status_code=202)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [*hub_routes(hub), Route("/turns/{stream_id}", start_turn, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan), hub
