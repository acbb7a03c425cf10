"""Event: the frozen wire model every binding carries unchanged."""

import orjson
import pytest

from essessey import Event, InMemorySink, Sink


def test_event_is_frozen() -> None:
    event = Event("ping", b'{"type":"ping"}')
    with pytest.raises(AttributeError):
        event.data = b"{}"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        event.id = "1"  # type: ignore[misc]


def test_event_is_slotted() -> None:
    event = Event("ping", b'{"type":"ping"}')
    assert not hasattr(event, "__dict__")
    with pytest.raises((AttributeError, TypeError)):
        event.extra = 1  # type: ignore[attr-defined]


def test_fresh_event_has_no_id() -> None:
    assert Event("ping", b'{"type":"ping"}').id is None


def test_with_id_returns_a_copy_and_leaves_the_original() -> None:
    original = Event("content_block_stop", b'{"type":"content_block_stop","index":0}')
    stamped = original.with_id("7-0")
    assert stamped.id == "7-0"
    assert stamped.event == original.event
    assert stamped.data is original.data
    assert original.id is None
    assert stamped != original
    assert stamped.with_id(None) == original


def test_events_compare_and_hash_by_value() -> None:
    a = Event("ping", b'{"type":"ping"}', "1")
    b = Event("ping", b'{"type":"ping"}', "1")
    assert a == b
    assert len({a, b}) == 1


def test_json_parses_the_payload() -> None:
    event = Event("content_block_stop", b'{"type":"content_block_stop","index":3}')
    assert event.json() == {"type": "content_block_stop", "index": 3}


def test_json_raises_on_a_payload_that_is_not_json() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        Event("custom", b"{not json").json()


def test_in_memory_sink_satisfies_the_sink_protocol() -> None:
    assert isinstance(InMemorySink(), Sink)
    assert not isinstance(object(), Sink)


def test_an_event_batch_is_a_sequence_of_events_built_on_demand() -> None:
    from essessey.event import EventBatch

    batch = EventBatch("content_block_delta", [b'{"a":1}', b'{"a":2}', b'{"a":3}'])
    expected = [Event("content_block_delta", data) for data in batch.datas]
    assert len(batch) == 3
    assert list(batch) == expected
    assert batch[1] == expected[1]
    assert batch[-1] == expected[-1]
    assert batch[1:] == expected[1:]
    assert all(event.id is None for event in batch)
    assert "3 events" in repr(batch)
