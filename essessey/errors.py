"""The exceptions essessey raises, in one place.

Every exception derives from :class:`EssesseyError`, so an application can catch the
library's failures without catching its own. Wrapping code adds context with
``add_note`` instead of re-raising a new type, so ``except ProtocolError`` keeps working
however deep the failure happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from essessey.check import Violation

__all__ = [
    "EssesseyError",
    "ProtocolError",
    "SerializationError",
]


class EssesseyError(Exception):
    """Base class of every exception the library raises on purpose."""


class ProtocolError(EssesseyError):
    """An event would break a rule of the protocol; nothing was emitted.

    Raised by a strict :class:`~essessey.Publisher` and by the streamers when a call
    comes out of order. ``violations`` lists what the checker found.
    """

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[Violation, ...] = tuple(violations)


class SerializationError(EssesseyError, TypeError):
    """A payload could not be serialised to JSON; nothing was emitted."""
