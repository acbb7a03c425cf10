"""What a value read from a provider must be before it is published.

Python's json module (and the SDKs built on it) reads two things no JSON writer takes
back: a ``"\\ud800"`` escape becomes a lone surrogate, which no UTF-8 text (so no
published event) can carry, and an integer of any size, where orjson writes none past
64 bits. The adapters refuse both at the edge, before anything of the value went out.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_COUNT", "fits_count", "has_lone_surrogate", "replace_surrogates"]

MAX_COUNT: Final = 2**63 - 1
"""The largest integer orjson writes (a signed 64-bit one)."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point (it cannot be written as UTF-8)."""
    # isascii() is O(1) in CPython: the common case costs nothing.
    return not text.isascii() and _SURROGATE.search(text) is not None


def replace_surrogates(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def fits_count(value: int) -> bool:
    """Whether the integer ``value`` can be written back (within 64 bits, signed)."""
    return -MAX_COUNT - 1 <= value <= MAX_COUNT
