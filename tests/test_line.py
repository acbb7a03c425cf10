"""The delivery line's ``offer``: what it takes at once, holds or refuses (the writer then
awaits ``write``). Through a wire of its own that records each write, so every case is
seen in the bytes that reach it."""

from __future__ import annotations

import itertools
import logging
import time

import anyio
import pytest

from essessey.bindings import _line
from essessey.bindings._line import STOP_SEND_GRACE, Line, LineEnded


class _Wire:
    def __init__(self, *, direct: bool = True, room: bool = True) -> None:
        self.written: list[bytes] = []  # straight to the transport
        self.sent: list[tuple[bytes, bool]] = []  # through the server's send
        self.room = room
        self.direct = self._direct if direct else None

    def _direct(self, frame: bytes) -> bool:
        if not self.room:
            return False
        self.written.append(frame)
        return True

    async def send(self, frames: list[bytes], *, start: bool, more: bool) -> None:
        self.sent.append((b"".join(frames), more))

    def stalled(self) -> None:
        pass


@pytest.fixture
def no_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """No burst window: every frame on a free line is paced."""
    monkeypatch.setattr(_line, "BURST", -1.0)


def _line_on(
    wire: _Wire, *, started: bool = True, max_queue: int = 4, send_timeout: float | None = None
) -> Line:
    return Line(
        wire,
        anyio.CancelScope().cancel,
        kind="sse",
        log=logging.getLogger("test"),
        ping=b": ping\n",
        ping_interval=0,
        send_timeout=send_timeout,
        max_queue=max_queue,
        max_batch_bytes=1 << 16,
        started=started,
    )


@pytest.mark.anyio
async def test_a_frame_at_a_model_s_pace_is_written_now_and_one_in_a_burst_is_held() -> None:
    wire = _Wire()
    line = _line_on(wire)
    assert line.offer(b"a")
    assert wire.written == [b"a"]
    assert line.offer(b"b")  # right after: part of a burst, held for the next send
    assert wire.written == [b"a"]
    assert line.busy
    await line.finish(b"end")
    assert wire.sent == [(b"b", True), (b"end", False)]


@pytest.mark.anyio
async def test_a_full_transport_holds_the_frame_instead_of_dropping_it() -> None:
    wire = _Wire(room=False)
    line = _line_on(wire)
    assert line.offer(b"a")
    assert wire.written == []
    await line.finish(b"")
    assert wire.sent == [(b"a", True), (b"", False)]


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["no direct way", "not started", "stopping"])
async def test_a_line_that_cannot_write_at_once_refuses_having_done_nothing(case: str) -> None:
    wire = _Wire(direct=case != "no direct way")
    line = _line_on(wire, started=case != "not started")
    if case == "stopping":
        line.stop()
    assert not line.offer(b"a")
    assert line.take(_never_framed, "a") is None
    assert wire.written == []
    assert wire.sent == []
    assert line.busy is (case != "not started")


@pytest.mark.anyio
async def test_a_line_holding_max_queue_frames_refuses_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_line, "BURST", 0.5)  # the frames after the first: a burst
    wire = _Wire()
    line = _line_on(wire, max_queue=2)
    assert line.offer(b"0")  # written
    assert line.offer(b"1")
    assert line.offer(b"2")
    assert line.take(_never_framed, "3") is None
    assert not line.offer(b"3")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(line.run)  # the line's own task sends what is held
        with anyio.fail_after(5):
            await line.write(b"3")  # what the writer does with a refused frame
            await line.finish(b"")
        tasks.cancel_scope.cancel()  # as the connection's end does
    assert wire.written == [b"0"]
    assert b"".join(frame for frame, _ in wire.sent) == b"123"


@pytest.mark.anyio
async def test_an_ended_line_raises_line_ended() -> None:
    line = _line_on(_Wire())
    await line.finish(b"")
    with pytest.raises(LineEnded):
        line.offer(b"a")
    with pytest.raises(LineEnded):
        line.take(_never_framed, "a")


@pytest.mark.anyio
async def test_a_frame_the_line_takes_is_held_when_its_burst_window_ends_while_it_is_framed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store's hand-over gives ``take`` the event and its framing: on a server with no
    direct writer, the burst window the line said yes in may end while the frame is made,
    and the frame must still go out (``offer`` would now refuse it)."""
    monkeypatch.setattr(_line, "BURST", 0.05)
    wire = _Wire(direct=False)
    line = _line_on(wire)
    await line.write(b"0")  # through the server's send; opens a burst window

    def slow_frame(item: str) -> bytes:
        time.sleep(0.1)  # the framing outlasts the window
        assert not line.offer(b"x")  # what offer says now, having taken nothing
        return item.encode()

    assert line.take(slow_frame, "1") == b"1"
    await line.finish(b"")
    assert b"".join(frame for frame, _ in wire.sent) == b"01"


@pytest.mark.anyio
@pytest.mark.usefixtures("no_burst")
async def test_take_frames_only_what_it_takes_and_takes_nothing_when_framing_fails() -> None:
    wire = _Wire()
    line = _line_on(wire)
    assert line.take(str.encode, "a") == b"a"  # paced: straight to the transport
    assert wire.written == [b"a"]
    assert line.take(lambda _: b"", "nothing") == b""  # nothing to write: taken
    with pytest.raises(ZeroDivisionError):
        line.take(lambda _: b"%d" % (1 // 0), "b")
    assert wire.written == [b"a"]  # the failed frame: nothing written, nothing held
    wire.room = False
    assert line.take(str.encode, "c") == b"c"  # a full transport: held, not dropped
    assert wire.written == [b"a"]
    await line.finish(b"")
    assert wire.sent == [(b"c", True), (b"", False)]


_STATES = list(itertools.product([False, True], repeat=6))


@pytest.mark.anyio
@pytest.mark.parametrize(("direct", "room", "started", "stopping", "burst", "sending"), _STATES)
@pytest.mark.parametrize("held", [0, 1, 2])
async def test_take_and_offer_decide_alike_in_every_state(
    monkeypatch: pytest.MonkeyPatch,
    direct: bool,
    room: bool,
    started: bool,
    stopping: bool,
    burst: bool,
    sending: bool,
    held: int,
) -> None:
    """``take`` writes ``offer``'s rule out again, decided before the frame is made: in
    each state a line can be in, the two take, write, hold or refuse alike."""
    # A window the first send opens and that lasts the test, or none at all.
    monkeypatch.setattr(_line, "BURST", 60.0 if burst else -1.0)
    outcomes = []
    for way in ("offer", "take"):
        wire = _Wire(direct=direct)
        line = _line_on(wire, started=False, max_queue=2)
        if started:
            await line.write(b"0")  # the answer's start, through the server's send
        wire.room = room
        line.sending = True  # what is offered now is held
        for _ in range(held):
            assert line.offer(b"h")
        line.sending = sending
        if stopping:
            line.stop()
        taken = line.offer(b"x") if way == "offer" else line.take(str.encode, "x") is not None
        outcomes.append((taken, list(wire.written), list(line._held)))
    assert outcomes[0] == outcomes[1]


def _never_framed(item: str) -> bytes:
    raise AssertionError(f"framed {item!r} for a line that refuses it")


@pytest.mark.anyio
@pytest.mark.usefixtures("no_burst")
async def test_a_line_writes_straight_to_the_transport_once_its_answer_has_started() -> None:
    wire = _Wire()
    line = _line_on(wire, started=False)
    assert not line.offer(b"a")  # the answer's first bytes go through the server
    await line.write(b"a")
    assert line.started
    assert line.offer(b"b")
    assert wire.written == [b"b"]
    line.stop()  # the server shuts down: nothing more goes the direct way
    assert not line.offer(b"c")
    assert wire.written == [b"b"]


@pytest.mark.anyio
async def test_a_line_ended_quietly_writes_nothing_more() -> None:
    wire = _Wire()
    line = _line_on(wire)
    line.end_quietly()  # the binding answers by itself
    assert line.ended
    with pytest.raises(LineEnded):
        line.offer(b"a")
    await line.finish(b"end")
    assert wire.written == []
    assert wire.sent == []


@pytest.mark.anyio
async def test_a_send_in_progress_at_the_shutdown_counts_as_stalled_after_the_grace() -> None:
    # A client that stopped reading: its send would hold the shutdown up for the rest of
    # send_timeout (30 s by default), and under a server essessey cannot reset, longer.
    wire = _Wire()
    stalled: list[bool] = []
    wire.stalled = lambda: stalled.append(True)  # type: ignore[method-assign]
    line = _line_on(wire, send_timeout=30.0)
    line.sending = True
    line.send_began = time.monotonic()
    line.stop()
    now = time.monotonic()
    due = line.check(now)
    assert due is not None
    assert due <= now + STOP_SEND_GRACE  # looked at again by then
    assert not stalled
    assert line.check(now + STOP_SEND_GRACE + 0.1) is None  # ended as stalled
    assert stalled == [True]
    assert (line.ended, line.stalled) == (True, True)
