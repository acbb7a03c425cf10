"""Requests a careless or hostile client makes, against real servers: a store with no
room for another turn (503, never a 500), answers that name only request ids (which a
model need not make unique across turns: they go to the turn that waits for them, and
one user's never continues another's), a body that trickles in (408), a resume point in
the middle of a message (a few log lines, not one per event), and the small refusals
(a chat already running, a completion that does not exist, a body nested too deeply); a
store out of reach (503)."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from starlette.applications import Starlette

from essessey import Answered, InMemoryEventStore, Publisher, StreamHub, continue_turn, stream_turn
from essessey.bindings import http as http_binding
from essessey.bindings.sse import MAX_ID_LENGTH
from essessey.dialects import DialectRequest, dialect_routes
from essessey.dialects.chat_completions import ChatCompletionRequest, chat_completions_routes
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import ChatRequest
from essessey.event import Event
from essessey.hub import TurnProducer
from essessey.protocol import EventType
from tests.processes import WAIT
from tests.redis_server import store_out_of_reach
from tests.scripted_turn import scripted_turn
from tests.servers import serve, serve_dialects

USER = [{"role": "user", "content": "hi"}]


def held_or_scripted(request: DialectRequest) -> TurnProducer:
    """A turn that runs until the server stops, for a Chat Completions request of the
    model ``hold``; the scripted turn for any other."""
    if isinstance(request, ChatRequest):
        return scripted_turn(request.id, delay=float(request.body.get("delay_ms", 0)) / 1000)
    if isinstance(request, ChatCompletionRequest) and request.model == "hold":

        async def hold(publisher: Publisher) -> None:
            await publisher.send_stream_preamble("msg_h", request.id, "hold")
            await anyio.sleep(WAIT)

        return hold
    return scripted_turn("s")


def test_a_full_store_is_a_503_on_every_dialect_never_a_500() -> None:
    # No grace at shutdown: the held turns are cancelled when the server stops.
    hub = StreamHub(InMemoryEventStore(max_streams=2), shutdown_grace=0)
    app = Starlette(routes=list(dialect_routes(hub, held_or_scripted)), lifespan=hub.lifespan)
    hold = {"model": "hold", "messages": USER, "stream": True}
    ui = {"id": "full-chat", "messages": [{"id": "u", "role": "user", "parts": []}]}
    with serve(app, lifespan="on") as url, contextlib.ExitStack() as held:
        for _ in range(2):  # two running turns fill the store
            opened = httpx.stream("POST", f"{url}/v1/chat/completions", json=hold, timeout=WAIT)
            assert held.enter_context(opened).status_code == 200
        answers = {
            "chat": httpx.post(
                f"{url}/v1/chat/completions", json={"model": "m", "messages": USER}, timeout=WAIT
            ),
            "responses": httpx.post(
                f"{url}/v1/responses", json={"model": "m", "input": "hi"}, timeout=WAIT
            ),
            "ui": httpx.post(f"{url}/api/chat", json=ui, timeout=WAIT),
            "agui": httpx.post(
                f"{url}/agui", json={"threadId": "t", "runId": "r", "messages": []}, timeout=WAIT
            ),
        }
    for dialect, answer in answers.items():
        assert answer.status_code == 503, (dialect, answer.text)
        assert "overloaded_error" in answer.text, (dialect, answer.text)


def test_a_store_out_of_reach_is_a_503_on_every_route_never_a_500() -> None:
    # A Redis store with no Redis behind it (nothing listens on its port): every route
    # that reads or writes the store before it answers says so with a 503 in its
    # dialect's shape; a subscription has begun already, and ends for its reader to
    # come back.
    hub = StreamHub(store_out_of_reach(), on_answer=answer_nothing)
    app = Starlette(routes=list(dialect_routes(hub, held_or_scripted)), lifespan=hub.lifespan)
    ui = {"id": "c1", "messages": [{"id": "u", "role": "user", "parts": []}]}
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    answering = [*USER, {"role": "assistant", "tool_calls": calls}]
    answering.append({"role": "tool", "tool_call_id": "call_1", "content": "ok"})
    agui = {"threadId": "t", "runId": "r", "messages": [{"id": "m", "role": "user"}]}
    requests: list[tuple[str, str, Any, str]] = [
        ("POST", "/api/chat", ui, '"type":"error"'),
        ("GET", "/api/chat/c1/stream", None, '"type":"error"'),
        ("POST", "/api/chat/c1/stop", None, '"type":"error"'),
        ("POST", "/agui", agui, '"type":"RUN_ERROR"'),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": USER}, '"error":{'),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": answering}, '"error":{'),
        ("POST", "/v1/responses", {"model": "m", "input": "hi"}, '"error":{'),
        ("GET", "/v1/responses/resp_x", None, '"error":{'),
        ("POST", "/streams/s1/cancel", None, '"type":"error"'),
        ("POST", "/streams/s1/answer", {"answers": [{"id": "a", "approved": True}]}, '"type":'),
    ]
    with serve(app, lifespan="on") as url:
        for method, path, body, shape in requests:
            answer = httpx.request(method, url + path, json=body, timeout=WAIT)
            assert answer.status_code == 503, (path, answer.status_code, answer.text)
            assert "the event store is unavailable" in answer.text, (path, answer.text)
            assert shape in answer.text.replace(" ", ""), (path, answer.text)
        followed = httpx.get(f"{url}/streams/s1", timeout=WAIT)
        assert followed.status_code == 200
        assert followed.text == ""  # ended: an EventSource comes back after its retry


def answer_nothing(publisher: Publisher, answered: Answered) -> Any:
    raise AssertionError("no answer reaches a turn while the store is out of reach")


# -- answers that name only request ids ----------------------------------------------------


def asking_turn(call_id: str) -> Any:
    """A turn that runs ``lookup`` itself, then asks the client to run ``get_location``
    under ``call_id``: ids a model numbers per turn (Kimi's ``functions.name:0``)."""

    def turn(request: ChatCompletionRequest) -> TurnProducer:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id="msg_" + request.id[-8:], stream_id=request.id, model="m"
            ) as asking:
                tools = await asking.tools()
                await tools.start_call("functions.lookup:0", "lookup", "{}")
                await tools.write_result("functions.lookup:0", "found")
                await asking.call_client_tool("get_location", {}, tool_use_id=call_id)

        return produce

    return turn


@pytest.fixture
def asking_app(request: pytest.FixtureRequest) -> Iterator[str]:
    authorize = getattr(request, "param", None)

    async def go_on(publisher: Publisher, answered: Answered) -> None:
        async with continue_turn(publisher, answered) as turn:
            outputs = [output.text for _, output in answered.tool_outputs()]
            await (await turn.text()).write(f"{answered.stream_id} got {outputs}")

    hub = StreamHub(on_answer=go_on, authorize=authorize)
    routes = list(chat_completions_routes(hub, asking_turn("functions.get_location:1")))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        yield url


def answer_all(first: Any, content: str) -> list[dict[str, Any]]:
    """What an OpenAI client sends back: the assistant message, a tool message for every
    call it names (the one the turn ran itself too)."""
    message = first.choices[0].message
    calls = [c.model_dump() for c in message.tool_calls]
    tools = [{"role": "tool", "tool_call_id": c["id"], "content": content} for c in calls]
    return [*USER, {"role": "assistant", "content": None, "tool_calls": calls}, *tools]


def sdk(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=WAIT)


def test_a_call_id_no_stream_id_could_hold_is_answered(asking_app: str) -> None:
    client = sdk(asking_app)
    first = client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    ids = [c.id for c in first.choices[0].message.tool_calls or []]
    assert ids == ["functions.lookup:0", "functions.get_location:1"]
    # Every call answered, as OpenAI requires: the one the turn ran itself is left out.
    done = client.chat.completions.create(model="m", messages=answer_all(first, "59.9"))  # type: ignore[arg-type]
    assert done.choices[0].message.content == f"{first.id} got ['59.9']"


def test_two_turns_asking_the_same_ids_are_not_mixed_up(asking_app: str) -> None:
    client = sdk(asking_app)
    first = client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    # The same ids wait in two turns, which nothing tells apart: refused, not guessed.
    with pytest.raises(openai.ConflictError) as refused:
        client.chat.completions.create(model="m", messages=answer_all(first, "A"))  # type: ignore[arg-type]
    assert "several turns wait" in str(refused.value)


class CountingHub(StreamHub):
    """A hub that counts the index reads of the answers it is given."""

    looked_up = 0

    async def asking_streams(self, request_id: str) -> list[str]:
        self.looked_up += 1
        return await super().asking_streams(request_id)


def test_an_answer_naming_thousands_of_ids_reads_each_once_and_at_most_a_bound() -> None:
    # Each tool message's id was looked up in the store, repeats too: 60,000 of them (a
    # 3.4 MB body) held the event loop for seconds, every other request waiting.
    from essessey.dialects._routes import MAX_ANSWER_IDS_LOOKED_UP

    async def go_on(publisher: Publisher, answered: Answered) -> None:
        async with continue_turn(publisher, answered) as turn:
            await (await turn.text()).write("never")

    hub = CountingHub(on_answer=go_on)
    routes = list(chat_completions_routes(hub, asking_turn("functions.get_location:1")))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        client = sdk(url)
        first = client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
        messages = answer_all(first, "59.9")
        *head, lookup, location = messages
        repeats = [location] * 5_000
        others = [{**location, "tool_call_id": f"call_{n}"} for n in range(3_000)]
        hub.looked_up = 0
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="m",
                messages=[*head, *repeats, *others, lookup, location],  # type: ignore[list-item]
            )
    assert "answered twice" in str(refused.value)
    assert hub.looked_up == MAX_ANSWER_IDS_LOOKED_UP


def owner_only(connection: Any, stream_id: str, access: str) -> bool:
    """Each user reads and answers only the turns it started (its key names them)."""
    key = connection.headers.get("authorization", "")
    owners = OWNERS.setdefault(stream_id, key) if access == "read" else OWNERS.get(stream_id)
    return owners == key


OWNERS: dict[str, str] = {}


@pytest.mark.parametrize("asking_app", [owner_only], indirect=True)
def test_one_users_answer_never_continues_another_users_turn(asking_app: str) -> None:
    alice, bob = sdk(asking_app, "alice"), sdk(asking_app, "bob")
    first = alice.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    other = bob.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    mine = alice.chat.completions.create(model="m", messages=answer_all(first, "A"))  # type: ignore[arg-type]
    assert mine.choices[0].message.content == f"{first.id} got ['A']"
    theirs = bob.chat.completions.create(model="m", messages=answer_all(other, "B"))  # type: ignore[arg-type]
    assert theirs.choices[0].message.content == f"{other.id} got ['B']"


# -- the small refusals ----------------------------------------------------------------------


@pytest.fixture
def dialects() -> Iterator[str]:
    with serve_dialects(held_or_scripted) as url:
        yield url


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/chat/completions/chatcmpl-x", "GET, HEAD"),
        ("PUT", "/v1/responses", "POST"),
        ("DELETE", "/v1/responses/resp_x", "GET, HEAD"),
        ("GET", "/v1/responses/resp_x/cancel", "POST"),
        ("GET", "/agui", "POST"),
        ("GET", "/api/chat", "POST"),
        ("POST", "/api/chat/c1/stream", "GET, HEAD"),
        ("GET", "/api/chat/c1/stop", "POST"),
    ],
)
def test_a_method_a_route_does_not_take_is_a_405_in_its_dialect_s_shape(
    dialects: str, method: str, path: str, allow: str
) -> None:
    # Starlette's own 405 is text: an OpenAI client could not read it as its error.
    answer = httpx.request(method, dialects + path, timeout=WAIT)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    body = answer.json()
    if path == "/agui":
        assert body["type"] == "RUN_ERROR"
    else:
        assert body["error"]["type"] == "invalid_request_error"


def test_a_completion_that_is_not_kept_is_a_404_read_whole(dialects: str) -> None:
    for name in ("nope", "nope.1-2", "%ff.%fe"):
        got = httpx.get(
            f"{dialects}/v1/chat/completions/{name}",
            headers={"accept": "application/json"},
            timeout=WAIT,
        )
        assert got.status_code == 404, (name, got.text)
        assert got.json()["error"]["type"] == "not_found_error"


def test_a_second_message_while_the_chats_turn_runs_is_a_409(dialects: str) -> None:
    body = {"id": "busy", "messages": [{"id": "u", "role": "user", "parts": []}]}
    body["delay_ms"] = 200
    with httpx.stream("POST", f"{dialects}/api/chat", json=body, timeout=WAIT) as first:
        assert first.status_code == 200
        second = httpx.post(f"{dialects}/api/chat", json=body, timeout=WAIT)
    assert second.status_code == 409, second.text
    assert "a turn is running on this chat" in second.text


def test_the_longest_chat_id_starts_a_turn_and_a_longer_one_is_a_400(dialects: str) -> None:
    # A turn's stream id is the chat id and 17 characters more: a chat id with no room
    # for them was taken, and its turn's id refused by the hub (a 500).
    longest = MAX_ID_LENGTH - 17
    body = {"messages": [{"id": "u", "role": "user", "parts": []}]}
    taken = httpx.post(f"{dialects}/api/chat", json={**body, "id": "c" * longest}, timeout=WAIT)
    assert taken.status_code == 200, taken.text
    assert '"finish"' in taken.text
    for length in (longest + 1, MAX_ID_LENGTH - 6):
        refused = httpx.post(
            f"{dialects}/api/chat", json={**body, "id": "c" * length}, timeout=WAIT
        )
        assert refused.status_code == 400, (length, refused.text)
        assert f"1 to {longest} printable characters" in refused.text


def test_a_chat_body_nested_too_deeply_is_a_400(dialects: str) -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    message = {"id": "u", "role": "user", "parts": [], "content": deep}
    got = httpx.post(
        f"{dialects}/api/chat", json={"id": "deep", "messages": [message]}, timeout=WAIT
    )
    assert got.status_code == 400
    assert "nested too deeply" in got.text


def test_a_starting_after_of_other_digits_is_refused_in_our_words(dialects: str) -> None:
    for value in ("\u00b2", "\u0661"):  # superscript two, Arabic-Indic one
        got = httpx.get(
            f"{dialects}/v1/responses/resp_x",
            params={"stream": "true", "starting_after": value},
            timeout=WAIT,
        )
        assert got.status_code == 400, (value, got.text)
        assert "sequence number" in got.text


def test_a_body_that_trickles_in_is_a_408(dialects: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_binding, "BODY_TIMEOUT", 0.5)
    host, port = dialects.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ncontent-length: 100\r\n\r\n{"
        )
        started = time.monotonic()
        raw.settimeout(WAIT)
        answer = raw.recv(4096)
        # The head and the body may come in two segments (a loaded machine).
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length and (more := raw.recv(4096)):
            body += more
        answer = head + b"\r\n\r\n" + body
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert time.monotonic() - started < WAIT
    assert b"did not arrive within" in answer


def test_a_resume_in_the_middle_of_a_message_logs_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A client may name any event as the point a continuation follows: read from the
    # middle of a message, every event before the next message is skipped, and said so
    # a few times (1st, 2nd, 4th, ...), not once per event.
    events = [Event(EventType.CONTENT_BLOCK_DELTA, b"{}", f"1-{n}") for n in range(1, 2001)]
    encoder = ResponsesEncoder("resp_1")
    with caplog.at_level(logging.DEBUG, logger="essessey.dialects"):
        assert b"".join(encoder.encode(event) for event in events) == b""
    lines = [r for r in caplog.records if "skipped a content_block_delta" in r.getMessage()]
    assert 5 <= len(lines) <= 12
    assert lines[-1].getMessage().endswith("(1024 so far)")


def test_an_index_stream_read_by_id_ends_instead_of_waiting(dialects: str) -> None:
    # Which turn a chat is on is a stream of records, not a turn: read by id like any
    # stream, it gives what it holds and ends (it waited until the stream expired).
    body = {"id": "indexed", "messages": [{"id": "u", "role": "user", "parts": []}]}
    assert httpx.post(f"{dialects}/api/chat", json=body, timeout=WAIT).status_code == 200
    started = time.monotonic()
    read = httpx.get(f"{dialects}/streams/indexed~turns", timeout=WAIT)
    assert time.monotonic() - started < WAIT / 2
    assert read.status_code == 200
    assert read.text.count("event: turn\n") == 1
    assert read.text.count("event: finished\n") == 1


async def _send_and_reset(port: int, body: bytes) -> None:
    """A chat request sent whole, then the connection reset at once, nothing read."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    await stream.send(head + body)
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    await stream.aclose()  # a linger of 0: the close is a reset


def test_clients_gone_before_the_answer_starts_log_no_error_under_uvloop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Under uvloop a connection reset before the answer's first bytes leaves the transport
    # a socket whose descriptor is -1: setting its send timeout raised ValueError, which
    # uvicorn logged as an exception of the app, once per such client.
    from tests.ui_app import create_app

    body = b'{"id": "gone", "messages": [], "trigger": "submit-message"}'
    caplog.set_level(logging.ERROR)
    with serve(
        create_app(), http="httptools", loop="uvloop", lifespan="on", log_config=None
    ) as url:
        port = int(url.rsplit(":", 1)[1])

        async def resets() -> None:
            for n in range(30):
                await _send_and_reset(port, body.replace(b"gone", b"gone-%d" % n))
            await anyio.sleep(0.5)  # the server reads the resets

        anyio.run(resets)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == []
