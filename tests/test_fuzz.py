"""Fuzzing the readers and the provider adapters.

For now, the regression tests of what the fuzzing found; the fuzz targets follow.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from essessey import Event
from essessey.bindings.ws import decode_frame
from essessey.reassemble import Reassembler


def test_ws_decode_frame_refuses_data_nested_deeper_than_it_can_write() -> None:
    # orjson parses 1024 levels but writes 255: the frame parsed, then re-serialising its
    # data raised orjson's JSONEncodeError (a TypeError), which WebSocketSource does not
    # catch, so one such frame ended the whole stream.
    for depth in (255, 256, 1000):
        frame = '{"event":"x","data":' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="nested too deeply"):
            decode_frame(frame)
    assert decode_frame('{"event":"x","data":' + "[" * 254 + "]" * 254 + "}").event == "x"


def payload_event(payload: dict[str, Any]) -> Event:
    return Event(payload["type"], orjson.dumps(payload))


def test_reassembler_reads_a_tool_input_nested_deeper_than_orjson_writes() -> None:
    # A tool_use start whose input is nested 300 levels (valid JSON: orjson parses up to
    # 1024) made the reassembler raise orjson's JSONEncodeError at the block's stop, when
    # it wrote the input back out as the call's arguments.
    for depth, writable in ((300, True), (1000, False)):
        deep = "[" * depth + "]" * depth
        events = [
            payload_event({"type": "message_start", "message": {"id": "m"}}),
            Event(
                "content_block_start",
                b'{"type":"content_block_start","index":0,"content_block":'
                b'{"type":"tool_use","id":"t","name":"n","input":{"a":' + deep.encode() + b"}}}",
            ),
            payload_event({"type": "content_block_stop", "index": 0}),
            payload_event({"type": "message_stop"}),
        ]
        reassembler = Reassembler()
        for event in events:
            reassembler.feed(event)
        (call,) = reassembler.result().tool_calls
        if writable:
            assert call.params == {"a": json.loads(deep)}
            assert json.loads(call.arguments) == call.params
            assert call.parse_error is None
        else:
            # Past what the standard library writes too: no text, and the reason why.
            assert (call.arguments, call.params) == ("", None)
            assert call.parse_error == "the block's input is nested too deeply to write as JSON"
