"""A Pydantic AI agent served to every client, with an approval, in a few lines.

Run it with ``python examples/pydantic_ai_app.py [--host 127.0.0.1] [--port 8000]`` (it
needs ``essessey[pydantic-ai,server]`` and FastAPI). The agent runs on Pydantic AI's own
``FunctionModel``, scripted, so the app runs offline; put ``Agent("openai:gpt-5.2", ...)``
in its place for a real model. It answers at each client's default path:

- ``POST /api/chat``: the AI SDK's ``useChat`` (with ``addToolApprovalResponse`` and
  ``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses``);
- ``POST /agui``: AG-UI clients (``@ag-ui/client``, CopilotKit);
- ``POST /v1/chat/completions`` and ``POST /v1/responses``: OpenAI clients;
- ``GET /streams/{id}`` and ``POST /streams/{id}/answer``: the protocol's own SSE.

The agent looks up the weather (a tool it runs) and drafts a mail to the address in the
message, whose ``send_email`` tool needs approval (``requires_approval=True``): the
turn asks, the answer comes back through any of those clients, and the run goes on
(docs/pydantic_ai.md). Every turn runs in the hub, apart from the request: a reload
resumes it, and with ``RunStates`` on a shared store (Redis, JetStream) any replica takes
the answer.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from essessey import StreamHub
from essessey.adapters.pydantic_ai import AgentTurns
from essessey.dialects import dialect_routes

OUTBOX: list[dict[str, Any]] = []
"""The mails this app has sent (its tool's effect, for the tests to see)."""

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


async def scripted_model(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """The model, scripted: call both tools, then say what became of the mail."""
    returns = {
        part.tool_name: part
        for part in messages[-1].parts
        if isinstance(messages[-1], ModelRequest) and isinstance(part, ToolReturnPart)
    }
    if "send_email" in returns:
        yield "Sent." if returns["send_email"].outcome == "success" else "I did not send it."
        return
    prompt = " ".join(
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    )
    found = _ADDRESS.search(prompt)
    to = found.group(0) if found else "team@example.com"
    yield f"I drafted a mail to {to}."
    yield {1: DeltaToolCall("weather", '{"city": "Oslo"}', tool_call_id="call_weather")}
    yield {2: DeltaToolCall("send_email", f'{{"to": "{to}"}}', tool_call_id="call_send")}


agent = Agent(
    FunctionModel(stream_function=scripted_model), output_type=[str, DeferredToolRequests]
)


@agent.tool_plain
def weather(city: str) -> dict[str, Any]:
    """The weather in ``city``."""
    return {"city": city, "celsius": 4}


@agent.tool_plain(requires_approval=True)
def send_email(to: str) -> dict[str, Any]:
    """Send the drafted mail to ``to``: only once the user approves."""
    OUTBOX.append({"to": to})
    return {"sent": True}


# The few lines: the agent's turns for every dialect, and the continuation of a turn that
# asked (on every replica: give them RunStates(store) and StreamHub(store) on one store).
# integration: begin
turns = AgentTurns(agent)
hub = StreamHub(on_answer=turns.on_answer)
app = FastAPI(lifespan=hub.lifespan)
app.router.routes.extend(dialect_routes(hub, turns))
# integration: end


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
