"""The nats-py internals core NATS relies on (essessey/bindings/nats/_nats_py.py), checked
on the installed nats-py against a real nats-server: each fast path is taken, and does
what the public call it stands in for does. A nats-py release that changes them fails
here first, by name, instead of making every reader and producer quietly slower."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import nats as nats_py
import pytest
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from essessey import Event, Publisher
from essessey.bindings.nats import NATSSink, subscribe_stream
from essessey.bindings.nats._nats_py import direct_publish, queued_messages
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
        sub = await nc.subscribe("x.>")
        assert queued_messages(sub, sub.messages) is not None, (
            "nats-py's subscription internals changed"
        )


async def test_a_direct_publish_sends_what_publish_sends(nats: NatsServer) -> None:
    async with connect(nats) as producer, connect(nats) as reader:
        received: list[Msg] = []
        sub = await reader.subscribe("essessey.s.*")
        await reader.flush()
        sink = NATSSink(producer, "s")
        events = [Event("ping", b'{"n":1}'), Event("pong", b"{}", "17-0"), Event("ping", b"")]
        before = dict(producer.stats)
        for event in events:
            await sink.emit(event)  # nats-py's publish
        public = {key: producer.stats[key] - before[key] for key in ("out_msgs", "out_bytes")}
        before = dict(producer.stats)
        for event in events:
            assert sink.emit_nowait(event)
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
        assert not sink.emit_nowait(too_big)
        with pytest.raises(nats_errors.MaxPayloadError):
            await sink.emit(too_big)
        sent = nc.stats["out_msgs"]
        await nc.close()
        assert not sink.emit_nowait(Event("ping", b"{}"))
        with pytest.raises(nats_errors.ConnectionClosedError):
            await sink.emit(Event("ping", b"{}"))
        assert nc.stats["out_msgs"] == sent


async def test_a_direct_publish_declines_what_publish_would_wait_for(nats: NatsServer) -> None:
    # Over the client's buffer limit nats-py flushes and waits: the public call's to do.
    async with connect(nats, pending_size=1024) as producer, connect(nats) as reader:
        sub = await reader.subscribe("essessey.s.*")
        await reader.flush()
        sink = NATSSink(producer, "s")
        big = Event("ping", b"y" * 2048)
        assert not sink.emit_nowait(big)
        await sink.emit(big)
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
