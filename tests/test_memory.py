"""In-process sinks and sources: InMemorySink, SliceSource, MultiSink."""

import pytest

from essessey import Event, InMemorySink, MultiSink, ProtocolError, Publisher, SliceSource

PING = Event("ping", b'{"type":"ping"}')
STOP = Event("message_stop", b'{"type":"message_stop"}')


class FailingSink:
    """A sink whose every emit raises the exception it was built with."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0

    async def emit(self, event: Event) -> None:
        self.calls += 1
        raise self.exc


@pytest.mark.anyio
async def test_in_memory_sink_records_in_order() -> None:
    sink = InMemorySink()
    await sink.emit(PING)
    await sink.emit(STOP)
    assert sink.events == [PING, STOP]
    assert len(sink) == 2


@pytest.mark.anyio
async def test_in_memory_sink_events_is_a_copy() -> None:
    sink = InMemorySink()
    await sink.emit(PING)
    snapshot = sink.events
    snapshot.append(STOP)
    snapshot.clear()
    assert sink.events == [PING]
    await sink.emit(STOP)
    assert snapshot == []


@pytest.mark.anyio
async def test_in_memory_sink_clear() -> None:
    sink = InMemorySink()
    await sink.emit(PING)
    sink.clear()
    assert sink.events == []
    assert len(sink) == 0


async def _collect(source: SliceSource) -> list[Event]:
    return [event async for event in source]


@pytest.mark.anyio
async def test_slice_source_yields_the_events_then_ends() -> None:
    assert await _collect(SliceSource([PING, STOP])) == [PING, STOP]
    assert await _collect(SliceSource([])) == []


@pytest.mark.anyio
async def test_slice_source_can_be_iterated_twice() -> None:
    source = SliceSource(iter([PING, STOP]))  # a one-shot iterator: the source must keep it
    assert await _collect(source) == [PING, STOP]
    assert await _collect(source) == [PING, STOP]


@pytest.mark.anyio
async def test_slice_source_does_not_see_later_changes_to_the_list() -> None:
    events = [PING]
    source = SliceSource(events)
    events.append(STOP)
    assert await _collect(source) == [PING]


@pytest.mark.anyio
async def test_multi_sink_forwards_to_every_sink_in_order() -> None:
    first, second = InMemorySink(), InMemorySink()
    multi = MultiSink(first, second)
    await multi.emit(PING)
    await multi.emit(STOP)
    assert first.events == [PING, STOP]
    assert second.events == [PING, STOP]
    assert multi.sinks == (first, second)


@pytest.mark.anyio
async def test_multi_sink_one_failure_is_reraised_as_is_after_every_sink_ran() -> None:
    boom = ConnectionResetError("client went away")
    before, failing, after = InMemorySink(), FailingSink(boom), InMemorySink()
    multi = MultiSink(before, failing, after)
    with pytest.raises(ConnectionResetError) as info:
        await multi.emit(PING)
    assert info.value is boom
    assert before.events == [PING]
    assert after.events == [PING]
    assert failing.calls == 1


@pytest.mark.anyio
async def test_multi_sink_several_failures_are_raised_together() -> None:
    first_exc, second_exc = OSError("one"), ValueError("two")
    first, second = FailingSink(first_exc), FailingSink(second_exc)
    healthy = InMemorySink()
    multi = MultiSink(first, healthy, second)
    with pytest.raises(ExceptionGroup) as info:
        await multi.emit(PING)
    assert list(info.value.exceptions) == [first_exc, second_exc]
    assert healthy.events == [PING]
    assert first.calls == 1
    assert second.calls == 1


@pytest.mark.anyio
async def test_multi_sink_with_no_sinks_drops_events_and_a_publisher_still_checks() -> None:
    # No sinks: a sink that keeps nothing, and fails nothing. A strict Publisher over it
    # still refuses what would break the protocol.
    sink = MultiSink()
    assert sink.sinks == ()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    with pytest.raises(ProtocolError, match="content_block_delta"):
        await publisher.send_content_block_delta_text(0, "no block is open")
