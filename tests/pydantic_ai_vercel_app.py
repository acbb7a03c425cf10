"""The app of examples/pydantic_ai_app.py written with Pydantic AI's own ``VercelAIAdapter``
instead of essessey: the same agent served to ``useChat`` (AI SDK 6/7, with approvals),
for docs/pydantic_ai.md's comparison. The lines a user writes for it are its imports of
the web framework and the adapter, and what is between the integration markers; the
tests count them the same way in both files."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.requests import Request
from starlette.responses import Response

from tests.test_examples import load_example

agent = load_example("pydantic_ai_app").agent

# integration: begin
app = FastAPI()


@app.post("/api/chat")
async def chat(request: Request) -> Response:
    return await VercelAIAdapter.dispatch_request(request, agent=agent, sdk_version=6)


# integration: end
