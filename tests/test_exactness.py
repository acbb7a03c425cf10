"""The essessey dialect reproduces a whole turn's transcript byte for byte: the one
in tests/fixtures/seed004_turn.sse, whose turn docs/protocol.md shows."""

from pathlib import Path

import pytest

from essessey import Event, InMemorySink, Publisher, check, stream_turn

FIXTURE = Path(__file__).parent / "fixtures" / "seed004_turn.sse"


def _fixture_pairs() -> list[tuple[str, bytes]]:
    # Each frame of the fixture is one "event:" line and one "data:" line.
    pairs: list[tuple[str, bytes]] = []
    for frame in FIXTURE.read_bytes().decode("utf-8").split("\n\n"):
        if not frame.strip():
            continue
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ")
        assert data_line.startswith("data: ")
        pairs.append((event_line[len("event: ") :], data_line[len("data: ") :].encode("utf-8")))
    return pairs


def _pairs(events: list[Event]) -> list[tuple[str, bytes]]:
    return [(event.event, event.data) for event in events]


def test_fixture_is_the_whole_turn() -> None:
    raw = FIXTURE.read_bytes()
    assert raw.endswith(b"\n")
    assert b"\r" not in raw
    names = [name for name, _ in _fixture_pairs()]
    assert len(names) == 16
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"


async def publish_seed_turn(publisher: Publisher) -> None:
    """Seed 004's turn, one Publisher method per event."""
    await publisher.send_message_start("msg_1", "conv_1", "some-model")
    await publisher.send_ping()
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, "Need the weather.")
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "Checking.")
    await publisher.send_content_block_stop(1)
    await publisher.send_tool_use_start(2, "call_1", "get_weather")
    await publisher.send_tool_input_delta(2, '{"city":"Paris"}')
    await publisher.send_content_block_stop(2)
    await publisher.send_tool_result_start(3, "call_1")
    await publisher.send_tool_result_delta(3, '{"temp_c":18}')
    await publisher.send_content_block_stop(3)
    await publisher.send_message_delta("tool_use", 42)
    await publisher.send_message_stop()


@pytest.mark.anyio
async def test_publisher_reproduces_the_seed_turn_byte_for_byte() -> None:
    sink = InMemorySink()
    await publish_seed_turn(Publisher(sink))

    assert _pairs(sink.events) == _fixture_pairs()
    assert all(event.id is None for event in sink.events)


@pytest.mark.anyio
async def test_composites_reproduce_the_seed_turn_byte_for_byte() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("msg_1", "conv_1", "some-model")
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, "Need the weather.")
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "Checking.")
    await publisher.send_content_block_stop(1)
    await publisher.send_tool_use_block(2, "call_1", "get_weather", {"city": "Paris"})
    await publisher.send_tool_result_block(3, "call_1", '{"temp_c":18}')
    await publisher.send_stream_epilogue("tool_use", 42)

    assert _pairs(sink.events) == _fixture_pairs()


@pytest.mark.anyio
async def test_streamers_reproduce_the_seed_turn_byte_for_byte() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    async with stream_turn(
        publisher, message_id="msg_1", stream_id="conv_1", model="some-model"
    ) as turn:
        thinking = await turn.thinking()
        await thinking.write("Need the weather.")
        text = await turn.text()
        await text.write("Checking.")
        tools = await turn.tools()
        await tools.start_call("call_1", "get_weather", '{"city":"Paris"}')
        await tools.write_result("call_1", '{"temp_c":18}')
        turn.stop_reason = "tool_use"
        turn.output_tokens = 42

    assert _pairs(sink.events) == _fixture_pairs()
    assert check(sink.events) == []
