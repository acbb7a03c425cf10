"""Shared pytest configuration for the essessey test suite."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The library is asyncio-first; running every async test on trio too would
    # double the suite without exercising anything the core depends on.
    return "asyncio"
