"""The app tests/test_ui_node.py serves: a hub and the AI SDK chat routes, answering each
chat with a scripted agent turn (two rounds, reasoning, two parallel tool calls).

A chat whose body says ``hold_for_resume`` holds its turn before the second round until a
client resumes the chat (the hub's ``authorize`` asked for ``"resume"``), so a test of a
resume mid-turn does not race a client that is slow to start."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette

from essessey import StreamHub
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from essessey.hub import Access, TurnProducer
from tests.processes import WAIT
from tests.scripted_turn import scripted_turn

_resumed: dict[str, anyio.Event] = {}
"""Set when a client resumes the chat of that id."""


def _resume_of(chat_id: str) -> anyio.Event:
    return _resumed.setdefault(chat_id, anyio.Event())


def note_resumes(request: object, chat_id: str, access: Access) -> bool:
    """The default hub's ``authorize``: lets everything through, noting each resume."""
    if access == "resume":
        _resume_of(chat_id).set()
    return True


def agent_turn(chat: ChatRequest) -> TurnProducer:
    """The answer to ``chat``: its body's ``delay_ms`` paces the deltas, ``fail`` ends the
    first round with a provider error."""
    delay = float(chat.body.get("delay_ms", 0)) / 1000

    async def hold() -> None:
        with anyio.move_on_after(WAIT):
            await _resume_of(chat.id).wait()
        _resumed.pop(chat.id, None)

    held = hold if chat.body.get("hold_for_resume") else None
    return scripted_turn(chat.id, delay=delay, fail=bool(chat.body.get("fail")), hold=held)


def create_app(hub: StreamHub | None = None, *, replay_finished: bool = False) -> Starlette:
    """The chat routes at the AI SDK's default paths, on ``hub`` (a new in-memory one that
    notes resumes)."""
    the_hub = hub or StreamHub(authorize=note_resumes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with the_hub:
            yield

    app = Starlette(
        routes=list(ui_chat_routes(the_hub, agent_turn, replay_finished=replay_finished)),
        lifespan=lifespan,
    )
    app.state.hub = the_hub
    return app
