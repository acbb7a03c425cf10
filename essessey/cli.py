"""The ``essessey`` command: watch a stream, check a recording, run the demo app.

- ``essessey tail URL`` reads a live SSE stream and renders it in the terminal (or, with
  ``--raw``, passes its events through as SSE).
- ``essessey check FILE`` checks a recorded SSE stream against the protocol's rules and
  summarises what the turn said.
- ``essessey demo`` starts the demo app (the ``server`` extra).

Exit codes (also in docs/cli.md): 0 success; 1 protocol violations (``check``, and
``tail --check``); 2 the command could not run (bad arguments, unreadable input, a
missing extra, a connection refused, an HTTP error answered instead of a stream); 3 the
stream was cut or ended before ``message_stop``; 4 the stream carried an ``error``
event; 130 interrupted; 141 stdout closed early (a broken pipe).

httpx (``tail``) and the demo app's dependencies are imported only by the commands that
need them, so ``check`` works with the core alone.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, TextIO

import anyio

from essessey import __version__
from essessey.bindings.sse import SSEDecoder, SSEMessage, encode
from essessey.check import ProtocolChecker, Violation
from essessey.errors import SSEDecodeError, StreamHTTPError
from essessey.event import Event
from essessey.protocol import BlockStart, BlockType, ErrorRecord, EventType, read
from essessey.protocol.asking import ApprovalRequest, ClientToolCall, PendingRequest
from essessey.reassemble import Fragment, ParsedStream, Reassembler

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STREAM_ERROR",
    "EXIT_USAGE",
    "EXIT_VIOLATIONS",
    "build_parser",
    "decode_sse",
    "main",
]

EXIT_OK: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_USAGE: Final = 2
EXIT_CUT: Final = 3
EXIT_STREAM_ERROR: Final = 4
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141

_CLIENT_HINT: Final = 'pip install "essessey[client]"'
_SERVER_HINT: Final = 'pip install "essessey[server]"'
_NATS_HINT: Final = 'pip install "essessey[nats]"'
_REDIS_HINT: Final = 'pip install "essessey[redis]"'
_METRICS_HINT: Final = 'pip install "essessey[metrics]"'
# What the metrics extra installs (the Prometheus exporter brings prometheus_client).
_METRICS_MODULES: Final = frozenset({"opentelemetry", "prometheus_client"})
_SERVER_MODULES: Final = frozenset({"starlette", "uvicorn"})
_DEFAULT_TIMEOUT: Final = 60.0
_LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug", "trace")
# RFC 9110 "token": what a header name may be made of.
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PREVIEW: Final = 72
# How much of a recording `check` reads at a time.
_CHECK_CHUNK: Final = 1 << 16

# Control characters from the stream are shown, not obeyed: a server must not be able to
# move the cursor, retitle the window or clear the screen of whoever tails it.
_CONTROLS: Final = {
    code: f"\\x{code:02x}"
    for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
    if code not in (0x09, 0x0A)
}

_DIM: Final = "\x1b[2m"
_BOLD_CYAN: Final = "\x1b[1;36m"
_ASKING: Final = BlockType.REQUESTS | BlockType.RESPONSES
_RED: Final = "\x1b[1;31m"
_RESET: Final = "\x1b[0m"


class _UsageError(Exception):
    """A problem with what the user asked for; the message is printed, exit code 2."""


def _err(message: str) -> None:
    print(f"essessey: {_printable(message)}", file=sys.stderr, flush=True)


# -- the parser ----------------------------------------------------------------------


def _header(text: str) -> tuple[str, str]:
    """``-H 'Name: value'`` as a (name, value) pair, or an argparse error."""
    name, colon, value = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"{text!r} is not 'Name: value' (no colon)")
    if not _TOKEN.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{name!r} is not a valid header name")
    value = value.strip(" \t")
    # Header lines are ASCII on the wire; CR, LF or NUL would end or break the line.
    if any(not (char == "\t" or " " <= char <= "~") for char in value):
        raise argparse.ArgumentTypeError(
            f"the value of header {name!r} must be printable ASCII (no CR, LF or NUL)"
        )
    return name, value


def _timeout(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError("the timeout must be a finite number >= 0")
    return seconds


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("a port is between 0 and 65535")
    return port


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("it must be at least 1")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("it must be a finite number, at least 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``essessey`` argument parser, with its ``demo``, ``tail`` and ``check``
    subcommands; each subcommand's namespace carries its ``handler``."""
    parser = argparse.ArgumentParser(
        prog="essessey",
        description="Watch, check and demo streams of essessey (Anthropic-style) events.",
        epilog="Exit codes: 0 ok, 1 protocol violations, 2 could not run, "
        "3 stream cut or incomplete, 4 the stream carried an error event.",
    )
    parser.add_argument("--version", action="version", version=f"essessey {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the demo app (needs the server extra)",
        description="Serve the demo app: a page that shows a turn streaming, and its "
        "endpoints. Stop it with Ctrl-C.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="interface to bind (default %(default)s)")
    demo.add_argument("--port", type=_port, default=8000, help="port (default %(default)s)")
    shared_store = demo.add_mutually_exclusive_group()
    shared_store.add_argument(
        "--nats",
        metavar="URL",
        dest="nats_url",
        help="keep streams in NATS JetStream at URL (default: in memory)",
    )
    shared_store.add_argument(
        "--redis",
        metavar="URL",
        dest="redis_url",
        help="keep streams in Redis at URL, redis://host:port/db (default: in memory)",
    )
    demo.add_argument(
        "--cors-origin",
        metavar="ORIGIN",
        dest="cors_origins",
        action="append",
        default=[],
        help="let pages of ORIGIN (e.g. https://app.example, or '*' for any) call the demo "
        "from a browser; repeatable (default: no CORS headers)",
    )
    demo.add_argument(
        "--store-mib",
        metavar="MIB",
        type=_positive_int,
        default=256,
        help="MiB of events the in-memory store keeps for all turns (default %(default)s)",
    )
    demo.add_argument(
        "--ping-interval",
        metavar="SECONDS",
        type=_non_negative_float,
        default=15.0,
        help="send a keep-alive on an idle stream after SECONDS; keep it below the idle "
        "timeout of any proxy in front (default %(default)s; 0 turns it off)",
    )
    demo.add_argument(
        "--metrics",
        action="store_true",
        help="serve essessey's metrics at /metrics in Prometheus' text format (needs the "
        "metrics extra)",
    )
    demo.add_argument(
        "--log-level",
        choices=_LOG_LEVELS,
        default="info",
        type=str.lower,
        help="server log level (default %(default)s)",
    )
    demo.set_defaults(handler=_run_demo)

    tail = commands.add_parser(
        "tail",
        help="read a live SSE stream and render it",
        description="GET (or POST, with --data) URL and render its event stream as it "
        "arrives: thinking, text, tool calls and results, errors. The summary (stop "
        "reason, usage, timing) and all diagnostics go to stderr.",
    )
    tail.add_argument(
        "url", metavar="URL", help="the stream's URL (http:// when it names no scheme, as in curl)"
    )
    tail.add_argument(
        "-d",
        "--data",
        metavar="JSON|@FILE",
        help="POST this JSON body (or the contents of FILE; @- reads stdin) as application/json",
    )
    tail.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        type=_header,
        default=[],
        metavar="'NAME: VALUE'",
        help="add a request header (repeatable)",
    )
    tail.add_argument(
        "--raw",
        action="store_true",
        help="print each event as SSE (event:/id:/data: lines and a blank line) "
        "instead of rendering it",
    )
    tail.add_argument(
        "--check",
        action="store_true",
        help="check the stream against the protocol rules; exit 1 on violations",
    )
    tail.add_argument(
        "--timeout",
        type=_timeout,
        default=_DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait to connect and for each read (default %(default)g; 0: forever)",
    )
    tail.add_argument(
        "--last-event-id",
        metavar="ID",
        help="resume after this event id (sent as Last-Event-ID)",
    )
    tail.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the rendering: auto (a terminal, unless NO_COLOR is set), always, never",
    )
    tail.set_defaults(handler=_run_tail)

    checker = commands.add_parser(
        "check",
        help="check a recorded SSE stream and summarise it",
        description="Decode a recorded SSE stream (the raw bytes, as captured, or as "
        "'essessey tail --raw' prints them), check every protocol rule and summarise the "
        "turn. Exit 1 when a rule is broken.",
    )
    checker.add_argument("file", metavar="FILE", help="the recording; - reads stdin")
    checker.add_argument(
        "--json", action="store_true", help="print the summary and violations as JSON"
    )
    checker.set_defaults(handler=_run_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``essessey`` command with ``argv`` (default: ``sys.argv[1:]``) and return
    its exit code; see the module docstring for the codes."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, and argparse's own errors
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else 2)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except _UsageError as exc:
        _err(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    # The reader left (``| head``): point stdout at devnull so the interpreter's final
    # flush does not raise a second BrokenPipeError at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# -- demo ----------------------------------------------------------------------------


def _run_demo(args: argparse.Namespace) -> int:
    try:
        demo = importlib.import_module("essessey.demo")
        demo.serve(
            host=args.host,
            port=args.port,
            nats_url=args.nats_url,
            redis_url=args.redis_url,
            log_level=args.log_level,
            cors_origins=args.cors_origins,
            store_mib=args.store_mib,
            metrics=args.metrics,
            ping_interval=args.ping_interval,
        )
    except KeyboardInterrupt:
        # Ctrl-C is how a demo server is meant to stop, not a failure.
        return EXIT_OK
    except ModuleNotFoundError as exc:
        hint = _missing_extra_hint(exc)
        if hint is None:
            raise
        _err(hint)
        return EXIT_USAGE
    return EXIT_OK


def _missing_extra_hint(exc: ModuleNotFoundError) -> str | None:
    """The one-line hint for a module the demo needs and the installation lacks, or None
    when the missing module is not one an extra provides."""
    root = (exc.name or "").partition(".")[0]
    if root in _SERVER_MODULES:
        return f"the demo app needs {root}; install it with: {_SERVER_HINT}"
    if root == "nats":
        return f"--nats needs nats-py; install it with: {_NATS_HINT}"
    if root == "redis":
        return f"--redis needs the redis package; install it with: {_REDIS_HINT}"
    if root in _METRICS_MODULES:
        return f"--metrics needs OpenTelemetry; install it with: {_METRICS_HINT}"
    if exc.name == "essessey.demo":
        return "the demo app is not part of this installation of essessey"
    return None


# -- tail ----------------------------------------------------------------------------


@dataclass(slots=True)
class _TailOptions:
    url: str
    method: str
    body: bytes | None
    headers: list[tuple[str, str]]
    raw: bool
    check: bool
    timeout: float
    last_event_id: str | None
    color: bool


def _run_tail(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("httpx") is None:
        _err(f"'essessey tail' needs httpx; install it with: {_CLIENT_HINT}")
        return EXIT_USAGE
    body = _read_data(args.data) if args.data is not None else None
    headers: list[tuple[str, str]] = list(args.headers)
    if body is not None and not any(name.lower() == "content-type" for name, _ in headers):
        headers.append(("Content-Type", "application/json"))
    if args.last_event_id is not None and not _header_text(args.last_event_id):
        raise _UsageError("--last-event-id must be printable ASCII (no CR, LF or NUL)")
    options = _TailOptions(
        url=_checked_url(_with_scheme(args.url)),
        method="GET" if body is None else "POST",
        body=body,
        headers=headers,
        raw=args.raw,
        check=args.check,
        timeout=args.timeout,
        last_event_id=args.last_event_id,
        color=_use_color(args.color, sys.stdout),
    )
    return anyio.run(_tail, options)


def _header_text(value: str) -> bool:
    """Whether ``value`` can go in an HTTP header as it is: printable ASCII."""
    return value.isascii() and value.isprintable()


def _checked_url(url: str) -> str:
    """``url``, once httpx can parse it and its port is one (a bad host or port would
    fail deep in the connection, as a traceback)."""
    import httpx

    try:
        parsed = httpx.URL(url)
        port = parsed.port
        parsed.host  # noqa: B018 (an internationalised host is decoded here, or refused)
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        raise _UsageError(f"invalid URL {url!r}: {type(exc).__name__}") from None
    if port is not None and not 0 < port < 65536:
        raise _UsageError(f"invalid URL {url!r}: port {port}")
    return url


def _dumps(value: Any, **options: Any) -> str:
    """``value`` as JSON to print: its text as it is, unless some of it is no UTF-8 (a
    lone surrogate, from a ``"\\ud800"`` escape), which then prints escaped."""
    try:
        text = json.dumps(value, ensure_ascii=False, **options)
    except RecursionError:  # nested past Python's limit (orjson reads 1,024 levels)
        return f"<{type(value).__name__} nested too deep to print>"
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, **options)
    return text


def _with_scheme(url: str) -> str:
    """``localhost:8000/turn`` as curl reads it: ``http://`` when no scheme is given."""
    return url if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url) else f"http://{url}"


def _read_data(data: str) -> bytes:
    """The ``--data`` body: the text itself, or a file's bytes for ``@path`` (``@-``:
    stdin). It must be JSON, because it goes out as application/json."""
    if data.startswith("@"):
        path = data[1:]
        try:
            body = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise _UsageError(f"cannot read --data file {path!r}: {exc.strerror or exc}") from None
    else:
        body = data.encode("utf-8")
    try:
        json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _UsageError(f"--data is not valid JSON ({_short_reason(exc)})") from None
    return body


def _short_reason(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return type(exc).__name__


def _use_color(mode: str, stream: TextIO) -> bool:
    if mode != "auto":
        return mode == "always"
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass(slots=True)
class _Tally:
    """What the end-of-stream summary needs, gathered as events arrive."""

    started: float
    events: int = 0
    first_event: float | None = None
    ended: float | None = None
    reassembler: Reassembler = field(default_factory=Reassembler)
    checker: ProtocolChecker | None = None
    violations: list[Violation] = field(default_factory=list)

    def add(self, event: Event) -> Fragment | None:
        if self.first_event is None:
            self.first_event = time.perf_counter()
        self.events += 1
        if self.checker is not None:
            self.violations.extend(self.checker.feed_event(event))
        return self.reassembler.feed(event)


async def _tail(options: _TailOptions) -> int:
    import httpx

    from essessey.bindings.sse import connect

    tally = _Tally(time.perf_counter(), checker=ProtocolChecker() if options.check else None)
    out = sys.stdout
    renderer = None if options.raw else _Renderer(out, color=options.color)
    timeout = httpx.Timeout(options.timeout or None)
    streaming = False
    cut: str | None = None
    try:
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=True) as client,
            connect(
                client,
                options.method,
                options.url,
                headers=options.headers,
                content=options.body,
                last_event_id=options.last_event_id,
            ) as stream,
        ):
            streaming = True
            async for event in stream:
                fragment = tally.add(event)
                if renderer is None:
                    out.write(encode(event).decode("utf-8", "replace"))
                    out.flush()
                else:
                    renderer.render(event, fragment)
    except StreamHTTPError as exc:
        _report_http_error(exc)
        return EXIT_USAGE
    except httpx.InvalidURL as exc:
        _err(f"invalid URL {options.url!r}: {exc}")
        return EXIT_USAGE
    except (httpx.RequestError, SSEDecodeError) as exc:
        # A transport's failure, or a body its Content-Encoding cannot decode.
        if not streaming:
            _err(_transport_message(exc, options.url))
            return EXIT_USAGE
        cut = _cut_message(exc)
    except anyio.get_cancelled_exc_class():
        # Ctrl-C: what arrived so far is still worth a summary.
        if streaming:
            tally.ended = time.perf_counter()
            if renderer is not None:
                renderer.finish()
            _print_tail_summary(tally, tally.reassembler.result())
        raise
    tally.ended = time.perf_counter()
    if renderer is not None:
        renderer.finish()
    parsed = tally.reassembler.result()
    if tally.checker is not None:
        tally.violations.extend(tally.checker.finish())
    _print_tail_summary(tally, parsed)
    for violation in tally.violations:
        _err(f"violation {violation}")
    if cut is not None:
        _err(f"the stream was cut after {_count(tally.events, 'event')}: {cut}")
        return EXIT_CUT
    if not parsed.complete and parsed.error is None:
        if tally.events == 0:
            _err("the stream ended without a single event")
        else:
            _err("the stream ended before message_stop: the turn is incomplete")
        return EXIT_CUT
    if tally.violations:
        _err(f"{_count(len(tally.violations), 'protocol violation')}")
        return EXIT_VIOLATIONS
    if parsed.error is not None:
        return EXIT_STREAM_ERROR
    return EXIT_OK


def _report_http_error(exc: StreamHTTPError) -> None:
    if 200 <= exc.status < 300:
        # connect() fills in the message of a 2xx answer itself; the body says more.
        kind = exc.content_type or "no content type"
        line = f"HTTP {exc.status}, but not an event stream ({kind})"
        detail = _body_text(exc.body)
        prefix = "the server answered without a stream"
    else:
        line = f"HTTP {exc.status}"
        if exc.error_type:
            line += f": {exc.error_type}"
        detail = _body_text(exc.message) or _body_text(exc.body)
        prefix = "the server refused the stream"
    if detail:
        line += f": {detail}"
    _err(f"{prefix}: {line}")


def _printable(text: str) -> str:
    """``text`` with its control characters (but tab and line feed) escaped as ``\\xNN``;
    a CRLF line ending is kept as a line ending."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_CONTROLS)


def _body_text(body: object) -> str | None:
    """An error body in neither known shape, short enough for one line (FastAPI's
    ``{"detail": ...}``, a proxy's page)."""
    if body is None or body == "" or body == {}:
        return None
    text = body if isinstance(body, str) else _dumps(body)
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW * 2 else text[: _PREVIEW * 2 - 1] + "…"


def _transport_message(exc: Exception, url: str) -> str:
    import httpx

    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: {_connect_reason(exc) or reason}"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer from {url} in time ({type(exc).__name__})"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return f"cannot request {url}: {reason}"
    return f"the request to {url} failed: {reason}"


def _connect_reason(exc: BaseException) -> str | None:
    """What the operating system said, when the chain of causes holds it: httpx's own
    message for a refused connection is "All connection attempts failed"."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve the host ({cause.strerror or cause})"
        cause = cause.__cause__ or cause.__context__
    return None


def _cut_message(exc: Exception) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"no data within the timeout ({type(exc).__name__})"
    if isinstance(exc, SSEDecodeError):
        return f"unreadable SSE ({exc})"
    return str(exc) or type(exc).__name__


class _Renderer:
    """Writes a stream for a person to read, as it arrives: thinking (dimmed in colour
    mode), the answer text as it comes, each tool call once its arguments are complete,
    each tool result, and errors."""

    __slots__ = ("_args", "_at_line_start", "_color", "_names", "_out", "_results")

    def __init__(self, out: TextIO, *, color: bool) -> None:
        self._out = out
        self._color = color
        self._at_line_start = True
        # Tool input and results are shown whole, at their block's stop: a call's
        # arguments are only meaningful once all their fragments are in.
        self._args: dict[tuple[int, int], list[str]] = {}
        self._results: dict[tuple[int, int], list[str]] = {}
        self._names: dict[str, str] = {}

    def render(self, event: Event, fragment: Fragment | None) -> None:
        """Render one event, given what the reassembler made of it."""
        if fragment is not None:
            self._fragment(event, fragment)
        elif event.event == EventType.ERROR:
            self._error(event)
        self._out.flush()

    def finish(self) -> None:
        """End the rendering on a fresh line."""
        self._newline()
        self._out.flush()

    def _fragment(self, event: Event, fragment: Fragment) -> None:
        key = (fragment.message, fragment.index)
        kind, name = fragment.kind, fragment.event
        if kind == "text" or kind == "thinking":
            if name == EventType.CONTENT_BLOCK_START:
                self._newline()
                if kind == "thinking":
                    self._write("[thinking] ", _DIM)
            if fragment.text:
                self._write(fragment.text, _DIM if kind == "thinking" else None)
            if name == EventType.CONTENT_BLOCK_STOP:
                self._newline()
        elif kind == "tool_use":
            if name == EventType.CONTENT_BLOCK_START:
                self._names[fragment.tool_use_id or ""] = fragment.name or ""
                self._args[key] = [_start_input(event)]
            elif name == EventType.CONTENT_BLOCK_DELTA:
                self._args.setdefault(key, []).append(fragment.text)
            elif name == EventType.CONTENT_BLOCK_STOP:
                arguments = "".join(self._args.pop(key, []))
                self._line(f"[tool call] {fragment.name} {_compact(arguments)}", _BOLD_CYAN)
        elif kind == "tool_result":
            if name == EventType.CONTENT_BLOCK_DELTA:
                self._results.setdefault(key, []).append(fragment.text)
            elif name == EventType.CONTENT_BLOCK_STOP:
                text = "".join(self._results.pop(key, []))
                tool_use_id = fragment.tool_use_id or ""
                who = self._names.get(tool_use_id) or tool_use_id
                if fragment.is_error:
                    self._line(f"[tool error] {who}: {text}", _RED)
                else:
                    self._line(f"[tool result] {who}: {text}", _BOLD_CYAN)
        elif name == EventType.CONTENT_BLOCK_START and fragment.block_type in _ASKING:
            self._asking(event)
        # Other unknown blocks and delta types are not rendered: the set is open.

    def _asking(self, event: Event) -> None:
        """A turn that asks (docs/asking.md): its requests, and the record of the answers."""
        record = read(event)
        if not isinstance(record, BlockStart):
            return
        block = record.block
        kind = record.block_type
        if kind == BlockType.APPROVAL_REQUEST:
            call = str(block.get("tool_use_id", ""))
            who = self._names.get(call) or call
            self._line(f"[asks approval] {who} ({block.get('id')})", _BOLD_CYAN)
        elif kind == BlockType.QUESTION:
            self._line(f"[asks] {block.get('question')} ({block.get('id')})", _BOLD_CYAN)
        elif kind == BlockType.APPROVAL_RESPONSE:
            verdict = "approved" if block.get("approved") is True else "denied"
            self._line(f"[{verdict}] {block.get('request_id')}", _BOLD_CYAN)
        else:
            value = _compact(_dumps(block.get("value")))
            self._line(f"[answer] {block.get('request_id')}: {value}", _BOLD_CYAN)

    def _error(self, event: Event) -> None:
        record = read(event)
        if isinstance(record, ErrorRecord):
            line = f"[error] {record.error_type}: {record.message}"
        else:
            line = "[error] (an error event without a readable type and message)"
        self._line(line, _RED)

    def _line(self, text: str, style: str | None) -> None:
        self._newline()
        self._write(text, style)
        self._newline()

    def _newline(self) -> None:
        if not self._at_line_start:
            self._out.write("\n")
            self._at_line_start = True

    def _write(self, text: str, style: str | None) -> None:
        if not text:
            return
        text = _printable(text)
        if self._color and style is not None:
            # Styled per write, so a stream cut mid-block never leaves the terminal dim.
            self._out.write(f"{style}{text}{_RESET}")
        else:
            self._out.write(text)
        self._at_line_start = text.endswith("\n")


def _start_input(event: Event) -> str:
    """The ``input`` a tool_use block started with, as JSON ("" when empty): a provider
    may send a call whole in its start instead of in fragments."""
    record = read(event)
    initial = record.block.get("input") if isinstance(record, BlockStart) else None
    return _dumps(initial) if initial else ""


def _compact(arguments: str) -> str:
    """Tool arguments on one line; text that is not JSON is shown as it is, marked."""
    if not arguments:
        return "{}"
    try:
        # The stdlib parser keeps big integers exact, as the reassembler does.
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return f"{arguments} (not valid JSON)"
    return _dumps(value, separators=(",", ":"))


def _print_tail_summary(tally: _Tally, parsed: ParsedStream) -> None:
    end = tally.ended if tally.ended is not None else time.perf_counter()
    total = end - tally.started
    parts = [f"stop: {parsed.stop_reason or 'none'}", f"usage: {_usage(parsed.usage)}"]
    timing = f"{_count(tally.events, 'event')} in {_duration(total)}"
    if tally.first_event is not None:
        timing += f", first after {_duration(tally.first_event - tally.started)}"
    if total > 0:
        timing += f", {tally.events / total:.0f} events/s"
    parts.append(timing)
    if parsed.error is not None:
        parts.append(f"error: {parsed.error.type}: {parsed.error.message}")
    print(_printable("-- " + " | ".join(parts)), file=sys.stderr, flush=True)


def _usage(usage: Mapping[str, Any]) -> str:
    if not usage:
        return "none"
    return ", ".join(f"{key}={_scalar(value)}" for key, value in usage.items())


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


# -- check ---------------------------------------------------------------------------


def _run_check(args: argparse.Namespace) -> int:
    name: str = args.file
    try:
        counted = _check_file(name)
    except OSError as exc:
        raise _UsageError(f"cannot read {name!r}: {exc.strerror or exc}") from None
    except SSEDecodeError as exc:
        raise _UsageError(f"{_label(name)} is not a readable SSE stream: {exc}") from None
    events, violations, parsed = counted
    if not events:
        raise _UsageError(f"{_label(name)} holds no SSE events")
    if args.json:
        report = _json_report(_label(name), events, parsed, violations)
        print(_dumps(report, indent=2))
    else:
        _print_check_report(_label(name), events, parsed, violations)
    return EXIT_VIOLATIONS if violations else EXIT_OK


def _check_file(name: str) -> tuple[int, list[Violation], ParsedStream]:
    """Check and reassemble the recording ``name`` (``-``: stdin) as it is read, a chunk
    at a time: how many events it holds, the violations, the turn. Only the reassembled
    turn is kept, so a recording far larger than memory can still be checked."""
    decoder = SSEDecoder()
    checker = ProtocolChecker()
    reassembler = Reassembler()
    violations: list[Violation] = []
    events = 0

    def take(messages: list[SSEMessage]) -> None:
        nonlocal events
        for message in messages:
            event = _event_of(message)
            events += 1
            violations.extend(checker.feed_event(event))
            reassembler.feed(event)

    with _opened(name) as stream:
        while chunk := stream.read(_CHECK_CHUNK):
            take(decoder.feed(chunk))
    take(decoder.close())
    violations.extend(checker.finish())
    return events, violations, reassembler.result()


def _opened(name: str) -> AbstractContextManager[BinaryIO]:
    # stdin is not closed with the report: only what this opened.
    if name == "-":
        return nullcontext(sys.stdin.buffer)
    return Path(name).open("rb")


def _event_of(message: SSEMessage) -> Event:
    return Event(message.event, message.data.encode("utf-8"), message.id or None)


def decode_sse(raw: bytes) -> list[Event]:
    """The events of a whole recorded SSE stream (an unterminated last event is dropped,
    as a browser would drop it)."""
    decoder = SSEDecoder()
    messages = decoder.feed(raw)
    messages.extend(decoder.close())
    return [_event_of(message) for message in messages]


def _label(name: str) -> str:
    return "<stdin>" if name == "-" else name


def _preview(text: str) -> str:
    first = text.lstrip().split("\n", 1)[0]
    if len(first) > _PREVIEW:
        first = first[: _PREVIEW - 1] + "…"
    elif "\n" in text.strip():
        first += " …"
    return _dumps(first)


def _print_check_report(
    name: str, events: int, parsed: ParsedStream, violations: list[Violation]
) -> None:
    out = sys.stdout
    messages = parsed.messages
    # Calls matched to results across the stream: a result may answer an earlier
    # message's call (the continuation of a turn that asked).
    across = {execution.call.tool_use_id: execution for execution in parsed.executions}
    _put(out, f"{name}: {_count(events, 'event')}, {_count(len(messages), 'message')}")
    for number, message in enumerate(messages, 1):
        about = [message.message_id or "(no id)"]
        if message.model:
            about.append(f"model {message.model}")
        if message.stream_id:
            about.append(f"stream {message.stream_id}")
        state = "complete" if message.complete else "error" if message.error else "incomplete"
        _put(out, f"message {number}: {', '.join(about)} [{state}]")
        if message.thinking:
            _put(out, f"  thinking: {_count(len(message.thinking), 'char')}")
        if message.text:
            preview = _preview(message.text)
            _put(out, f"  text: {_count(len(message.text), 'char')}: {preview}")
        for execution in message.executions:
            call = execution.call
            later = across.get(call.tool_use_id)
            if execution.result is None and later is not None and later.result is not None:
                answer = "result in a later message"
            elif execution.result is None:
                answer = "no result"
            else:
                answer = f"{'error' if execution.is_error else 'result'}, "
                answer += _count(len(execution.result), "char")
            args = "invalid JSON arguments" if call.parse_error else _compact(call.arguments)
            _put(out, f"  tool call: {call.name} ({call.tool_use_id}) {args} -> {answer}")
        answered = {execution.call.tool_use_id for execution in message.executions}
        for result in message.tool_results:
            if result.tool_use_id in answered:
                continue
            earlier = across.get(result.tool_use_id)
            if earlier is not None:
                kind = "error" if result.is_error else "result"
                size = _count(len(result.text), "char")
                what = f"{earlier.call.name} ({result.tool_use_id}) of an earlier message"
                _put(out, f"  tool result for {what}: {kind}, {size}")
            else:
                _put(out, f"  tool result for unknown call {result.tool_use_id}")
        if message.error is not None:
            _put(out, f"  error: {message.error.type}: {message.error.message}")
        _put(out, f"  stop reason: {message.stop_reason or 'none'}")
        _put(out, f"  usage: {_usage(message.usage)}")
    for request in parsed.pending:
        _put(out, f"waits for: {_pending(request)}")
    if parsed.error is not None and all(m.error is not parsed.error for m in messages):
        _put(out, f"error outside a message: {parsed.error.type}: {parsed.error.message}")
    for violation in violations:
        _put(out, f"violation {violation}")
    if violations:
        _put(out, f"FAIL: {_count(len(violations), 'protocol violation')}")
    else:
        _put(out, "OK: no protocol violations")
    out.flush()


def _pending(request: PendingRequest) -> str:
    """One request a stream waits for, for the report (names and ids, not content)."""
    if isinstance(request, ApprovalRequest):
        return f"approval of {request.name} ({request.tool_use_id}), request {request.id}"
    if isinstance(request, ClientToolCall):
        return f"the client's {request.name} ({request.id})"
    return f"an answer to question {request.id}"


def _put(out: TextIO, line: str) -> None:
    # Names and ids in a recording are the producer's; escape what a terminal would obey.
    out.write(_printable(line) + "\n")


def _json_report(
    name: str, events: int, parsed: ParsedStream, violations: list[Violation]
) -> dict[str, Any]:
    return {
        "file": name,
        "events": events,
        "ok": not violations,
        "violations": [
            {"position": v.position, "event": v.event, "rule": v.rule, "detail": v.detail}
            for v in violations
        ],
        "complete": parsed.complete,
        "stop_reason": parsed.stop_reason,
        "usage": dict(parsed.usage),
        "error": _json_error(parsed),
        "messages": [
            {
                "id": message.message_id,
                "model": message.model,
                "stream_id": message.stream_id,
                "complete": message.complete,
                "stop_reason": message.stop_reason,
                "usage": dict(message.usage),
                "text_length": len(message.text),
                "text_first_line": message.text.lstrip().split("\n", 1)[0],
                "thinking_length": len(message.thinking),
                "tool_calls": [
                    {
                        "id": execution.call.tool_use_id,
                        "name": execution.call.name,
                        "arguments": execution.call.params,
                        "arguments_error": execution.call.parse_error,
                        "result_length": (
                            None if execution.result is None else len(execution.result)
                        ),
                        "is_error": execution.is_error,
                    }
                    for execution in message.executions
                ],
            }
            for message in parsed.messages
        ],
        "tool_names": list(parsed.tool_names),
    }


def _json_error(parsed: ParsedStream) -> dict[str, Any] | None:
    error = parsed.error
    if error is None:
        return None
    return {"type": error.type, "message": error.message, "request_id": error.request_id}


if __name__ == "__main__":
    raise SystemExit(main())
