"""The app every replica runs in the multi-replica tests (``tests.replica_app:app``).

Each uvicorn process of it connects to the nats-server at ``NATS_URL`` (reconnecting
forever, quickly), keeps its streams in a :class:`JetStreamEventStore` on the JetStream
stream ``ESSESSEY_STREAM`` and runs a :class:`StreamHub` on it, so every replica serves
every stream, whichever replica produces it. Routes:

- ``GET /streams/{stream_id}`` (subscribe or resume by ``Last-Event-ID``) and
  ``POST /streams/{stream_id}/cancel``: the hub's SSE routes; ``/streams/{stream_id}/ws``
  (resume by the ``last_event_id`` query parameter): its WebSocket route;
- ``POST /turns/{stream_id}?seed=N&delay_ms=M&events=K``: start the seeded turn of
  :mod:`tests.chaos_app` (``K`` events, 250 by default), sleeping ``M`` ms after each
  event so that it lasts a while;
- ``GET /turns/{stream_id}``: what this replica knows of a turn it started (running, how
  far it got, when it started and finished, in ``time.time()`` seconds, and whether its hub
  still holds it: ``held``);
- ``GET /healthz``: ``{"ok": true, "nats": <connected>}``;
- ``POST /asking/{stream_id}``: start a turn that asks to approve a ``send_email`` call
  and ends waiting; the hub's ``on_answer`` continues it (the call's result when
  approved, then text naming the replica's process that continued it), answered through
  ``POST /streams/{stream_id}/answer`` on any replica;
- ``POST /api/chat`` and the rest of ``essessey.dialects.ui.ui_chat_routes``, answering
  with :mod:`tests.ui_app`'s scripted turn.

With ``REDIS_URL`` set instead, the replicas share a :class:`RedisEventStore` on that
redis-server (key prefix ``ESSESSEY_STREAM``). On either, the stores' leases let a turn
run on one replica at a time and be cancelled from any; ``ESSESSEY_RUNNING_TTL`` is how
long a lease lasts unrenewed (10 s).

Environment (all but ``NATS_URL`` or ``REDIS_URL`` optional): ``ESSESSEY_STREAM`` (``ESSESSEY``),
``ESSESSEY_HEARTBEAT`` (the followers' idle heartbeat, 1 s), ``ESSESSEY_MAX_AGE``
(retention, 3600 s), ``ESSESSEY_PUBLISH_TIMEOUT`` (30 s), ``ESSESSEY_DUPLICATE_WINDOW``
(120 s; nats-server wants it no larger than the max age), ``ESSESSEY_PING`` (the SSE
keep-alive interval, 1 s), ``ESSESSEY_SNAPSHOT_AFTER`` (the hub's ``snapshot_after``; unset:
no snapshots).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

import anyio
from nats.aio.client import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from essessey import Answered, Publisher, StreamBusy, StreamHub, continue_turn, stream_turn
from essessey.bindings.sse import hub_routes
from essessey.bindings.ws import ws_route
from essessey.dialects.ui import ui_chat_routes
from essessey.stores.jetstream import JetStreamEventStore
from essessey.stores.redis import RedisEventStore
from tests.chaos_app import build_script, play
from tests.ui_app import agent_turn

DEFAULT_EVENTS = 250


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value is None else float(value)


@dataclass
class TurnState:
    """What this replica knows of a turn it produces."""

    events: int
    progress: int = 0  # pace calls so far: about one per event
    running: bool = True
    started_at: float = 0.0
    finished_at: float | None = None
    failed: str | None = None


# Built at import, connected in the lifespan: the routes need the hub, the hub the store,
# and the store only a client object (it makes no request until it is used).
nc = Client()
REDIS_URL = os.environ.get("REDIS_URL")
store: JetStreamEventStore | RedisEventStore
if REDIS_URL:
    store = RedisEventStore.from_url(
        REDIS_URL,
        prefix=os.environ.get("ESSESSEY_STREAM", "essessey"),
        heartbeat=_env_float("ESSESSEY_HEARTBEAT", 1.0),
        max_age=_env_float("ESSESSEY_MAX_AGE", 3600.0),
        retry_timeout=_env_float("ESSESSEY_PUBLISH_TIMEOUT", 30.0),
        running_ttl=_env_float("ESSESSEY_RUNNING_TTL", 10.0),
    )
else:
    store = JetStreamEventStore(
        nc,
        stream=os.environ.get("ESSESSEY_STREAM", "ESSESSEY"),
        heartbeat=_env_float("ESSESSEY_HEARTBEAT", 1.0),
        max_age=_env_float("ESSESSEY_MAX_AGE", 3600.0),
        publish_timeout=_env_float("ESSESSEY_PUBLISH_TIMEOUT", 30.0),
        duplicate_window=_env_float("ESSESSEY_DUPLICATE_WINDOW", 120.0),
        running_ttl=_env_float("ESSESSEY_RUNNING_TTL", 10.0),
    )


async def continue_asking(publisher: Publisher, answered: Answered) -> None:
    """The continuation of ``/asking`` turns: the approved call's result, then who ran it."""
    async with continue_turn(publisher, answered) as turn:
        sent = False
        for request, approval in answered.approvals():
            if approval.approved:
                await turn.tool_result(request.tool_use_id, {"sent": True})
                sent = True
        text = await turn.text()
        await text.write(f"{'sent' if sent else 'not sent'} by replica {os.getpid()}")


_snapshot_after = os.environ.get("ESSESSEY_SNAPSHOT_AFTER")
hub = StreamHub(
    store,
    snapshot_after=None if _snapshot_after is None else int(_snapshot_after),
    on_answer=continue_asking,
)
turns: dict[str, TurnState] = {}
stats: Counter[str] = Counter()
"""NATS connection events and the store's publish retries, for ``/healthz``."""


class _CountRetries(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.endswith("retrying"):
            # The retry policy names the subject of a publish ("... request on <subject>").
            kind = "publish" if " request on " in message else "request"
            stats[f"store_{kind}_retries"] += 1


_store_logger = logging.getLogger("essessey.stores.jetstream")
_store_logger.addHandler(_CountRetries(logging.DEBUG))
_store_logger.addHandler(logging.StreamHandler())  # WARNING and above, on stderr
_store_logger.setLevel(logging.DEBUG)
_store_logger.handlers[-1].setLevel(logging.WARNING)


async def _disconnected() -> None:
    stats["disconnects"] += 1


async def _reconnected() -> None:
    stats["reconnects"] += 1


async def _error(exc: Exception) -> None:
    # nats-py's default prints a traceback for every failed reconnect attempt.
    stats["nats_errors"] += 1


async def start_turn(request: Request) -> Response:
    stream_id = request.path_params["stream_id"]
    seed = int(request.query_params["seed"])
    delay = int(request.query_params.get("delay_ms", "0")) / 1000
    events = int(request.query_params.get("events", str(DEFAULT_EVENTS)))
    script = build_script(seed, events)
    state = TurnState(events=events, started_at=time.time())

    async def pace() -> None:
        state.progress += 1
        await anyio.sleep(delay)

    async def produce(publisher: Publisher) -> None:
        try:
            await play(publisher, script, stream_id, pace)
        except BaseException as exc:
            state.failed = repr(exc)
            raise
        finally:
            state.running = False
            state.finished_at = time.time()

    try:
        await hub.start(stream_id, produce)
    except StreamBusy:
        return JSONResponse({"error": "busy"}, status_code=409)
    turns[stream_id] = state
    return JSONResponse({"started": stream_id}, status_code=202)


async def start_asking(request: Request) -> Response:
    stream_id = request.path_params["stream_id"]

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id="msg_" + stream_id, stream_id=stream_id, model="replica"
        ) as turn:
            await (await turn.text()).write("I will send the email.")
            tools = await turn.tools()
            await tools.start_call("call_" + stream_id, "send_email", '{"to":"a@example.com"}')
            await turn.ask_approval("call_" + stream_id, request_id="apr_" + stream_id)

    try:
        await hub.start(stream_id, produce)
    except StreamBusy:
        return JSONResponse({"error": "busy"}, status_code=409)
    return JSONResponse({"started": stream_id}, status_code=202)


async def turn_status(request: Request) -> Response:
    state = turns.get(request.path_params["stream_id"])
    if state is None:
        return JSONResponse({"error": "no turn started here"}, status_code=404)
    # "held": the hub's own view, True until the turn has ended in the store too (its
    # lease released); "running" turns False as soon as the producer returns.
    held = hub.running(request.path_params["stream_id"])
    return JSONResponse({**asdict(state), "held": held})


async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True, "nats": nc.is_connected, **stats})


async def cancel_turn(request: Request) -> Response:
    """The hub's cancel without the SSE routes' authorization: True once it ended."""
    return JSONResponse({"cancelled": await hub.cancel(request.path_params["stream_id"])})


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if isinstance(store, RedisEventStore):
        async with store, hub:
            yield
        return
    await nc.connect(
        os.environ["NATS_URL"],
        name=f"replica-{os.getpid()}",
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        connect_timeout=5,
        disconnected_cb=_disconnected,
        reconnected_cb=_reconnected,
        error_cb=_error,
    )
    try:
        await store.setup()
        async with hub:
            yield
    finally:
        # The hub has been left (its turns ended and their streams closed): what the
        # client still buffers goes out, then the connection closes.
        if not nc.is_closed:
            await nc.drain()


app = Starlette(
    routes=[
        *hub_routes(hub, ping_interval=_env_float("ESSESSEY_PING", 1.0)),
        ws_route(hub, ping_interval=_env_float("ESSESSEY_PING", 1.0)),
        Route("/turns/{stream_id}", start_turn, methods=["POST"]),
        Route("/turns/{stream_id}", turn_status, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/turns/{stream_id}/cancel", cancel_turn, methods=["POST"]),
        Route("/asking/{stream_id}", start_asking, methods=["POST"]),
        # useChat's routes, answering with tests/ui_app.py's scripted turn.
        *ui_chat_routes(hub, agent_turn),
    ],
    lifespan=lifespan,
)
