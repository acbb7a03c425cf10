"""The ASGI layer the bindings share (essessey/bindings/_asgi.py).

What reaches into uvicorn itself is tested in tests/test_server_reach.py.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from essessey.bindings._asgi import connection_tasks, resume_point
from tests.processes import WAIT


def test_the_resume_point() -> None:
    assert resume_point(None) is None
    assert resume_point("") is None  # "from the start", as for EventSource
    assert resume_point("abc-12") == "abc-12"
    for bad in ("x" * 300, "a\x00b", "a\nb"):
        with pytest.raises(ValueError, match="invalid last event id"):
            resume_point(bad)


@pytest.mark.anyio
async def test_a_failing_helper_cancels_the_body_and_is_raised_as_itself() -> None:
    reached_end = False

    async def fail() -> None:
        await anyio.sleep(0.01)
        raise LookupError("the helper")

    async def run() -> None:
        nonlocal reached_end
        async with connection_tasks() as tasks:
            tasks.start_soon(fail)
            await anyio.sleep(5)  # cancelled by the helper's failure
            reached_end = True

    with anyio.fail_after(2), pytest.raises(LookupError, match="the helper"):
        await run()
    assert not reached_end


@pytest.mark.anyio
async def test_helpers_still_running_are_cancelled_when_the_body_ends() -> None:
    cancelled = anyio.Event()

    async def park() -> None:
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async with connection_tasks() as tasks:
        tasks.start_soon(park)
        await anyio.wait_all_tasks_blocked()  # the helper is parked
    with anyio.fail_after(2):
        await cancelled.wait()


@pytest.mark.anyio
async def test_a_helper_failing_after_the_body_ended_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail_when_cancelled() -> None:
        try:
            await anyio.sleep(10)
        finally:
            raise LookupError("late")

    logged = anyio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "helper task failed after it ended" in record.getMessage():
                logged.set()

    seen = Seen()
    logging.getLogger("essessey").addHandler(seen)
    try:
        async with connection_tasks() as tasks:
            tasks.start_soon(fail_when_cancelled)
            await anyio.wait_all_tasks_blocked()  # the helper is in its sleep
        # On asyncio the helpers are not waited for: it fails on its own, a moment later.
        with anyio.fail_after(WAIT):
            await logged.wait()
    finally:
        logging.getLogger("essessey").removeHandler(seen)
    assert "helper task failed after it ended" in caplog.text
