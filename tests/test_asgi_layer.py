"""The ASGI layer the bindings share (essessey/bindings/_asgi.py).

What reaches into uvicorn itself is tested in tests/test_server_reach.py.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from essessey.bindings._asgi import connection_tasks, resume_point, watch_line
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


class _CountedLine:
    """A line for the line watch that says when it is next due, and counts its checks."""

    def __init__(self, due_in: float) -> None:
        self.due_in = due_in
        self.checks: list[float] = []
        self.thrice = anyio.Event()

    def check(self, now: float) -> float | None:
        self.checks.append(now)
        if len(self.checks) == 3:
            self.thrice.set()
        return now + self.due_in


@pytest.mark.anyio
async def test_connections_arriving_one_by_one_do_not_each_make_the_watch_look_at_all() -> None:
    lines = [_CountedLine(15.0) for _ in range(300)]
    unwatch = [watch_line(lines[0])]
    await anyio.sleep(0.01)  # the watch runs and sleeps until its next look
    for line in lines[1:]:
        unwatch.append(watch_line(line))
        await anyio.lowlevel.checkpoint()  # as connections arrive, the loop turns
    await anyio.sleep(0.01)
    try:
        # Each new line is looked at once when it arrives, none at another's arrival:
        # a wake-up per arrival would make some 15,000 checks here.
        assert sum(len(line.checks) for line in lines) <= 2 * len(lines)
    finally:
        for stop in unwatch:
            stop()


@pytest.mark.anyio
async def test_a_line_due_before_the_watch_looks_again_wakes_it() -> None:
    far = _CountedLine(15.0)
    soon = _CountedLine(0.05)
    unwatch = [watch_line(far)]
    try:
        await anyio.sleep(0.01)  # the watch sleeps up to a second
        unwatch.append(watch_line(soon))
        with anyio.fail_after(WAIT):
            await soon.thrice.wait()
        # Looked at on arrival, then at its deadlines: well within the watch's second.
        assert soon.checks[2] - soon.checks[0] < 0.5
    finally:
        for stop in unwatch:
            stop()
