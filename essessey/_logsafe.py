"""How a value from outside may appear in a log line.

Logs carry names, positions and lengths, never content. A name read from a stream (an
event name, a block or delta type, an error type) is usually a protocol word, but it is
whatever the sender put there, content included: it is logged as it is only when it
looks like a protocol identifier, and by its length otherwise.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Final

__all__ = ["dotted_label", "log_failure", "log_label", "raised_at", "withheld_traceback"]

_IDENTIFIER: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
# Bounds on what one failure's log line holds: exceptions chained or grouped past these
# are counted, not written.
_MAX_EXCEPTIONS: Final = 16
_MAX_FRAMES: Final = 64
_CAUSE: Final = "The above exception was the direct cause of the following exception:"
_CONTEXT: Final = "During handling of the above exception, another exception occurred:"


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


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """Log ``message % args`` at ERROR with ``exc``'s :func:`withheld_traceback` after it:
    what the library logs of a failure, in place of ``logger.exception``."""
    logger.error(message + "\n%s", *args, withheld_traceback(exc))


def withheld_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it (its causes and contexts first, a group's
    exceptions after it), with every exception's message withheld: its class, where it
    was raised and the frames that led there, and the length of its message.

    A failure's message may hold what it failed on, and not only the app's own words: a
    framework's validation error quotes the model's tool arguments, a store's error the
    value it refused. Logged with ``exc_info``, every handler would write it out.
    """
    lines: list[str] = []
    seen: set[int] = set()
    _describe(exc, lines, seen, "")
    return "\n".join(lines)


def _describe(exc: BaseException, lines: list[str], seen: set[int], indent: str) -> None:
    seen.add(id(exc))
    if len(seen) > _MAX_EXCEPTIONS:
        lines.append(f"{indent}(more exceptions left out)")
        return
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        _describe(cause, lines, seen, indent)
        lines.append(
            f"\n{indent}The above exception was the direct cause of the following exception:\n"
        )
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        _describe(context, lines, seen, indent)
        lines.append(
            f"\n{indent}During handling of the above exception, another exception occurred:\n"
        )
    frames = traceback.extract_tb(exc.__traceback__, limit=-_MAX_FRAMES)
    if frames:
        lines.append(f"{indent}Traceback (most recent call last):")
        for line in traceback.format_list(frames):
            # format_list gives the frame's line and its source line, each indented.
            lines.extend(indent + part for part in line.rstrip("\n").split("\n"))
    lines.append(f"{indent}{_class_name(exc)} ({_message_length(exc)})")
    if isinstance(exc, BaseExceptionGroup):
        for n, inner in enumerate(exc.exceptions, 1):
            if id(inner) in seen:
                continue
            lines.append(f"{indent}  +---------------- {n} ----------------")
            _describe(inner, lines, seen, indent + "  | ")


def _class_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _message_length(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        return "its message cannot be read"
    return f"message withheld, {len(text)} chars" if text else "no message"
