"""Every frame a dialect writes for an event carries an id, and a client that resumes by
the id of any frame, one in the middle of an event's frames included, gets exactly the
frames after it: nothing twice, nothing missing. Each dialect, on a real uvicorn server,
over a finished turn (a drop after every frame) and while the turn is still running."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from essessey import StreamHub
from essessey.bindings.sse import FrameEncoder, requested_resume_point, stream_response
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from tests.processes import WAIT
from tests.scripted_turn import scripted_turn
from tests.servers import serve

pytestmark = pytest.mark.anyio

ENCODERS: dict[str, Callable[[str], FrameEncoder]] = {
    "ui": lambda stream_id: UIMessageEncoder(message_id=stream_id),
    "agui": lambda stream_id: AGUIEncoder(stream_id, stream_id),
    "chat": ChatCompletionsEncoder,
    "responses": ResponsesEncoder,
}
_ID = re.compile(rb"^id: (.*)$", re.MULTILINE)
# Chat Completions and Responses stamp the time an answer was written: not part of what a
# resume must repeat exactly.
_CREATED = re.compile(rb'"created(_at)?":\d+')
# The dialects whose events become several frames (Chat Completions writes one per event).
_SEVERAL = {"ui", "agui", "responses"}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    hub = StreamHub()

    async def start(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        delay = float(request.query_params.get("delay", "0"))
        await hub.start(stream_id, scripted_turn(stream_id, delay=delay))
        if not delay:
            await hub.wait(stream_id)
        return Response(status_code=204)

    async def dialect(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        encoder = ENCODERS[request.path_params["dialect"]](stream_id)
        return stream_response(hub, stream_id, requested_resume_point(request), encoder=encoder)

    routes = [
        Route("/start/{stream_id}", start, methods=["POST"]),
        Route("/d/{dialect}/{stream_id}", dialect),
    ]
    app = Starlette(routes=routes, lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def frames_of(body: bytes) -> list[bytes]:
    """The body's SSE messages, each as it was written (ending with its blank line)."""
    return [_CREATED.sub(b'"created":0', part) + b"\n\n" for part in body.split(b"\n\n")[:-1]]


def id_of(frame: bytes) -> str | None:
    found = _ID.search(frame)
    return None if found is None else found.group(1).decode()


async def read(http: httpx.AsyncClient, url: str, last_id: str | None = None) -> httpx.Response:
    headers = {} if last_id is None else {"last-event-id": last_id}
    with anyio.fail_after(WAIT):
        return await http.get(url, headers=headers)


@pytest.mark.parametrize("dialect", list(ENCODERS))
async def test_a_resume_after_any_frame_gets_exactly_the_frames_after_it(
    base_url: str, dialect: str
) -> None:
    stream_id = f"frames-{dialect}"
    url = f"{base_url}/d/{dialect}/{stream_id}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        assert (await http.post(f"{base_url}/start/{stream_id}")).status_code == 204
        whole = frames_of((await read(http, url)).content)
        ids = [id_of(frame) for frame in whole]
        # Every frame has an id, the stream's own end (finish, [DONE]) included.
        assert all(frame_id is not None for frame_id in ids)
        assert len(set(ids)) == len(ids)  # no two frames share an id
        several = any(":" in str(frame_id) for frame_id in ids[:-3])
        assert several == (dialect in _SEVERAL)
        for k, frame_id in enumerate(ids[:-1]):
            assert frame_id is not None
            rest = await read(http, url, frame_id)
            assert rest.status_code == 200, (frame_id, rest.text)
            assert frames_of(rest.content) == whole[k + 1 :], frame_id
        # After the stream's last frame: nothing more to send.
        assert (await read(http, url, ids[-1])).status_code == 204


@pytest.mark.parametrize("dialect", list(ENCODERS))
async def test_an_id_no_frame_had_is_refused(base_url: str, dialect: str) -> None:
    stream_id = f"bogus-{dialect}"
    url = f"{base_url}/d/{dialect}/{stream_id}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        assert (await http.post(f"{base_url}/start/{stream_id}")).status_code == 204
        whole = frames_of((await read(http, url)).content)
        event_id = str(id_of(whole[0])).rpartition(":")[0]  # of the first event
        event_id = event_id or str(next(id_of(f) for f in whole if id_of(f)))
        # Frame 1 of a one-frame event, a frame past an event's last, frame 0, and a frame
        # of an event the stream never had.
        for bogus in (f"{event_id}:99", f"{event_id}:0", "nope-1:1"):
            answer = await read(http, url, bogus)
            assert answer.status_code == 410, (bogus, answer.status_code)


@pytest.mark.parametrize("dialect", list(ENCODERS))
async def test_a_resume_mid_event_of_a_running_turn_goes_on_live(
    base_url: str, dialect: str
) -> None:
    stream_id = f"live-{dialect}"
    url = f"{base_url}/d/{dialect}/{stream_id}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        assert (await http.post(f"{base_url}/start/{stream_id}?delay=0.05")).status_code == 204
        got: list[bytes] = []
        resume_at: str | None = None
        with anyio.fail_after(WAIT):
            async with http.stream("GET", url) as response:
                buffer = b""
                async for chunk in response.aiter_bytes():
                    buffer += chunk
                    *done, buffer = buffer.split(b"\n\n")
                    got += frames_of(b"\n\n".join(done) + b"\n\n") if done else []
                    ids = [str(id_of(f)) for f in got if id_of(f)]
                    within = [i for i in ids if ":" in i]
                    resume_at = within[0] if within else (ids[4] if len(ids) > 4 else None)
                    if resume_at is not None:
                        break  # the connection drops (mid-event where events have frames)
        assert resume_at is not None
        cut = next(k for k, frame in enumerate(got) if id_of(frame) == resume_at)
        rest = frames_of((await read(http, url, resume_at)).content)
        whole = frames_of((await read(http, url)).content)
        assert got[: cut + 1] + rest == whole
