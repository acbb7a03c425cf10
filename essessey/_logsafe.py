"""How a value from outside may appear in a log line.

Logs carry names, positions and lengths, never content. A name read from a stream (an
event name, a block or delta type, an error type) is usually a protocol word, but it is
whatever the sender put there, content included: it is logged as it is only when it
looks like a protocol identifier, and by its length otherwise.
"""

from __future__ import annotations

import re
import traceback
from typing import Final

__all__ = ["dotted_label", "log_label", "raised_at"]

_IDENTIFIER: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")


def log_label(value: object) -> str:
    """``value`` fit for a log line: a lowercase identifier of up to 64 characters as it
    is, another string by its length, anything else by its type."""
    if isinstance(value, str):
        return value if _IDENTIFIER.fullmatch(value) else f"<{len(value)} chars>"
    return f"<{type(value).__name__}>"


def dotted_label(value: object) -> str:
    """A dotted name fit for a log line (``response.output_text.delta``,
    ``reasoning.encrypted``): as it is when each part is an identifier, anything else as
    :func:`log_label` shows it; ``?`` for none."""
    if value is None:
        return "?"
    if isinstance(value, str) and len(value) <= 128:
        parts = value.split(".")
        if all(log_label(part) == part for part in parts):
            return value
    return log_label(value)


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised (`` at file:line``, or ``""``), for a log line that names
    an exception by its class: its text may hold what it failed on (a token, content)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
