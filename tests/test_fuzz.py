"""Fuzzing the readers and the provider adapters.

For now, the regression tests of what the fuzzing found; the fuzz targets follow.
"""

from __future__ import annotations

import pytest

from essessey.bindings.ws import decode_frame


def test_ws_decode_frame_refuses_data_nested_deeper_than_it_can_write() -> None:
    # orjson parses 1024 levels but writes 255: the frame parsed, then re-serialising its
    # data raised orjson's JSONEncodeError (a TypeError), which WebSocketSource does not
    # catch, so one such frame ended the whole stream.
    for depth in (255, 256, 1000):
        frame = '{"event":"x","data":' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="nested too deeply"):
            decode_frame(frame)
    assert decode_frame('{"event":"x","data":' + "[" * 254 + "]" * 254 + "}").event == "x"
