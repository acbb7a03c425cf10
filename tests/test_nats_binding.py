"""Core NATS binding: NATSSink and NATSSource against a real nats-server (the ``nats``
fixture), checked both through the library and with a plain nats-py subscriber."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import nats as nats_py
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from essessey import Event, NATSConnectionLost, Publisher
from essessey._nats_py import flush_connection
from essessey.bindings.nats import (
    HEADER_EVENT_ID,
    NATSSink,
    NATSSource,
    check_token,
    event_subject,
    parse_subject,
    subscribe_all,
    subscribe_stream,
)
from essessey.bindings.nats import _core as nats_core
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.test_exactness import publish_seed_turn

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).parent / "fixtures" / "seed004_turn.sse"

BAD_TOKENS = ["", "a.b", ".", "a*", "*", ">", "a>", "a b", "a\tb", "a\nb", "a\rb", "\u00a0x"]


def fixture_pairs() -> list[tuple[str, bytes]]:
    # Each frame of the fixture is one "event:" line and one "data:" line.
    pairs: list[tuple[str, bytes]] = []
    for frame in FIXTURE.read_text("utf-8").split("\n\n"):
        if frame.strip():
            event_line, data_line = frame.split("\n")
            pairs.append((event_line.removeprefix("event: "), data_line[6:].encode()))
    return pairs


@asynccontextmanager
async def connect(server: NatsServer, **options: Any) -> AsyncIterator[Client]:
    nc = await nats_py.connect(server.url, **options)
    try:
        yield nc
    finally:
        await nc.close()


class IdSink:
    """Gives each event an id before handing it on, as an event store would."""

    def __init__(self, sink: NATSSink) -> None:
        self.sink = sink
        self.count = 0

    async def emit(self, event: Event) -> None:
        self.count += 1
        await self.sink.emit(event.with_id(f"{self.count}-0"))


async def collect(source: AsyncIterator[Any] | NATSSource) -> list[Any]:
    return [item async for item in source]


async def take(iterator: AsyncIterator[Any], count: int) -> list[Any]:
    items: list[Any] = []
    with anyio.fail_after(WAIT):
        while len(items) < count:
            items.append(await anext(iterator))
    return items


async def assert_nothing_arrives(sub: Subscription, nc: Client) -> None:
    await flush_connection(nc)
    with pytest.raises(nats_py.errors.TimeoutError):
        await sub.next_msg(timeout=0.2)


# -- the whole turn, end to end --------------------------------------------------------


async def test_seed_turn_arrives_byte_for_byte_with_ids(nats: NatsServer) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        source = await subscribe_stream(reader, "conv_1")
        sink = NATSSink(producer, "conv_1")
        received: list[Event] = []

        async def read() -> None:
            received.extend(await collect(source))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await publish_seed_turn(Publisher(IdSink(sink)))
                await sink.flush()
                # Drain: the server sends the reader everything routed to it, then the
                # source ends cleanly.
                await source.subscription.drain()

    expected = fixture_pairs()
    assert [(event.event, event.data) for event in received] == expected
    assert [event.id for event in received] == [f"{n}-0" for n in range(1, len(expected) + 1)]
    assert source.last_stream_id == "conv_1"
    assert source.last_event_id == f"{len(expected)}-0"


async def test_a_plain_nats_subscriber_sees_the_layout(nats: NatsServer) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        sub = await reader.subscribe("essessey.>")
        await flush_connection(reader)
        sink = NATSSink(producer, "conv_1")
        data = b'{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}'
        await sink.emit(Event("content_block_delta", data, "7-3"))
        await sink.emit(Event("ping", b'{"type":"ping"}'))
        await sink.flush()

        first: Msg = await sub.next_msg(timeout=WAIT)
        second: Msg = await sub.next_msg(timeout=WAIT)

    assert first.subject == "essessey.conv_1.content_block_delta"
    assert first.data == data
    assert first.headers == {"Essessey-Event-Id": "7-3"}
    assert second.subject == "essessey.conv_1.ping"
    assert second.data == b'{"type":"ping"}'
    # No id, no header: the message goes out as a plain PUB.
    assert second.headers is None


async def test_a_custom_dotted_prefix(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        raw = await nc.subscribe("tenant1.essessey.>")
        source = await subscribe_stream(nc, "s1", prefix="tenant1.essessey")
        sink = NATSSink(nc, "s1", prefix="tenant1.essessey")
        await sink.emit(Event("ping", b"{}", "1"))
        await sink.flush()
        assert (await raw.next_msg(timeout=WAIT)).subject == "tenant1.essessey.s1.ping"
        assert await take(aiter(source), 1) == [Event("ping", b"{}", "1")]
        assert sink.subject("ping") == "tenant1.essessey.s1.ping"
        await source.aclose()


# -- subject tokens ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_TOKENS)
async def test_an_invalid_stream_id_is_refused_before_anything_is_sent(
    nats: NatsServer, bad: str
) -> None:
    async with connect(nats) as nc:
        with pytest.raises(ValueError, match="stream id"):
            NATSSink(nc, bad)
        with pytest.raises(ValueError, match="stream id"):
            await subscribe_stream(nc, bad)
        assert nc.stats["out_msgs"] == 0


@pytest.mark.parametrize("bad", BAD_TOKENS)
async def test_an_invalid_event_name_publishes_nothing(nats: NatsServer, bad: str) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        watcher = await reader.subscribe(">")
        await flush_connection(reader)
        sink = NATSSink(producer, "conv_1")
        for _ in range(2):  # the second time, nothing cached lets it through
            with pytest.raises(ValueError, match="event name"):
                await sink.emit(Event(bad, b'{"type":"ping"}', "1"))
        assert producer.stats["out_msgs"] == 0
        await flush_connection(producer)
        await assert_nothing_arrives(watcher, reader)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a..b",
        ".a",
        "a.",
        "a.*",
        ">",
        "a b",
        "x.y z",
        # Every token valid, the whole too long: a subject past the server's command line
        # limit closes the connection, every stream on it with it.
        ".".join(["x" * 256] * 16),
        ".".join(["\U0001f600" * 256] * 2),
    ],
)
async def test_an_invalid_prefix_is_refused(nats: NatsServer, bad: str) -> None:
    async with connect(nats) as nc:
        with pytest.raises(ValueError, match="prefix"):
            NATSSink(nc, "conv_1", prefix=bad)
        with pytest.raises(ValueError, match="prefix"):
            await subscribe_all(nc, prefix=bad)
        sub = await nc.subscribe("essessey.>")
        with pytest.raises(ValueError, match="prefix"):
            NATSSource(sub, prefix=bad)


@pytest.mark.parametrize(
    "bad",
    # What nats-py's header would change, and what no reader takes as an id (NATSSource
    # skips it: the event would be lost to every reader).
    [" 1", "1 ", "1\r\n2", "a\nb", "\t", "a\tb", "a\x00b", "a\x1bb", "7" * 257],
)
async def test_an_id_the_header_would_change_publishes_nothing(nats: NatsServer, bad: str) -> None:
    async with connect(nats) as nc:
        sink = NATSSink(nc, "conv_1")
        with pytest.raises(ValueError, match="event id"):
            await sink.emit(Event("ping", b"{}", bad))
        assert nc.stats["out_msgs"] == 0


@pytest.mark.parametrize("direct", [True, False], ids=["buffered", "nats-py-publish"])
async def test_a_payload_that_fits_but_not_with_its_id_header_publishes_nothing(
    nats: NatsServer, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server counts the header section in max_payload and, over it, closes the whole
    # connection (every source and sink on it); nats-py counted the payload alone.
    if not direct:
        monkeypatch.setattr(nats_core, "direct_publish", lambda nc: None)
    async with connect(nats) as nc:
        sink = NATSSink(nc, "conv_1")
        data = b"x" * (nc.max_payload - 20)
        with pytest.raises(nats_py.errors.MaxPayloadError):
            await sink.emit(Event("ping", data, "evt-1"))
        await sink.emit(Event("ping", data))  # without the header it fits
        await flush_connection(nc)
        assert nc.is_connected
        assert nc.stats["out_msgs"] == 1


def test_subject_helpers() -> None:
    assert event_subject("conv_1", "ping") == "essessey.conv_1.ping"
    assert event_subject("c", "e", prefix="a.b") == "a.b.c.e"
    assert parse_subject("essessey.conv_1.message_stop") == ("conv_1", "message_stop")
    assert parse_subject("a.b.c.e", "a.b") == ("c", "e")
    assert check_token("conv-1_é") == "conv-1_é"
    for subject, reason in [
        ("other.conv_1.ping", "prefix"),
        ("essessey.conv_1", "1 tokens"),
        ("essessey.a.b.c", "3 tokens"),
        ("essessey..ping", "empty stream id"),
        ("essessey.conv_1.", "2 tokens"),
        ("essesseyx.a.b", "prefix"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_subject(subject)
    with pytest.raises(ValueError, match="event name"):
        event_subject("conv_1", "a.b")


# -- reading ------------------------------------------------------------------------------


async def test_subscribe_all_sees_two_streams_interleaved(nats: NatsServer) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        everything = await subscribe_all(reader)
        plain = await subscribe_all(reader)
        only_b = await subscribe_stream(reader, "conv_b")
        sinks = {"conv_a": NATSSink(producer, "conv_a"), "conv_b": NATSSink(producer, "conv_b")}
        sent: list[tuple[str, Event]] = []
        for n in range(10):
            stream_id = "conv_a" if n % 3 else "conv_b"
            event = Event("content_block_delta", b'{"n":%d}' % n, str(n))
            await sinks[stream_id].emit(event)
            sent.append((stream_id, event))
        await flush_connection(producer)

        assert await take(everything.with_stream_ids(), len(sent)) == sent
        events = aiter(plain)
        for stream_id, event in sent:
            assert await take(events, 1) == [event]
            assert plain.last_stream_id == stream_id
        only = [event for stream_id, event in sent if stream_id == "conv_b"]
        assert await take(aiter(only_b), len(only)) == only


async def test_concurrent_emits_all_arrive(nats: NatsServer) -> None:
    tasks, per_task = 8, 250
    async with connect(nats) as producer, connect(nats) as reader:
        source = await subscribe_stream(reader, "conv_1")
        sink = NATSSink(producer, "conv_1")

        async def produce(task: int) -> None:
            for n in range(per_task):
                await sink.emit(
                    Event("content_block_delta", b'{"t":%d,"n":%d}' % (task, n), f"{task}-{n}")
                )
                if n % 16 == 0:
                    await anyio.lowlevel.checkpoint()  # let the other producers interleave

        async with anyio.create_task_group() as tg:
            for task in range(tasks):
                tg.start_soon(produce, task)
        await sink.flush()
        received = await take(aiter(source), tasks * per_task)

    assert len({event.id for event in received}) == tasks * per_task
    for task in range(tasks):
        # Each producer's own events keep their order.
        mine = [event.id for event in received if event.id and event.id.startswith(f"{task}-")]
        assert mine == [f"{task}-{n}" for n in range(per_task)]


async def test_header_name_is_matched_in_any_case(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        source = await subscribe_stream(nc, "conv_1")
        await nc.publish("essessey.conv_1.ping", b"{}", headers={"essessey-event-id": "9"})
        await nc.publish("essessey.conv_1.ping", b"{}", headers={"Other": "x"})
        await nc.publish("essessey.conv_1.ping", b"{}", headers={HEADER_EVENT_ID: ""})
        got = await take(aiter(source), 3)
    assert got == [Event("ping", b"{}", "9"), Event("ping", b"{}"), Event("ping", b"{}")]


async def test_a_malformed_subject_is_skipped_with_a_warning(
    nats: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="essessey.nats")
    secret = b'{"text":"secret-model-output"}'
    async with connect(nats) as nc:
        # A wider subscription than the helpers make, so bad subjects can reach it.
        source = NATSSource(await nc.subscribe(">"))
        for subject in [
            "essessey.conv_1",
            "essessey.conv_1.ping.extra",
            "elsewhere.conv_1.ping",
            "essessey.conv_1.ping",
        ]:
            await nc.publish(subject, secret, headers={HEADER_EVENT_ID: "5"})
        # Messages from one connection arrive in order: the three bad ones were skipped.
        assert await take(aiter(source), 1) == [Event("ping", secret, "5")]

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    messages = [r.getMessage() for r in warnings]
    assert len(messages) == 3
    assert messages[0] == (
        "skipped a NATS message: subject has 1 tokens after the prefix, expected 2 "
        "(subject of 15 characters)"
    )
    assert "3 tokens" in messages[1]
    assert "(subject of 26 characters)" in messages[1]
    assert "does not start with the prefix" in messages[2]
    assert b"secret" not in caplog.text.encode()


async def test_tokens_and_ids_no_sink_would_send_are_skipped_with_a_warning(
    nats: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # They were delivered: an escape sequence as an event name, a 1,000-character stream
    # id, an id holding NUL that the SSE encoder then refused (a relay to SSE failed).
    caplog.set_level(logging.WARNING, logger="essessey.nats")
    async with connect(nats) as nc:
        source = NATSSource(await nc.subscribe(">"))
        for subject, event_id in [
            ("essessey.conv_1.\x1b[2J", "1"),
            ("essessey." + "s" * 1000 + ".ping", "2"),
            ("essessey.conv_1.ping", "a\x00b"),
            ("essessey.conv_1.ping", "7" * 5000),
            ("essessey.conv_1.ping", "8"),
        ]:
            await nc.publish(subject, b"{}", headers={HEADER_EVENT_ID: event_id})
        assert await take(aiter(source), 1) == [Event("ping", b"{}", "8")]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 4
    assert "event name token (4 characters)" in messages[0]
    assert "stream id token (1000 characters)" in messages[1]
    assert "event id (3 characters)" in messages[2]
    assert "event id (5000 characters)" in messages[3]


# -- how a source ends ---------------------------------------------------------------------


async def test_the_source_ends_cleanly_on_unsubscribe(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        source = await subscribe_stream(nc, "conv_1")
        sink = NATSSink(nc, "conv_1")
        received: list[Event] = []
        first = anyio.Event()

        async def read() -> None:
            async for event in source:
                received.append(event)
                first.set()

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await sink.emit(Event("ping", b"{}", "1"))
                await sink.flush()
                await first.wait()
                # The reader is now waiting for a next message that will not come.
                await source.subscription.unsubscribe()
    assert received == [Event("ping", b"{}", "1")]


@pytest.mark.parametrize("how", ["sub.drain", "nc.drain", "aclose", "limit"])
async def test_the_source_ends_cleanly_when_drained(nats: NatsServer, how: str) -> None:
    async with connect(nats) as nc:
        source = await subscribe_stream(nc, "conv_1")
        sink = NATSSink(nc, "conv_1")
        if how == "limit":
            await source.subscription.unsubscribe(limit=3)
        for n in range(3):
            await sink.emit(Event("ping", b"{}", str(n)))
        await sink.flush()
        received: list[Event] = []

        async def read() -> None:
            received.extend(await collect(source))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                if how == "aclose":
                    # What the client already holds is still handed out, then the end.
                    await source.aclose()
                    await source.aclose()  # twice is fine
                    await sink.emit(Event("ping", b"{}", "late"))
                    await sink.flush()
                tg.start_soon(read)
                # A drain waits until the reader has taken every message it holds.
                if how == "sub.drain":
                    await source.subscription.drain()
                elif how == "nc.drain":
                    await nc.drain()
    assert [event.id for event in received] == ["0", "1", "2"]


async def test_a_source_is_read_once_and_needs_a_plain_subscription(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        source = await subscribe_all(nc)
        aiter(source)
        with pytest.raises(RuntimeError, match="once"):
            source.with_stream_ids()

        async def callback(msg: Msg) -> None:
            pass

        with pytest.raises(ValueError, match="without a callback"):
            NATSSource(await nc.subscribe("essessey.>", cb=callback))


async def test_a_killed_server_raises_not_a_clean_end(nats: NatsServer) -> None:
    async with connect(nats, allow_reconnect=False) as reader, connect(nats) as producer:
        source = await subscribe_stream(reader, "conv_1")
        sink = NATSSink(producer, "conv_1")
        await sink.emit(Event("ping", b"{}", "1"))
        await sink.flush()
        events = aiter(source)
        assert await take(events, 1) == [Event("ping", b"{}", "1")]

        async def kill_soon() -> None:
            await anyio.sleep(0.1)  # the reader is waiting for its next message
            await anyio.to_thread.run_sync(functools.partial(nats.stop, kill=True))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_soon)
                with pytest.raises(NATSConnectionLost) as caught:
                    await anext(events)
    assert isinstance(caught.value.__cause__, nats_py.errors.UnexpectedEOF)


async def test_reconnect_giving_up_raises(nats: NatsServer) -> None:
    options = {"max_reconnect_attempts": 1, "reconnect_time_wait": 0}
    async with connect(nats, **options) as reader:
        source = await subscribe_all(reader)
        await anyio.to_thread.run_sync(functools.partial(nats.stop, kill=True))
        with anyio.fail_after(WAIT), pytest.raises(NATSConnectionLost):
            await collect(source)


async def test_closing_the_connection_under_a_reader_raises(nats: NatsServer) -> None:
    # nc.close() drops what the subscription had not read yet: not a clean end.
    async with connect(nats) as nc:
        source = await subscribe_stream(nc, "conv_1")
        await nc.close()
        with anyio.fail_after(WAIT), pytest.raises(NATSConnectionLost) as caught:
            await collect(source)
    assert caught.value.__cause__ is None


async def test_flush_waits_for_what_was_buffered_before_it(nats: NatsServer) -> None:
    # nats-py's own flush writes its PING ahead of commands still in the client's buffer;
    # the sink's flush must not. Watching the client's writes shows the order the server
    # reads them in (a test-only look at nats-py's transport).
    async with connect(nats) as nc:
        written: list[bytes] = []
        transport: Any = nc._transport
        write, writelines = transport.write, transport.writelines

        def record_write(data: bytes) -> None:
            written.append(bytes(data))
            write(data)

        def record_writelines(lines: list[bytes]) -> None:
            written.extend(bytes(line) for line in lines)
            writelines(lines)

        transport.write, transport.writelines = record_write, record_writelines
        await subscribe_stream(nc, "conv_1")
        sink = NATSSink(nc, "conv_1")
        await sink.emit(Event("ping", b"{}", "1"))
        await sink.emit(Event("ping", b"{}"))
        await sink.flush()

    kinds = [line.split(b" ", 1)[0].strip() for line in written]
    assert kinds == [b"SUB", b"PING", b"HPUB", b"PUB", b"PING"]


async def test_flush_connection_keeps_a_cancellation_nats_py_swallows() -> None:
    class Stuck:
        """A client whose buffer never gets written, and which swallows cancellation
        while it waits for that, as nats-py 2.16's ``_flush_pending`` does."""

        is_connected = True
        flushed = False

        async def _flush_pending(self, force_flush: bool = False) -> None:
            with suppress(asyncio.CancelledError):
                await asyncio.get_running_loop().create_future()

        async def flush(self) -> None:
            self.flushed = True

    stuck: Any = Stuck()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await flush_connection(stuck)
    assert not stuck.flushed


async def test_the_public_iterator_alone_gives_the_same_results(
    nats: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a nats-py without the internals the fast path reads would give.
    monkeypatch.setattr(nats_core, "queued_messages", lambda sub, messages: None)
    monkeypatch.setattr(nats_core, "direct_publish", lambda nc: None)
    async with connect(nats) as producer, connect(nats) as reader:
        source = await subscribe_stream(reader, "conv_1")
        lost = await subscribe_all(reader)
        sink = NATSSink(producer, "conv_1")
        received: list[Event] = []

        async def read() -> None:
            received.extend(await collect(source))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await publish_seed_turn(Publisher(IdSink(sink)))
                await sink.flush()
                await source.subscription.drain()
        assert [(event.event, event.data) for event in received] == fixture_pairs()
        assert received[-1].id == "16-0"
        await reader.close()
        with anyio.fail_after(WAIT), pytest.raises(NATSConnectionLost):
            await collect(lost)
