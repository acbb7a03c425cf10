"""The app tests/test_ui_node.py serves: a hub and the AI SDK chat routes, answering each
chat with a scripted agent turn (two rounds, reasoning, two parallel tool calls)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette

from essessey import StreamHub
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from essessey.hub import TurnProducer
from tests.scripted_turn import scripted_turn


def agent_turn(chat: ChatRequest) -> TurnProducer:
    """The answer to ``chat``: its body's ``delay_ms`` paces the deltas, ``fail`` ends the
    first round with a provider error."""
    delay = float(chat.body.get("delay_ms", 0)) / 1000
    return scripted_turn(chat.id, delay=delay, fail=bool(chat.body.get("fail")))


def create_app(hub: StreamHub | None = None, *, replay_finished: bool = False) -> Starlette:
    """The chat routes at the AI SDK's default paths, on ``hub`` (a new in-memory one)."""
    the_hub = hub or StreamHub()

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
