"""The nats-py internals essessey's publishing and reading rely on (essessey/_nats_py.py,
shared by the NATS binding and the JetStream store; the JetStream follower's are in
test_jetstream_store.py), checked on the installed nats-py against a real nats-server:
each fast path is taken, and does what the public call it stands in for does. A nats-py
release that changes them fails here first, by name, instead of making every reader and
producer quietly slower."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import nats as nats_py
import pytest
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js import errors as js_errors
from nats.js.client import JetStreamContext

from essessey import Event, Publisher, _nats_py
from essessey._nats_py import (
    JetStreamPublish,
    direct_jetstream_publish,
    direct_publish,
    flush_connection,
    header_block,
    queued_messages,
)
from essessey.bindings.nats import NATSSink, subscribe_stream
from essessey.stores.jetstream import JetStreamEventStore
from essessey.testing import delta
from tests.nats_server import NatsServer
from tests.processes import WAIT

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def connect(server: NatsServer, **options: Any) -> AsyncIterator[Client]:
    nc = await nats_py.connect(server.url, allow_reconnect=False, **options)
    try:
        yield nc
    finally:
        await nc.close()


async def test_the_installed_nats_py_has_what_both_fast_paths_read(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        assert direct_publish(nc) is not None, "nats-py's client internals changed"
        assert direct_jetstream_publish(nc) is not None, "nats-py's request internals changed"
        sub = await nc.subscribe("x.>")
        assert queued_messages(sub, sub.messages) is not None, (
            "nats-py's subscription internals changed"
        )


def _buffered_at_once(sending: Coroutine[Any, Any, None]) -> bool:
    """Whether ``NATSSink.emit`` buffered the message in its own call (its direct
    publish), rather than handing back nats-py's publish coroutine."""
    return sending.cr_code.co_name == "_buffered"


async def test_a_direct_publish_sends_what_publish_sends(nats: NatsServer) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        received: list[Msg] = []
        sub = await reader.subscribe("essessey.s.*")
        await flush_connection(reader)  # nats-py's flush() can overtake the SUB
        sink = NATSSink(producer, "s")
        events = [Event("ping", b'{"n":1}'), Event("pong", b"{}", "17-0"), Event("ping", b"")]
        before = dict(producer.stats)
        for event in events:
            headers = {"Essessey-Event-Id": event.id} if event.id else None
            await producer.publish(sink.subject(event.event), event.data, headers=headers)
        public = {key: producer.stats[key] - before[key] for key in ("out_msgs", "out_bytes")}
        before = dict(producer.stats)
        for event in events:
            sending = sink.emit(event)
            assert _buffered_at_once(sending), "the sink's direct publish was not taken"
            await sending
        direct = {key: producer.stats[key] - before[key] for key in ("out_msgs", "out_bytes")}
        await sink.flush()
        with anyio.fail_after(WAIT):
            for _ in range(2 * len(events)):
                received.append(await sub.next_msg(WAIT))
    assert direct == public == {"out_msgs": 3, "out_bytes": 7 + 2}
    seen = [(msg.subject, msg.data, msg.headers) for msg in received]
    assert seen[:3] == seen[3:]
    assert seen[1] == ("essessey.s.pong", b"{}", {"Essessey-Event-Id": "17-0"})
    assert seen[2] == ("essessey.s.ping", b"", None)


async def test_a_direct_publish_declines_what_publish_would_refuse(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        sink = NATSSink(nc, "s")
        too_big = Event("ping", b"x" * (nc.max_payload + 1))
        sending = sink.emit(too_big)
        assert not _buffered_at_once(sending)
        with pytest.raises(nats_errors.MaxPayloadError):
            await sending
        sent = nc.stats["out_msgs"]
        await nc.close()
        sending = sink.emit(Event("ping", b"{}"))
        assert not _buffered_at_once(sending)
        with pytest.raises(nats_errors.ConnectionClosedError):
            await sending
        assert nc.stats["out_msgs"] == sent


async def test_a_direct_publish_declines_what_publish_would_wait_for(nats: NatsServer) -> None:
    # Over the client's buffer limit nats-py flushes and waits: the public call's to do.
    async with connect(nats, pending_size=1024) as producer, connect(nats) as reader:
        sub = await reader.subscribe("essessey.s.*")
        await flush_connection(reader)  # nats-py's flush() can overtake the SUB
        sink = NATSSink(producer, "s")
        big = Event("ping", b"y" * 2048)
        sending = sink.emit(big)
        assert not _buffered_at_once(sending)
        await sending
        with anyio.fail_after(WAIT):
            msg = await sub.next_msg(WAIT)
        assert msg.data == big.data


async def test_a_publisher_on_the_sink_never_suspends_while_connected(nats: NatsServer) -> None:
    async with connect(nats) as nc:
        publisher = Publisher(NATSSink(nc, "s"))
        await publisher.send_stream_preamble("msg_1", "s", "m")
        await publisher.send_content_block_start_text(0)
        checkpoint = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(checkpoint.set_result, None)
        for n in range(100):
            await publisher.send_content_block_delta_text(0, f"word {n} ")
        # Had any send yielded to the loop, the callback above would have run.
        assert not checkpoint.done()
        await checkpoint


async def test_reading_takes_no_task_per_message(nats: NatsServer) -> None:
    # nats-py's iterator starts a task for every message; the queue path starts none.
    async with connect(nats) as producer, connect(nats) as reader:
        source = await subscribe_stream(reader, "s")
        sink = NATSSink(producer, "s")
        loop = asyncio.get_running_loop()
        created = 0
        factory = loop.get_task_factory()

        def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            nonlocal created
            created += 1
            if factory is not None:
                return factory(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        events = source.__aiter__()
        loop.set_task_factory(counting)
        try:
            with anyio.fail_after(WAIT):
                for n in range(20):
                    # One at a time, so that each read waits on an empty queue.
                    await sink.emit(Event("ping", str(n).encode()))
                    event = await anext(events)
                    assert event.data == str(n).encode()
        finally:
            loop.set_task_factory(factory)
        assert created == 0
        await source.aclose()
        with anyio.fail_after(WAIT), pytest.raises(StopAsyncIteration):
            await anext(events)
        assert source.subscription.pending_bytes == 0


# -- JetStream publishes -------------------------------------------------------------------


@asynccontextmanager
async def jetstream(server: NatsServer) -> AsyncIterator[tuple[Client, JetStreamPublish]]:
    """A connection with the stream T on ``t.>`` and its direct JetStream publish, ready
    (nats-py's response subscription made by a first request)."""
    async with connect(server) as nc:
        js = nc.jetstream()
        await js.add_stream(api.StreamConfig(name="T", subjects=["t.>"], storage="memory"))
        direct = direct_jetstream_publish(nc)
        assert direct is not None
        try:
            yield nc, direct
        finally:
            await js.delete_stream("T")


async def test_a_direct_jetstream_publish_stores_what_js_publish_stores(
    nats: NatsServer,
) -> None:
    async with jetstream(nats) as (nc, direct):
        js = nc.jetstream()
        sent = [
            ("t.a", b'{"n":1}', {"Nats-Msg-Id": "m1", "Essessey-Prev": "0"}),
            ("t.b", b"", {"Nats-Msg-Id": "m2", "Essessey-Control": "open"}),
        ]
        before = dict(nc.stats)
        public = [(await js.publish(s, d, headers=h)).seq for s, d, h in sent]
        counted = {key: nc.stats[key] - before[key] for key in ("out_msgs", "out_bytes")}
        before = dict(nc.stats)
        # The same messages under new msg ids (the old ones would be dropped as repeats).
        again = [(s, d, {**h, "Nats-Msg-Id": h["Nats-Msg-Id"] + "x"}) for s, d, h in sent]
        ours = [await direct(s, d, header_block(h)) for s, d, h in again]
        assert {key: nc.stats[key] - before[key] for key in ("out_msgs", "out_bytes")} == counted
        assert public == [1, 2]
        assert ours == [3, 4]
        stored = [await js.get_msg("T", seq) for seq in [*public, *ours]]
    # get_msg gives None for an empty body.
    assert [(m.subject, m.data, m.headers) for m in stored] == [
        (s, d or None, h) for s, d, h in [*sent, *again]
    ]


async def test_a_direct_jetstream_publish_raises_what_js_publish_raises(
    nats: NatsServer,
) -> None:
    async with jetstream(nats) as (nc, direct):
        js = nc.jetstream()
        # No stream takes the subject: nobody answers.
        with pytest.raises(js_errors.NoStreamResponseError):
            await js.publish("elsewhere.a", b"{}")
        with pytest.raises(js_errors.NoStreamResponseError):
            await direct("elsewhere.a", b"{}", header_block({"Nats-Msg-Id": "n"}))
        # JetStream refuses it: the same APIError.
        wrong = {"Nats-Expected-Last-Sequence": "99"}
        with pytest.raises(js_errors.APIError) as public:
            await js.publish("t.a", b"{}", headers=wrong)
        with pytest.raises(js_errors.APIError) as ours:
            await direct("t.a", b"{}", header_block(wrong))
        assert (ours.value.code, ours.value.err_code, ours.value.description) == (
            public.value.code,
            public.value.err_code,
            public.value.description,
        )
        # A duplicate msg id: the sequence first stored, both ways.
        stored = (await js.publish("t.a", b"1", headers={"Nats-Msg-Id": "d"})).seq
        assert (await js.publish("t.a", b"2", headers={"Nats-Msg-Id": "d"})).seq == stored
        assert await direct("t.a", b"3", header_block({"Nats-Msg-Id": "d"})) == stored
        assert nc._resp_map == {}  # every request's future is gone


async def test_a_direct_jetstream_publish_declines_what_only_js_publish_can_send(
    nats: NatsServer,
) -> None:
    block = header_block({"Nats-Msg-Id": "z"})
    async with connect(nats) as nc:
        direct = direct_jetstream_publish(nc)
        assert direct is not None
        sent = nc.stats["out_msgs"]
        # No request yet, so no response subscription: js.publish makes it.
        assert await direct("t.a", b"{}", block) is None
        assert nc.stats["out_msgs"] == sent
    async with jetstream(nats) as (nc, direct):
        sent = nc.stats["out_msgs"]
        assert await direct("t.a", b"x" * (nc.max_payload + 1), block) is None
        assert nc.stats["out_msgs"] == sent
    async with connect(nats) as nc:
        direct = direct_jetstream_publish(nc)
        assert direct is not None
        await nc.jetstream().account_info()  # a first request: the response subscription
        await nc.close()
        sent = nc.stats["out_msgs"]
        assert await direct("t.a", b"{}", block) is None
        assert nc.stats["out_msgs"] == sent
        assert nc._resp_map == {}


async def test_a_store_appends_without_js_publish(
    nats: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    publish = JetStreamContext.publish

    async def counting(self: JetStreamContext, *args: Any, **options: Any) -> api.PubAck:
        nonlocal calls
        calls += 1
        return await publish(self, *args, **options)

    monkeypatch.setattr(JetStreamContext, "publish", counting)
    async with connect(nats) as nc:
        store = await JetStreamEventStore.connect(nc, stream="S", prefix="s")
        await store.open_stream("x")
        before = calls  # opening a stream writes its key-value entry with js.publish
        events = [await store.append("x", delta(n)) for n in range(20)]
        assert calls == before
        await store.close_stream("x")
        replayed, known = await store.since("x", None)
        await nc.jetstream().delete_stream("S")
    assert known
    assert replayed == events


# -- the switch ---------------------------------------------------------------------------------


async def test_with_the_switch_off_every_fast_path_declines_and_nothing_is_lost(
    nats: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ESSESSEY_NATS_INTERNALS=off``: nats-py's public API throughout, every message
    delivered all the same (core NATS both ways, and a JetStream store's appends and
    reads)."""
    monkeypatch.setattr(_nats_py, "ENABLED", False)
    published = 0
    publish = Client.publish

    async def counting(self: Client, *args: Any, **options: Any) -> None:
        nonlocal published
        published += 1
        await publish(self, *args, **options)

    monkeypatch.setattr(Client, "publish", counting)
    async with connect(nats) as producer, connect(nats) as reader:
        assert direct_publish(producer) is None
        assert direct_jetstream_publish(producer) is None
        sub = await reader.subscribe("x.>")
        assert queued_messages(sub, sub.messages) is None
        source = await subscribe_stream(reader, "s")
        sink = NATSSink(producer, "s")
        sent = [Event("ping", str(n).encode(), f"{n}-0") for n in range(50)]
        for event in sent:
            await sink.emit(event)
        await sink.flush()
        assert published == len(sent)  # every one through nc.publish
        events = source.__aiter__()
        with anyio.fail_after(WAIT):
            received = [await anext(events) for _ in sent]
        assert [(e.data, e.id) for e in received] == [(e.data, e.id) for e in sent]
        await source.aclose()

        store = await JetStreamEventStore.connect(producer, stream="SW", prefix="sw")
        try:
            await store.open_stream("x")
            appended = [await store.append("x", delta(n)) for n in range(30)]
            await store.close_stream("x")
            with anyio.fail_after(WAIT):
                followed = [event async for event in store.follow("x")]
        finally:
            await producer.jetstream().delete_stream("SW")
    assert followed == appended
