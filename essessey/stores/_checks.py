"""The constructor checks every store shares, written once so that they agree."""

from __future__ import annotations

__all__ = ["check_positive"]


def check_positive(**values: float) -> None:
    """Raise ``ValueError`` for the first of ``values`` (an option's name and value) that
    is not above 0: a bound, a time-to-live, a timeout."""
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0")
