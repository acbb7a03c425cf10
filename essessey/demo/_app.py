"""The demo app: a page, a scripted agent turn served with resume, a fake Messages API.

Routes (see docs/demo.md for examples):

- ``GET /``: the page, which runs a turn and renders it live over SSE or a WebSocket;
- ``POST /streams``: start a scripted turn, ``201 {"stream_id": ...}``;
- ``GET /streams/{stream_id}``: the turn as SSE, resuming after ``Last-Event-ID`` or
  ``?last_event_id=`` (``essessey.bindings.sse.hub_routes``);
- ``GET /streams/{stream_id}/ws``: the same over a WebSocket (``ws_route``);
- ``POST /streams/{stream_id}/cancel``: stop the turn (it ends with ``cancelled``);
- ``POST /v1/messages``: an Anthropic Messages API stand-in with a scripted reply;
- ``POST /api/chat``, ``GET /api/chat/{id}/stream``, ``POST /api/chat/{id}/stop``, and the
  WebSocket ``/api/chat/ws``: the same scripted turn for the AI SDK's ``useChat``
  (``essessey.dialects.ui``).

There is no ``authorize`` hook: whoever has a stream's id may read it, cancel its turn and
answer its questions (the ids the demo makes are random; a chat's, a thread's and a run's
are the client's). Serve it on loopback, or behind something that authenticates.
No CORS header is sent unless ``cors_origins`` names the origins whose pages may call it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from essessey import (
    EventStore,
    InMemoryEventStore,
    StoreFull,
    StoreUnavailable,
    StreamHub,
    TurnProducer,
)
from essessey.bindings.http import BadRequest, json_error, read_json
from essessey.bindings.sse import (
    ErrorShape,
    FrameEncoder,
    error_body,
    hub_routes,
    subscription_response,
)
from essessey.bindings.ws import ws_route
from essessey.demo._asking import demo_continuation
from essessey.demo._http import HeaderLimit, HostCheck
from essessey.demo._messages_api import messages_endpoint
from essessey.demo._page import FAVICON, PAGE
from essessey.demo._scenario import (
    DEFAULT_DELAY_MS,
    DEFAULT_DELTAS,
    DEFAULT_SCENARIO,
    MAX_DELAY_MS,
    MAX_DELTAS,
    MIN_DELTAS,
    SCENARIOS,
    agent_turn,
)
from essessey.dialects.agui import AGUIEncoder, AGUIRunRequest, agui_routes
from essessey.dialects.agui import error_object as agui_error
from essessey.dialects.chat_completions import (
    ChatCompletionRequest,
    ChatCompletionsEncoder,
    chat_completions_routes,
)
from essessey.dialects.chat_completions import error_object as chat_completions_error
from essessey.dialects.responses import ResponsesEncoder, ResponsesRequest, responses_routes
from essessey.dialects.responses import error_object as responses_error
from essessey.dialects.ui import ChatRequest, UIMessageEncoder, ui_chat_routes
from essessey.shutdown import begin_shutdown, detect_uvicorn_shutdown

if TYPE_CHECKING:
    import uvicorn

__all__ = ["DEFAULT_NATS_STREAM", "MAX_STREAMS_BODY", "create_app", "serve"]

logger = logging.getLogger("essessey.demo")

DEFAULT_NATS_STREAM: Final = "ESSESSEY_DEMO"
"""The JetStream stream the demo keeps its turns in when given a NATS URL."""

MAX_STREAMS_BODY: Final = 64 * 1024
"""The largest ``POST /streams`` body read, in bytes (a larger one gets 413)."""

MAX_STREAMS: Final = 1_000
"""Streams an in-memory demo keeps (finished ones dropped oldest first)."""

STORE_MIB: Final = 256
"""MiB of events an in-memory demo keeps for all turns together, as the store counts them
(what anonymous clients can make it hold; see docs/demo.md)."""

STREAM_MIB: Final = 32
"""MiB of events it keeps per turn: the longest turn it plays (100,000 deltas, 28 MiB)
fits whole."""

_SHUTDOWN_GRACE: Final = 5
"""Seconds uvicorn waits for connections to end on shutdown before cancelling them."""

_NATS_CONNECT_TIMEOUT: Final = 10
"""Seconds the first connection to NATS may take before the startup fails."""

_OPTIONS: Final = ("scenario", "deltas", "delay_ms")


def _int_option(body: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer between {low} and {high}")
    return value


def parse_stream_options(body: Any) -> dict[str, Any]:
    """The turn options of a ``POST /streams`` body (``{}`` when there was none);
    BadRequest for anything else than ``scenario``, ``deltas`` and ``delay_ms`` in range."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(key for key in body if key not in _OPTIONS)
    if unknown:
        # Only the first key's length is bounded: the body is, and the name is the
        # client's own, echoed to it and never logged.
        raise BadRequest(f"unknown field {unknown[0][:64]!r}; known: {', '.join(_OPTIONS)}")
    scenario = body.get("scenario", DEFAULT_SCENARIO)
    if scenario not in SCENARIOS:
        raise BadRequest(f"unknown scenario; known: {', '.join(SCENARIOS)}")
    return {
        "scenario": scenario,
        "deltas": _int_option(body, "deltas", MIN_DELTAS, MAX_DELTAS, DEFAULT_DELTAS),
        "delay_ms": _int_option(body, "delay_ms", 0, MAX_DELAY_MS, DEFAULT_DELAY_MS),
    }


def _turn_in(stream_id: str, body: dict[str, Any]) -> TurnProducer:
    """The scripted turn on ``stream_id``, with the demo's options (``scenario``,
    ``deltas``, ``delay_ms``) that ``body`` carries beside a client's own fields;
    ValueError (the client's 400) for one out of range."""
    options = {key: body[key] for key in _OPTIONS if key in body}
    try:
        parsed = parse_stream_options(options)
    except BadRequest as exc:
        raise ValueError(str(exc)) from None
    return agent_turn(stream_id, **parsed)


def chat_turn(chat: ChatRequest) -> TurnProducer:
    """The scripted turn answering an AI SDK chat request."""
    return _turn_in(chat.id, chat.body)


def completion_turn(request: ChatCompletionRequest) -> TurnProducer:
    """The scripted turn answering a Chat Completions request."""
    return _turn_in(request.id, request.body)


def responses_turn(request: ResponsesRequest) -> TurnProducer:
    """The scripted turn answering a Responses request."""
    return _turn_in(request.id, request.body)


def agui_turn(run: AGUIRunRequest) -> TurnProducer:
    """The scripted turn answering an AG-UI run (the demo's options in its
    ``forwardedProps``)."""
    props = run.body.get("forwardedProps")
    return _turn_in(run.id, props if isinstance(props, dict) else {})


_DIALECT_ENCODERS: Final[dict[str, Callable[[str], tuple[FrameEncoder, ErrorShape]]]] = {
    "ui": lambda stream_id: (UIMessageEncoder(message_id=stream_id), error_body),
    "agui": lambda stream_id: (AGUIEncoder(stream_id, stream_id), agui_error),
    "chat-completions": lambda stream_id: (
        ChatCompletionsEncoder(stream_id, include_usage=True),
        chat_completions_error,
    ),
    "responses": lambda stream_id: (ResponsesEncoder(stream_id), responses_error),
}
"""The dialects ``GET /streams/{id}/as/{dialect}`` serves a stream in: each one's encoder
for the stream, and its error shape."""


def _store(
    nats_url: str | None,
    nats_stream: str,
    max_age: float,
    store_mib: int,
    redis_url: str | None = None,
) -> tuple[
    EventStore, Any, Callable[[], Awaitable[None]] | None, Callable[[], Awaitable[None]] | None
]:
    """The event store; for NATS the client to connect and the store's setup; for Redis
    how to close the store's own connections."""
    if redis_url is not None:
        from essessey.stores.redis import RedisEventStore

        redis_store = RedisEventStore.from_url(
            redis_url,
            prefix=nats_stream.lower(),
            max_events_per_stream=MAX_DELTAS + 1_000,
            max_streams=MAX_STREAMS,
            max_age=max_age,
            max_bytes_per_stream=min(STREAM_MIB, store_mib) * 1024 * 1024,
        )
        return redis_store, None, None, redis_store.aclose
    if nats_url is None:
        # Room for the longest turn the demo plays, so any event of it can be resumed.
        store = InMemoryEventStore(
            max_events_per_stream=MAX_DELTAS + 1_000,
            max_streams=MAX_STREAMS,
            max_age=max_age,
            max_bytes_per_stream=min(STREAM_MIB, store_mib) * 1024 * 1024,
            max_bytes=store_mib * 1024 * 1024,
        )
        return store, None, None, None
    from nats.aio.client import Client

    from essessey.stores.jetstream import JetStreamEventStore

    nc = Client()
    duplicate_window = min(120.0, max_age)  # nats-server wants it within max_age
    jetstream = JetStreamEventStore(
        nc,
        stream=nats_stream,
        max_age=max_age,
        duplicate_window=duplicate_window,
        publish_timeout=min(30.0, duplicate_window),
    )
    return jetstream, nc, jetstream.setup, None


async def _nats_error(exc: Exception) -> None:
    # nats-py's default prints a traceback for every failed reconnect attempt.
    logger.warning("NATS connection problem: %s", type(exc).__name__)


async def _connect(nc: Any, nats_url: str | None) -> None:
    # Once connected, reconnect forever (a nats-server restart must not end the demo);
    # but nats-py retries the first connection the same way, so bound that one: a wrong
    # URL ends the startup instead of hanging it.
    try:
        with anyio.fail_after(_NATS_CONNECT_TIMEOUT):
            await nc.connect(
                nats_url,
                name="essessey-demo",
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                connect_timeout=2,
                error_cb=_nats_error,
            )
    except TimeoutError:
        with anyio.move_on_after(_NATS_CONNECT_TIMEOUT, shield=True):
            await nc.close()
        # The URL is not repeated: it may hold credentials.
        raise RuntimeError(f"could not connect to NATS within {_NATS_CONNECT_TIMEOUT} s") from None


def create_app(
    *,
    nats_url: str | None = None,
    redis_url: str | None = None,
    nats_stream: str = DEFAULT_NATS_STREAM,
    max_age: float = 3600.0,
    ping_interval: float = 15.0,
    cors_origins: Sequence[str] = (),
    store_mib: int = STORE_MIB,
    metrics: bool = False,
) -> Starlette:
    """The demo as a Starlette app; its lifespan runs the hub (and connects to NATS).

    Turns are kept in memory, or, with ``nats_url``, in the JetStream stream
    ``nats_stream`` (created if missing), so that demo processes on the same nats-server
    serve each other's turns; with ``redis_url``, in Redis under the key prefix
    ``nats_stream`` in lower case (``essessey_demo``), alike, and a turn can then be
    cancelled through any of them. ``max_age`` is how long a turn stays resumable after its
    last event, in seconds; ``ping_interval`` the keep-alive interval of SSE and
    WebSocket subscriptions. ``cors_origins`` lists the origins (``"https://app.example"``,
    or ``"*"`` for any) whose pages may call the routes from a browser; by default none.
    ``store_mib`` bounds what the in-memory store keeps for all turns (MiB, as counted).
    ``metrics`` serves essessey's metrics (``essessey.metrics``) at ``/metrics`` in
    Prometheus' text format (needs the ``metrics`` extra).
    """
    if store_mib < 1:
        raise ValueError("store_mib must be >= 1")
    if isinstance(cors_origins, str):
        raise TypeError("cors_origins is a list of origins, not one string")
    if nats_url is not None and redis_url is not None:
        raise ValueError("give nats_url or redis_url, not both")
    store, nc, setup, close = _store(nats_url, nats_stream, max_age, store_mib, redis_url)
    hub = StreamHub(store, on_answer=demo_continuation)
    app = Starlette(
        middleware=_middleware(cors_origins),
        routes=[
            *([Route("/metrics", _metrics_endpoint(), methods=["GET"])] if metrics else []),
            *_page_routes(),
            *_stream_routes(hub, ping_interval),
            Route("/v1/messages", messages_endpoint, methods=["POST"]),
            # useChat's default paths: POST /api/chat, GET /api/chat/{id}/stream.
            *ui_chat_routes(hub, chat_turn),
            # OpenAI's paths: a client's base URL is the demo's /v1.
            *chat_completions_routes(hub, completion_turn),
            *responses_routes(hub, responses_turn),
            # AG-UI: a RunAgentInput, as @ag-ui/client's HttpAgent posts it.
            *agui_routes(hub, agui_turn),
        ],
        lifespan=_lifespan(hub, nc, nats_url, setup, close),
    )
    app.state.hub = hub
    return app


def _middleware(cors_origins: Sequence[str]) -> list[Middleware]:
    """The demo's checks of every request, and CORS for the origins given."""
    middleware = [Middleware(HostCheck), Middleware(HeaderLimit)]
    if cors_origins:
        # No credentials: the demo has no cookies or tokens to protect, and a wildcard
        # origin is allowed only without them.
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["*"],
                expose_headers=["Location", "Request-Id"],
            )
        )
    return middleware


def _page_routes() -> list[BaseRoute]:
    """The page and its icon."""

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE, headers={"cache-control": "no-store"})

    async def favicon(request: Request) -> Response:
        return Response(
            FAVICON, media_type="image/svg+xml", headers={"cache-control": "max-age=86400"}
        )

    return [
        Route("/", page, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
    ]


def _stream_routes(hub: StreamHub, ping_interval: float) -> list[BaseRoute]:
    """Starting a turn (``POST /streams``), following, resuming and cancelling it over
    SSE and a WebSocket, and reading it again in a wire dialect."""

    async def in_dialect(request: Request) -> Response:
        """A stream read again from the store in one of the wire dialects (the page's
        links): the same turn, resumable by ``Last-Event-ID`` in each."""
        stream_id = request.path_params["stream_id"]
        make = _DIALECT_ENCODERS.get(request.path_params["dialect"])
        if make is None:
            known = ", ".join(_DIALECT_ENCODERS)
            return json_error(404, "not_found_error", f"no such dialect; known: {known}")
        encoder, shape = make(stream_id)
        return await subscription_response(
            hub, request, stream_id, encoder=encoder, shape=shape, ping_interval=ping_interval
        )

    async def start_stream(request: Request) -> Response:
        try:
            too_large = BadRequest(
                f"the request body is larger than {MAX_STREAMS_BODY} bytes",
                status=413,
                error_type="request_too_large",
            )
            body = await read_json(request, limit=MAX_STREAMS_BODY, empty={}, too_large=too_large)
            options = parse_stream_options(body)
        except BadRequest as exc:
            return exc.answer()
        stream_id = f"demo_{secrets.token_hex(8)}"
        producer = agent_turn(stream_id, **options)
        try:
            await hub.start(stream_id, producer)
        except StoreUnavailable:
            logger.warning("could not start stream %s: the store is unavailable", stream_id)
            return json_error(503, "overloaded_error", "the event store is unavailable")
        except StoreFull:
            logger.warning("could not start stream %s: every stream's turn is running", stream_id)
            return json_error(
                503, "overloaded_error", "too many turns are running; try again later"
            )
        logger.debug(
            "started stream %s: scenario %s, %d deltas, %d ms apart",
            stream_id,
            options["scenario"],
            options["deltas"],
            options["delay_ms"],
        )
        location = {"location": f"/streams/{stream_id}"}
        if "text/event-stream" in request.headers.get("accept", ""):
            # A client that asks for the stream (``essessey tail .../streams``, or curl
            # with that Accept header) follows the turn at once; the turn runs on the hub
            # all the same, so a dropped connection resumes at the Location.
            return await subscription_response(
                hub, request, stream_id, ping_interval=ping_interval, headers=location
            )
        return JSONResponse({"stream_id": stream_id}, status_code=201, headers=location)

    return [
        Route("/streams", start_stream, methods=["POST"]),
        # retry=1000: an EventSource whose stream was cut reconnects a second later.
        *hub_routes(hub, "/streams", retry=1000, ping_interval=ping_interval),
        ws_route(hub, "/streams/{stream_id}/ws", ping_interval=ping_interval),
        Route("/streams/{stream_id}/as/{dialect}", in_dialect, methods=["GET"]),
    ]


def _lifespan(
    hub: StreamHub,
    nc: Any,
    nats_url: str | None,
    setup: Callable[[], Awaitable[None]] | None,
    close: Callable[[], Awaitable[None]] | None,
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """Connecting to NATS and setting the store up, running the hub, and closing what was
    opened, in that order."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if nc is not None:
            await _connect(nc, nats_url)
        try:
            if setup is not None:
                await setup()
            # Leaving the hub lets running turns finish within its shutdown grace, then
            # cancels the rest: each ends "cancelled".
            async with hub:
                yield
        finally:
            if nc is not None and not nc.is_closed:
                await nc.drain()
            if close is not None:  # the Redis store's own connections
                await close()

    return lifespan


_TRACE: Final = 5
"""uvicorn's ``trace`` level, below DEBUG."""


class _WireTraceFilter(logging.Filter):
    """What the demo changes in the records uvicorn logs on ``uvicorn.error``.

    Drops the DEBUG records of the ``websockets`` library, which uvicorn's WebSocket layer
    logs there: every handshake's headers (cookies and tokens included) and the start of
    every frame (the turn's content). Wire traces are uvicorn's and websockets' own; they
    have no place beside a turn's content. And a client's frame of invalid UTF-8, which
    uvicorn logs as an ERROR with a traceback (one per frame), becomes one WARNING line:
    it is the client's garbage, not the server's failure."""

    _PACKAGE = f"{os.sep}websockets{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return self._PACKAGE not in record.pathname
        if (
            record.levelno == logging.ERROR
            and record.exc_info is not None
            and isinstance(record.exc_info[1], UnicodeDecodeError)
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "a WebSocket client sent a frame of invalid UTF-8", None
            record.exc_info = record.exc_text = None
        return True


def _metrics_endpoint() -> Callable[[Request], Awaitable[Response]]:
    """``GET /metrics``: what OpenTelemetry's Prometheus reader collects, as text. The
    process's meter provider is set once (OpenTelemetry allows no second)."""
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    global _METER_PROVIDER
    if _METER_PROVIDER is None:
        _METER_PROVIDER = MeterProvider(metric_readers=[PrometheusMetricReader()])
        metrics.set_meter_provider(_METER_PROVIDER)

    async def endpoint(request: Request) -> Response:
        # In the loop's thread: the counts it reads are the loop's.
        return Response(generate_latest(), headers={"content-type": CONTENT_TYPE_LATEST})

    return endpoint


_METER_PROVIDER: Any = None


def _hide_wire_traces() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _WireTraceFilter) for f in logger.filters):
        logger.addFilter(_WireTraceFilter())


def _configure_logging(log_level: str) -> None:
    name = log_level.upper()
    level = _TRACE if name == "TRACE" else logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {log_level!r}")
    essessey_logger = logging.getLogger("essessey")
    essessey_logger.setLevel(level)
    if not essessey_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        essessey_logger.addHandler(handler)


def _server(config: uvicorn.Config, hub: StreamHub, *, cancel_turns: bool) -> uvicorn.Server:
    import uvicorn

    class DemoServer(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            if cancel_turns:
                # In memory, nothing outlives this process: end the turns first, so their
                # readers see why they ended (stop reason cancelled) and leave.
                with anyio.move_on_after(_SHUTDOWN_GRACE):
                    await hub.cancel_all()
            # Every stream still open gets its retry hint and ends; with JetStream its
            # client resumes on another demo process while the hub drains the turn.
            begin_shutdown()
            await super().shutdown(sockets)

    return DemoServer(config)


def serve(
    *,
    host: str,
    port: int,
    nats_url: str | None,
    log_level: str,
    redis_url: str | None = None,
    cors_origins: Sequence[str] = (),
    store_mib: int = STORE_MIB,
    metrics: bool = False,
    ping_interval: float = 15.0,
) -> None:
    """Serve the demo with uvicorn until Ctrl-C or SIGTERM (blocking).

    Prints ``essessey demo on http://host:port`` once the port listens (``port=0`` picks
    a free one). On shutdown, in memory, the turns still running end with stop reason
    ``cancelled`` and their readers are let go; with ``nats_url`` or ``redis_url``
    (``redis://host:port/db``), readers get a retry
    hint (they resume on another demo process sharing the streams) while the hub lets
    running turns finish within its grace. Then the hub and the NATS connection close.
    Ctrl-C then returns; SIGTERM ends the process by that signal once the shutdown is
    done (uvicorn raises it again). Exits with status 3 when the app cannot start (e.g.
    NATS unreachable). ``cors_origins``, ``store_mib``, ``metrics`` and ``ping_interval``
    go to :func:`create_app`.
    """
    import uvicorn

    _configure_logging(log_level)
    app = create_app(
        nats_url=nats_url,
        redis_url=redis_url,
        cors_origins=cors_origins,
        store_mib=store_mib,
        metrics=metrics,
        ping_interval=ping_interval,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        lifespan="on",
        timeout_graceful_shutdown=_SHUTDOWN_GRACE,
    )
    _hide_wire_traces()  # after uvicorn has configured its loggers
    # The server's shutdown below decides the order (turns first, then the streams); the
    # automatic detection would end the streams as soon as the signal came, racing it.
    detect_uvicorn_shutdown(False)
    shared = nats_url is not None or redis_url is not None
    server = _server(config, app.state.hub, cancel_turns=not shared)
    sock = config.bind_socket()
    try:
        # Listening before the URL is printed: a client that reads it and connects at
        # once waits in the backlog while the app starts, instead of being refused.
        sock.listen(config.backlog)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        print(f"essessey demo on http://{shown}:{bound_port}", flush=True)
        # uvicorn shuts down cleanly, then raises again the Ctrl-C it held back.
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        sys.exit(3)
