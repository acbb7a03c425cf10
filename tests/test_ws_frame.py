"""The WebSocket envelope: one JSON text frame per event, the payload spliced in."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event
from essessey.bindings.ws import decode_frame, encode_frame


def test_a_frame_inlines_the_payload_as_json_with_the_id_first() -> None:
    event = Event("content_block_stop", b'{"type":"content_block_stop","index":3}', "e1-7")
    frame = encode_frame(event)
    assert frame == (
        '{"id":"e1-7","event":"content_block_stop","data":{"type":"content_block_stop","index":3}}'
    )
    assert orjson.loads(frame)["data"] == {"type": "content_block_stop", "index": 3}


def test_an_event_without_an_id_has_no_id_key() -> None:
    for event_id in (None, ""):
        frame = encode_frame(Event("ping", b'{"type":"ping"}', event_id))
        assert frame == '{"event":"ping","data":{"type":"ping"}}'


def test_the_payload_bytes_are_spliced_unchanged() -> None:
    # Whitespace and key order that a re-serialisation would change survive the splice.
    data = b'{ "type" : "x",  "b": 1, "a": [1, 2] }'
    frame = encode_frame(Event("custom", data))
    assert frame.endswith(data.decode() + "}")


def test_event_names_and_ids_are_json_escaped() -> None:
    frame = encode_frame(Event('we"ird\n', b"{}", 'i"d'))
    assert orjson.loads(frame) == {"id": 'i"d', "event": 'we"ird\n', "data": {}}


def test_empty_data_raises_instead_of_writing_invalid_json() -> None:
    with pytest.raises(ValueError, match="JSON"):
        encode_frame(Event("ping", b""))


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"data": {}}', "no event name"),
        ('{"event": "", "data": {}}', "no event name"),
        ('{"event": 3, "data": {}}', "no event name"),
        ('{"event": "ping"}', "no data"),
        ('{"event": "ping", "data": {}, "id": 5}', "id is not a string"),
    ],
)
def test_malformed_frames_raise_value_error_naming_the_reason(frame: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_frame(frame)


def test_a_frame_over_the_limit_raises_without_parsing() -> None:
    with pytest.raises(ValueError, match="26 characters is over the 10 limit"):
        decode_frame('{"event":"ping","data":{}}', max_size=10)


def test_decode_accepts_bytes() -> None:
    event = decode_frame(b'{"event":"ping","data":{"type":"ping"}}')
    assert event == Event("ping", b'{"type":"ping"}')


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(min_size=1, max_size=20),
    event_id=st.none() | st.text(min_size=1, max_size=20),
    payload=_json,
)
def test_orjson_payloads_round_trip_exactly(
    name: str, event_id: str | None, payload: object
) -> None:
    event = Event(name, orjson.dumps(payload), event_id)
    assert decode_frame(encode_frame(event)) == event
