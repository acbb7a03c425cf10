"""The ASGI layer the bindings share (essessey/bindings/_asgi.py).

What reaches into uvicorn itself is tested in tests/test_server_reach.py.
"""

from __future__ import annotations

import anyio
import pytest

from essessey.bindings._asgi import resume_point, task_group


@pytest.mark.anyio
async def test_a_task_group_failure_is_the_exception_itself() -> None:
    async def fail() -> None:
        raise LookupError("one")

    async def run() -> None:
        async with task_group() as tasks:
            tasks.start_soon(fail)
            await anyio.sleep(1)

    with pytest.raises(LookupError, match="one"):
        await run()


@pytest.mark.anyio
async def test_several_failures_stay_a_group() -> None:
    async def fail(kind: type[Exception]) -> None:
        raise kind("x")

    async def run() -> None:
        async with task_group() as tasks:
            tasks.start_soon(fail, LookupError)
            tasks.start_soon(fail, KeyError)
            await anyio.sleep(1)

    with pytest.raises(ExceptionGroup) as caught:
        await run()
    assert len(caught.value.exceptions) == 2


def test_the_resume_point() -> None:
    assert resume_point(None) is None
    assert resume_point("") is None  # "from the start", as for EventSource
    assert resume_point("abc-12") == "abc-12"
    for bad in ("x" * 300, "a\x00b", "a\nb"):
        with pytest.raises(ValueError, match="invalid last event id"):
            resume_point(bad)
