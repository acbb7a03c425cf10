"""The ``essessey`` command, against a real server: uvicorn in a thread serving a small
Starlette app that streams turns, refuses requests in both error shapes, breaks the
protocol and cuts its stream. The CLI runs in process through ``main([...])`` and, for
the console entry point, as a real subprocess."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tracemalloc
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from essessey import InMemorySink, Publisher, stream_turn
from essessey.bindings.sse import EventStreamResponse, encode_many
from essessey.cli import (
    EXIT_CUT,
    EXIT_OK,
    EXIT_STREAM_ERROR,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    _missing_extra_hint,
    _use_color,
    build_parser,
    decode_sse,
    main,
)
from essessey.protocol import Dialect
from tests.processes import free_port
from tests.servers import serve

FIXTURES = Path(__file__).parent / "fixtures"
SEED004 = FIXTURES / "seed004_turn.sse"
BROKEN = FIXTURES / "cli" / "seed004_broken.sse"
REQUEST_JSON = FIXTURES / "cli" / "request.json"
ROOT = Path(__file__).resolve().parent.parent


# -- the server --------------------------------------------------------------------


async def good_turn(publisher: Publisher, prompt: str = "") -> None:
    async with stream_turn(
        publisher, message_id="msg_cli", stream_id="conv_cli", model="test-model", input_tokens=12
    ) as turn:
        thinking = await turn.thinking()
        await thinking.write("Need the ")
        await thinking.write("weather.")
        text = await turn.text()
        await text.write(f"Checking the weather{prompt}")
        await text.write(".")
        tools = await turn.tools()
        await tools.start_call("call_1", "get_weather")
        await tools.write_arguments("call_1", '{"city":')
        await tools.write_arguments("call_1", '"Paris"}')
        await tools.start_call("call_2", "get_time", '{"tz": "CET"}')
        await tools.write_result("call_1", '{"temp_c":18}')
        await tools.write_result("call_2", "clock unavailable", is_error=True)
        turn.stop_reason = "tool_use"
        turn.output_tokens = 42


async def broken_turn(publisher: Publisher) -> None:
    # Served with strict=False: a second block opens while the first is still open.
    await publisher.send_stream_preamble("msg_bad", "conv_bad", "test-model")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "one")
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "two")
    await publisher.send_content_block_stop(1)
    await publisher.send_stream_epilogue("end_turn", 2)


async def error_turn(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_err", "conv_err", "test-model")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "Partial answer")
    await publisher.send_error("overloaded_error", "Overloaded")


async def unfinished_turn(publisher: Publisher) -> None:
    # Ends cleanly at the HTTP level, but the message never stops.
    await publisher.send_stream_preamble("msg_unf", "conv_unf", "test-model")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "Half a")


async def odd_turn(publisher: Publisher) -> None:
    # Events, blocks and deltas this CLI has never heard of, between ordinary ones.
    await publisher.send_stream_preamble("msg_odd", "conv_odd", "test-model")
    await publisher.publish("status", {"phase": "searching"})
    await publisher.publish(
        "content_block_start", {"index": 0, "content_block": {"type": "image", "src": "x"}}
    )
    await publisher.publish(
        "content_block_delta", {"index": 0, "delta": {"type": "pixels_delta", "data": "AAAA"}}
    )
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.publish(
        "content_block_delta", {"index": 1, "delta": {"type": "citation_delta", "cite": 1}}
    )
    await publisher.send_content_block_delta_text(1, "Odd but fine.")
    # A terminal escape in the text is shown, not obeyed.
    await publisher.send_content_block_delta_text(1, " \x1b[2J\r\n\x07")
    await publisher.send_content_block_stop(1)
    await publisher.send_stream_epilogue("end_turn", 3)


async def stalled_turn(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_stall", "conv_stall", "test-model")
    await anyio.sleep(30)


async def silent_turn(publisher: Publisher) -> None:
    # The status line waits for the first event, which never comes in time.
    await anyio.sleep(30)


RECEIVED: list[dict[str, Any]] = []


async def turn(request: Request) -> Response:
    dialect: Dialect = (
        "anthropic" if request.query_params.get("dialect") == "anthropic" else ("essessey")
    )
    if request.method == "POST":
        body = await request.body()
        RECEIVED.append(
            {
                "body": json.loads(body),
                "content_type": request.headers.get("content-type"),
                "x_test": request.headers.get("x-test"),
                "last_event_id": request.headers.get("last-event-id"),
            }
        )
        prompt = f" for {json.loads(body)['prompt']!r}"

        async def answer(publisher: Publisher) -> None:
            await good_turn(publisher, prompt)

        return EventStreamResponse(answer, dialect=dialect)
    return EventStreamResponse(good_turn, dialect=dialect)


async def unauthorized(request: Request) -> Response:
    return JSONResponse(
        {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        },
        status_code=401,
    )


async def quota(request: Request) -> Response:
    return JSONResponse(
        {"message": "Project balance is exhausted.", "error": "insufficient_quota"},
        status_code=402,
    )


async def revoked(request: Request) -> Response:
    return JSONResponse(
        {"message": "API key has been revoked or does not exist.", "error": "token_revoked"},
        status_code=403,
    )


async def not_a_stream(request: Request) -> Response:
    return JSONResponse({"ok": True})


def events_of(producer: Any, dialect: Dialect = "essessey") -> list[tuple[str, bytes]]:
    """What ``producer`` publishes, as (event, data) pairs, without any transport."""
    sink = InMemorySink()
    anyio.run(producer, Publisher(sink, dialect=dialect))
    return [(event.event, event.data) for event in sink.events]


class CutStream:
    """A raw ASGI app: a 200 event stream that stops mid-turn without finishing its body,
    so the server drops the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sink = InMemorySink()
        publisher = Publisher(sink)
        await publisher.send_stream_preamble("msg_cut", "conv_cut", "test-model")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_delta_text(0, "Cut short")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send(
            {"type": "http.response.body", "body": encode_many(sink.events), "more_body": True}
        )


def stream_route(producer: Any, **options: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        return EventStreamResponse(producer, **options)

    return endpoint


APP = Starlette(
    routes=[
        Route("/turn", turn, methods=["GET", "POST"]),
        Route("/unauthorized", unauthorized),
        Route("/quota", quota),
        Route("/revoked", revoked),
        Route("/json", not_a_stream),
        Route("/broken", stream_route(broken_turn, strict=False)),
        Route("/error", stream_route(error_turn)),
        Route("/unfinished", stream_route(unfinished_turn)),
        Route("/odd", stream_route(odd_turn, strict=False)),
        Route("/stalled", stream_route(stalled_turn)),
        Route("/silent", stream_route(silent_turn)),
        Route("/cut", CutStream()),
        Route("/not-gzip", lambda request: NOT_GZIP),
    ]
)


# An event stream said to be gzip that is not: httpx fails to decode it.
NOT_GZIP = Response(
    b"data: {}\n\n",
    headers={"content-type": "text/event-stream", "content-encoding": "gzip"},
)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(APP) as base:
        yield base


@pytest.fixture(autouse=True)
def _no_color_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- tail: rendering ---------------------------------------------------------------


RENDERED = (
    "[thinking] Need the weather.\n"
    "Checking the weather.\n"
    '[tool call] get_weather {"city":"Paris"}\n'
    '[tool call] get_time {"tz":"CET"}\n'
    '[tool result] get_weather: {"temp_c":18}\n'
    "[tool error] get_time: clock unavailable\n"
)


@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
def test_tail_renders_the_turn_in_both_dialects(
    capsys: pytest.CaptureFixture[str], url: str, dialect: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/turn?dialect={dialect}")
    assert code == EXIT_OK, err
    assert out == RENDERED
    summary = [line for line in err.splitlines() if line.startswith("-- ")]
    assert len(summary) == 1, err
    assert "stop: tool_use" in summary[0]
    assert "input_tokens=12" in summary[0]
    assert "output_tokens=42" in summary[0]
    assert "events/s" in summary[0]
    assert "first after" in summary[0]


def test_tail_takes_a_url_without_a_scheme_as_curl_does(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    bare = url.removeprefix("http://")
    assert bare != url
    code, out, err = run(capsys, "tail", f"{bare}/turn")
    assert code == EXIT_OK, err
    assert out == RENDERED


def test_tail_watches_a_new_demo_turn_in_one_step(capsys: pytest.CaptureFixture[str]) -> None:
    from essessey.demo import create_app, scenario_script

    with serve(create_app(), lifespan="on") as demo:
        bare = demo.removeprefix("http://")
        code, out, err = run(capsys, "tail", f"{bare}/streams", "-d", '{"deltas": 5}')
    assert code == EXIT_OK, err
    script = scenario_script(5)
    lines = out.splitlines()
    # Each round's text on a line of its own, never run together.
    assert script.intro_text in lines
    assert script.final_text in lines
    assert sum(line.startswith("[tool call] get_weather") for line in lines) == len(script.tools)
    assert "stop: end_turn" in err


def test_tail_colour_dims_thinking_only_when_asked(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, _ = run(capsys, "tail", f"{url}/turn", "--color", "always")
    assert code == EXIT_OK
    assert "\x1b[2m[thinking] \x1b[0m\x1b[2mNeed the \x1b[0m" in out
    assert "Checking the weather" in out
    code, out, _ = run(capsys, "tail", f"{url}/turn", "--color", "never")
    assert "\x1b[" not in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_auto_follows_the_terminal_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _use_color("auto", _Terminal())
    assert not _use_color("auto", io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not _use_color("auto", _Terminal())
    assert _use_color("always", io.StringIO())
    monkeypatch.setenv("NO_COLOR", "")
    assert _use_color("auto", _Terminal())


def test_tail_survives_unknown_events_blocks_and_deltas(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/odd", "--check")
    assert code == EXIT_OK, err
    assert out == "Odd but fine. \\x1b[2J\n\\x07\n"
    assert "stop: end_turn" in err


def test_tail_shows_an_error_event_and_exits_4(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/error")
    assert code == EXIT_STREAM_ERROR
    assert out == "Partial answer\n[error] overloaded_error: Overloaded\n"
    assert "error: overloaded_error: Overloaded" in err


# -- tail: --raw and --check ---------------------------------------------------------


@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
def test_tail_raw_decodes_back_to_the_same_events(
    capsys: pytest.CaptureFixture[str], url: str, dialect: Dialect
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/turn?dialect={dialect}", "--raw")
    assert code == EXIT_OK, err
    decoded = [(event.event, event.data) for event in decode_sse(out.encode())]

    async def produce(publisher: Publisher) -> None:
        await good_turn(publisher)

    assert decoded == events_of(produce, dialect)
    assert out.startswith("event: message_start\ndata: {")
    assert "[thinking]" not in out
    assert "stop: tool_use" in err  # the summary stays off stdout


def test_tail_check_passes_a_good_stream_and_fails_a_broken_one(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, _, err = run(capsys, "tail", f"{url}/turn", "--check")
    assert code == EXIT_OK, err
    assert "violation" not in err

    code, out, err = run(capsys, "tail", f"{url}/broken", "--check")
    assert code == EXIT_VIOLATIONS
    assert "violation #4 content_block_start: [one-open-block]" in err
    assert "1 protocol violation" in err
    assert "one" in out
    assert "two" in out

    # Without --check the same stream is rendered and the exit code is 0.
    code, _, _ = run(capsys, "tail", f"{url}/broken")
    assert code == EXIT_OK


# -- tail: requests ------------------------------------------------------------------


def test_tail_posts_data_with_headers(capsys: pytest.CaptureFixture[str], url: str) -> None:
    RECEIVED.clear()
    code, out, err = run(
        capsys,
        "tail",
        f"{url}/turn",
        "--data",
        '{"prompt": "hi"}',
        "-H",
        "X-Test: inline",
        "--header",
        "Last-Event-ID:",
    )
    assert code == EXIT_OK, err
    assert "Checking the weather for 'hi'." in out
    code, out, err = run(
        capsys, "tail", f"{url}/turn", "-d", f"@{REQUEST_JSON}", "-H", "x-test:  from-file  "
    )
    assert code == EXIT_OK, err
    assert "for 'weather in Paris?'" in out
    assert RECEIVED == [
        {
            "body": {"prompt": "hi"},
            "content_type": "application/json",
            "x_test": "inline",
            "last_event_id": "",
        },
        {
            "body": {"prompt": "weather in Paris?", "max_tokens": 256},
            "content_type": "application/json",
            "x_test": "from-file",
            "last_event_id": None,
        },
    ]


def test_tail_reads_data_from_stdin(
    capsys: pytest.CaptureFixture[str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    RECEIVED.clear()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"prompt": "stdin"}')))
    code, out, err = run(capsys, "tail", f"{url}/turn", "-d", "@-", "--last-event-id", "7")
    assert code == EXIT_OK, err
    assert "for 'stdin'" in out
    assert RECEIVED[0]["last_event_id"] == "7"


@pytest.mark.parametrize(
    "header",
    ["NoColon", "Bad Name: x", ": empty name", "X-Test: caf\u00e9", "X-Test: a\rb", "X-Nul: \0"],
)
def test_tail_rejects_a_malformed_header(
    capsys: pytest.CaptureFixture[str], url: str, header: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/turn", "-H", header)
    assert code == EXIT_USAGE
    assert out == ""
    assert "header" in err


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "--data is not valid JSON"),
        ("@/nonexistent/request.json", "cannot read --data file"),
    ],
)
def test_tail_rejects_bad_data(
    capsys: pytest.CaptureFixture[str], url: str, data: str, message: str
) -> None:
    code, _, err = run(capsys, "tail", f"{url}/turn", "--data", data)
    assert code == EXIT_USAGE
    assert message in err


# -- tail: failures before and during the stream --------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/unauthorized", "HTTP 401: authentication_error: invalid x-api-key"),
        ("/quota", "HTTP 402: insufficient_quota: Project balance is exhausted."),
        ("/revoked", "HTTP 403: token_revoked: API key has been revoked or does not exist."),
        ("/json", "HTTP 200"),
        ("/nowhere", "HTTP 404"),
    ],
)
def test_tail_reports_an_http_error_and_exits_2(
    capsys: pytest.CaptureFixture[str], url: str, path: str, expected: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}{path}")
    assert code == EXIT_USAGE
    assert out == ""
    assert expected in err
    assert "-- stop" not in err


def test_tail_reports_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"http://127.0.0.1:{free_port()}/turn"
    code, _, err = run(capsys, "tail", target)
    assert code == EXIT_USAGE
    assert f"cannot connect to {target}" in err


def test_tail_reports_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "tail", "ftp://example.invalid/x")
    assert code == EXIT_USAGE
    assert "cannot request" in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--last-event-id", "é", "127.0.0.1:1/"], "--last-event-id must be printable ASCII"),
        (["http://127.0.0.1:99999/"], "port 99999"),
        (["http://xn--/"], "IDNAError"),
    ],
)
def test_tail_refuses_arguments_it_cannot_send_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    # Each was a traceback and exit 1 (an encoding error, an OverflowError, an IDNAError).
    code, _, err = run(capsys, "tail", *argv)
    assert code == EXIT_USAGE
    assert said in err
    assert "Traceback" not in err


def test_tail_reports_a_body_its_encoding_cannot_decode(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, _, err = run(capsys, "tail", f"{url}/not-gzip")
    assert code in (EXIT_USAGE, EXIT_CUT)
    assert "decompressing" in err
    assert "Traceback" not in err


def test_check_and_tail_show_a_lone_surrogate_in_arguments_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # partial_json '{"city":"\\ud800"}' (a valid escape) crashed check, check --json and
    # tail's rendering with a UnicodeEncodeError.
    events = SEED004.read_bytes().replace(b'\\"Paris\\"', b'\\"\\\\ud800\\"')
    assert events != SEED004.read_bytes()
    recording = tmp_path / "turn.sse"
    recording.write_bytes(events)
    code, out, _ = run(capsys, "check", str(recording))
    assert code == EXIT_OK
    assert '{"city":"\\ud800"}' in out
    code, out, _ = run(capsys, "check", "--json", str(recording))
    assert code == EXIT_OK
    assert "ud800" in out


def test_tail_reports_a_cut_stream_and_exits_3(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, out, err = run(capsys, "tail", f"{url}/cut")
    assert code == EXIT_CUT
    assert out == "Cut short\n"
    assert "the stream was cut after 4 events" in err
    assert "stop: none" in err


def test_tail_reports_a_stream_without_message_stop(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    code, _, err = run(capsys, "tail", f"{url}/unfinished", "--check")
    assert code == EXIT_CUT
    assert "ended before message_stop" in err
    assert "[incomplete]" in err


def test_tail_timeouts(capsys: pytest.CaptureFixture[str], url: str) -> None:
    # Before the first event the server has not even sent its status line: exit 2.
    code, _, err = run(capsys, "tail", f"{url}/silent", "--timeout", "0.3")
    assert code == EXIT_USAGE
    assert "no answer from" in err
    # After it, a silence longer than the timeout is a cut stream: exit 3.
    code, _, err = run(capsys, "tail", f"{url}/stalled", "--timeout", "0.3")
    assert code == EXIT_CUT
    assert "no data within the timeout" in err


def test_tail_needs_httpx(
    capsys: pytest.CaptureFixture[str], url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    code, _, err = run(capsys, "tail", f"{url}/turn")
    assert code == EXIT_USAGE
    assert 'pip install "essessey[client]"' in err


# -- check ---------------------------------------------------------------------------


def test_check_a_good_recording(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", str(SEED004))
    assert code == EXIT_OK
    assert out.splitlines() == [
        f"{SEED004}: 16 events, 1 message",
        "message 1: msg_1, model some-model, stream conv_1 [complete]",
        "  thinking: 17 chars",
        '  text: 9 chars: "Checking."',
        '  tool call: get_weather (call_1) {"city":"Paris"} -> result, 13 chars',
        "  stop reason: tool_use",
        "  usage: input_tokens=0, output_tokens=42",
        "OK: no protocol violations",
    ]


def test_check_a_corrupted_recording(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", str(BROKEN))
    assert code == EXIT_VIOLATIONS
    assert "violation #4 content_block_start: [thinking-before-text]" in out
    assert "violation #10 content_block_start: [tool-result-unknown-use]" in out
    assert out.endswith("FAIL: 2 protocol violations\n")


def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "--json", str(BROKEN))
    assert code == EXIT_VIOLATIONS
    report = json.loads(out)
    assert report["ok"] is False
    assert [v["rule"] for v in report["violations"]] == [
        "thinking-before-text",
        "tool-result-unknown-use",
    ]
    assert report["violations"][0]["position"] == 4
    assert report["stop_reason"] == "tool_use"
    assert report["messages"][0]["tool_calls"][0]["arguments"] == {"city": "Paris"}
    code, out, _ = run(capsys, "check", str(SEED004), "--json")
    assert code == EXIT_OK
    assert json.loads(out)["ok"] is True


def test_check_reads_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SEED004.read_bytes())))
    code, out, _ = run(capsys, "check", "-")
    assert code == EXIT_OK
    assert out.startswith("<stdin>: 16 events, 1 message\n")


def test_check_what_tail_raw_recorded(
    capsys: pytest.CaptureFixture[str], url: str, tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "tail", f"{url}/turn?dialect=anthropic", "--raw")
    assert code == EXIT_OK
    recording = tmp_path / "turn.sse"
    recording.write_text(out)
    code, out, _ = run(capsys, "check", str(recording))
    assert code == EXIT_OK
    assert "tool call: get_time (call_2)" in out
    assert "-> error, 17 chars" in out


@pytest.mark.parametrize(
    ("content", "message"), [(None, "cannot read"), (b"", "holds no SSE events")]
)
def test_check_unreadable_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "recording.sse"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "check", str(path))
    assert code == EXIT_USAGE
    assert out == ""
    assert message in err


def test_check_reads_a_large_recording_a_chunk_at_a_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Events straddle the reads' chunk boundaries; only the reassembled turn is held, so
    # the peak stays under the recording's size.
    path = tmp_path / "long.sse"
    deltas = 30_000
    sink = InMemorySink()

    async def record() -> None:
        publisher = Publisher(sink)
        await publisher.send_stream_preamble("msg_long", "conv_long", "m")
        await publisher.send_content_block_start_text(0)
        for i in range(deltas):
            await publisher.send_content_block_delta_text(0, f"{i:05d} ")
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", 1)

    anyio.run(record)
    path.write_bytes(encode_many(sink.events))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        code, out, _ = run(capsys, "check", str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0] == f"{path}: {len(sink.events)} events, 1 message"
    assert lines[1] == "message 1: msg_long, model m, stream conv_long [complete]"
    assert lines[2].startswith(f'  text: {deltas * 6} chars: "00000 00001 00002 ')
    assert lines[-1] == "OK: no protocol violations"
    assert peak < size, (peak, size)


def test_check_refuses_a_recording_that_breaks_the_format_after_good_events(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "broken.sse"
    # Past the decoder's line limit, after events that decoded in earlier chunks.
    path.write_bytes(SEED004.read_bytes() + b"data: " + b"x" * (17 << 20))
    code, out, err = run(capsys, "check", str(path))
    assert code == EXIT_USAGE
    assert out == ""
    assert "is not a readable SSE stream" in err


# -- demo, version, usage ------------------------------------------------------------


def test_demo_options_parse() -> None:
    args = build_parser().parse_args(
        [
            "demo",
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "--nats",
            "nats://n:4222",
            "--log-level",
            "DEBUG",
        ]
    )
    assert (args.host, args.port, args.nats_url, args.log_level) == (
        "0.0.0.0",
        9001,
        "nats://n:4222",
        "debug",
    )
    defaults = build_parser().parse_args(["demo"])
    assert (defaults.host, defaults.port, defaults.nats_url, defaults.log_level) == (
        "127.0.0.1",
        8000,
        None,
        "info",
    )


def test_demo_help_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo", "--help")
    assert code == EXIT_OK
    assert "--nats URL" in out
    assert "--log-level" in out
    code, _, err = run(capsys, "demo", "--port", "70000")
    assert code == EXIT_USAGE
    assert "between 0 and 65535" in err
    code, _, err = run(capsys, "demo", "--log-level", "loud")
    assert code == EXIT_USAGE


def test_demo_calls_serve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for the demo package, which the CLI only imports and calls.
    calls: list[dict[str, Any]] = []
    stand_in = types.ModuleType("essessey.demo")
    stand_in.serve = lambda **kwargs: calls.append(kwargs)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "essessey.demo", stand_in)
    code, _, _ = run(capsys, "demo", "--port", "0")
    assert code == EXIT_OK
    assert calls == [
        {
            "host": "127.0.0.1",
            "port": 0,
            "nats_url": None,
            "redis_url": None,
            "log_level": "info",
            "cors_origins": [],
            "store_mib": 256,
            "metrics": False,
            "ping_interval": 15.0,
        }
    ]
    calls.clear()
    code, _, _ = run(capsys, "demo", "--redis", "redis://127.0.0.1:6379/0")
    assert code == EXIT_OK
    assert calls[0]["redis_url"] == "redis://127.0.0.1:6379/0"
    assert calls[0]["nats_url"] is None
    calls.clear()
    code, _, err = run(capsys, "demo", "--nats", "nats://x", "--redis", "redis://x")
    assert code == EXIT_USAGE
    assert "not allowed with" in err
    assert calls == []
    argv = ["demo", "--cors-origin", "https://a.example", "--cors-origin", "http://localhost:3000"]
    code, _, _ = run(capsys, *argv)
    assert code == EXIT_OK
    assert calls[0]["cors_origins"] == ["https://a.example", "http://localhost:3000"]
    calls.clear()
    code, _, _ = run(capsys, "demo", "--store-mib", "16", "--metrics")
    assert code == EXIT_OK
    assert calls[0]["store_mib"] == 16
    assert calls[0]["metrics"] is True
    code, _, err = run(capsys, "demo", "--store-mib", "0")
    assert code != EXIT_OK
    assert "at least 1" in err


def test_demo_hints_at_the_missing_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def serve(**kwargs: Any) -> None:
        raise ModuleNotFoundError("No module named 'uvicorn'", name="uvicorn")

    stand_in = types.ModuleType("essessey.demo")
    stand_in.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "essessey.demo", stand_in)
    code, _, err = run(capsys, "demo")
    assert code == EXIT_USAGE
    assert err.strip().splitlines() == [
        'essessey: the demo app needs uvicorn; install it with: pip install "essessey[server]"'
    ]
    monkeypatch.setitem(sys.modules, "essessey.demo", None)
    code, _, err = run(capsys, "demo")
    assert code == EXIT_USAGE
    assert "not part of this installation" in err
    assert _missing_extra_hint(ModuleNotFoundError(name="starlette.routing")) is not None
    assert _missing_extra_hint(ModuleNotFoundError(name="nats")) is not None
    assert "essessey[redis]" in (_missing_extra_hint(ModuleNotFoundError(name="redis")) or "")
    assert _missing_extra_hint(ModuleNotFoundError(name="something_else")) is None


def test_demo_metrics_without_its_extra_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules: importing it raises ModuleNotFoundError, as without the extra.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    code, out, err = run(capsys, "demo", "--metrics", "--port", str(free_port()))
    assert code == EXIT_USAGE
    assert out == ""
    assert err.strip().splitlines() == [
        'essessey: --metrics needs OpenTelemetry; install it with: pip install "essessey[metrics]"'
    ]


def test_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == EXIT_OK
    assert out.strip() == "essessey 0.1.0"
    code, _, err = run(capsys)
    assert code == EXIT_USAGE
    assert "tail" in err
    assert "check" in err
    code, _, err = run(capsys, "tail")
    assert code == EXIT_USAGE
    assert "URL" in err
    code, _, _ = run(capsys, "tail", "http://x", "--timeout", "-1")
    assert code == EXIT_USAGE


# -- as a real command ---------------------------------------------------------------


def test_the_command_runs_as_a_subprocess(url: str) -> None:
    command = [sys.executable, "-m", "essessey.cli"]
    tail = subprocess.run(
        [*command, "tail", f"{url}/turn", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert tail.returncode == EXIT_OK, tail.stderr
    assert tail.stdout == RENDERED  # not a terminal: no colour
    assert "stop: tool_use" in tail.stderr
    checked = subprocess.run(
        [*command, "check", "-"],
        input=BROKEN.read_bytes(),
        capture_output=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert checked.returncode == EXIT_VIOLATIONS
    assert b"[thinking-before-text]" in checked.stdout
    refused = subprocess.run(
        [*command, "tail", f"{url}/unauthorized"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert refused.returncode == EXIT_USAGE
    assert "HTTP 401: authentication_error: invalid x-api-key" in refused.stderr


def _asked_and_answered(tmp_path: Path) -> tuple[Path, Path]:
    """A recording of a turn that asked for an approval, without and with its answer."""
    from essessey import StreamHub, ToolApproval
    from essessey.demo._asking import demo_continuation
    from essessey.demo._scenario import agent_turn

    async def record() -> tuple[list[Any], list[Any]]:
        async with StreamHub(on_answer=demo_continuation) as hub:
            await hub.start("s", agent_turn("s", scenario="approval"))
            await hub.wait("s")
            asked, _ = await hub.store.since("s", None)
            waiting = await hub.waiting("s")
            assert waiting is not None
            first, second = waiting.requests
            answers = [ToolApproval(first.id, True), ToolApproval(second.id, False)]
            await hub.answer("s", answers)
            await hub.wait("s")
            whole, _ = await hub.store.since("s", None)
            return asked, whole

    asked, whole = anyio.run(record)
    (tmp_path / "asked.sse").write_bytes(encode_many(asked))
    (tmp_path / "whole.sse").write_bytes(encode_many(whole))
    return tmp_path / "asked.sse", tmp_path / "whole.sse"


def test_check_says_what_a_stream_waits_for_and_where_results_came(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asked, whole = _asked_and_answered(tmp_path)
    code, out, _ = run(capsys, "check", str(asked))
    assert code == EXIT_OK
    waits = [line for line in out.splitlines() if line.startswith("waits for: ")]
    assert len(waits) == 2
    assert waits[0].startswith("waits for: approval of get_weather (toolu_s_1), request apr_")
    code, out, _ = run(capsys, "check", str(whole))
    assert code == EXIT_OK
    assert "waits for" not in out
    assert 'get_weather (toolu_s_1) {"city":"Paris"} -> result in a later message' in out
    assert "tool result for get_weather (toolu_s_1) of an earlier message: result," in out


def test_tail_shows_what_a_turn_asks_and_the_answers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from essessey import SliceSource
    from essessey.bindings.sse import SSEDecoder
    from tests.servers import serve

    _, whole = _asked_and_answered(tmp_path)
    decoder = SSEDecoder()
    messages = decoder.feed(whole.read_bytes())
    events = [essessey_event(m.event, m.data, m.id) for m in messages]

    async def replay(request: Request) -> Response:
        return EventStreamResponse(SliceSource(events))

    app = Starlette(routes=[Route("/asked", replay)])
    with serve(app) as base:
        code, out, err = run(capsys, "tail", f"{base}/asked")
    assert code == EXIT_OK, err
    lines = out.splitlines()
    asks = [line for line in lines if line.startswith("[asks approval] get_weather (apr_")]
    assert len(asks) == 2
    assert any(line.startswith("[approved] apr_") for line in lines)
    assert any(line.startswith("[denied] apr_") for line in lines)


def essessey_event(name: str, data: str, event_id: str | None) -> Any:
    from essessey import Event

    return Event(name, data.encode(), event_id or None)
