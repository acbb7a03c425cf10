"""Every log record of essessey's loggers while a block runs, for the tests that cannot
take pytest's caplog (a Hypothesis test: caplog is function-scoped, shared by every
example Hypothesis runs in one test)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured_logs(name: str = "essessey") -> Iterator[list[logging.LogRecord]]:
    """Every record of ``name``'s loggers, DEBUG included, while the block runs."""
    handler = _Records()
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
