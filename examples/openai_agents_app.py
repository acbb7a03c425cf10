"""An OpenAI Agents SDK agent served to every client through the hub, approvals included.

Run it with ``python examples/openai_agents_app.py [--host 127.0.0.1] [--port 8000]`` (it
needs ``essessey[server,openai-agents]`` and FastAPI). One agent, five ways in:
``useChat`` (``POST /api/chat``, resumable), AG-UI (``POST /agui``), OpenAI Chat
Completions and Responses (``/v1/chat/completions``, ``/v1/responses``) and the protocol's
own SSE (``/streams/{id}``, its resume and ``POST /streams/{id}/answer``).

The agent drafts a mail to the address in the message and calls ``send_email``, a tool
with ``needs_approval=True``: the run stops, and the turn asks the client to approve the
call (Approve / Deny in ``useChat``, an ``mcp_approval_request`` in Responses, an
interrupt in AG-UI). The answer, through any of them, approves or rejects the SDK's own
``RunState`` and resumes the run, which sends the mail (or not) and says so.

The model is scripted so the app runs offline: :class:`OfflineModel` answers each model
call with the SDK's own test double (``agents.testing.ScriptedModel``); put a real model
(``Agent(model="gpt-5")``) in its place and nothing else changes. For replicas, keep the
run states where the stream is: ``store = RedisEventStore(...)``,
``turns = AgentTurns(agent, states=RunStates(store))``, ``StreamHub(store, ...)``.
"""

from __future__ import annotations

import argparse
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import ScriptedModel, assistant_message, function_call
from fastapi import FastAPI

from essessey import StreamHub
from essessey.adapters.openai_agents import AgentTurns
from essessey.dialects import dialect_routes

set_tracing_disabled(True)  # offline: no traces exported

OUTBOX: list[str] = []
"""The addresses this app has mailed (its tool's effect, for the tests to see)."""

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


@function_tool(needs_approval=True)
def send_email(to: str, subject: str) -> str:
    """Send an email (the user approves it first)."""
    OUTBOX.append(to)
    return f"sent to {to}"


class OfflineModel(Model):
    """A scripted model: a new message makes it call ``send_email``; the tool's output
    makes it say what happened. Each call is streamed by the SDK's ``ScriptedModel``."""

    def reply(self, given: str | list[Any]) -> list[Any]:
        last = given if isinstance(given, str) else given[-1]
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            sent = str(last.get("output", "")).startswith("sent to")
            return [assistant_message("Sent." if sent else "I did not send it.")]
        found = _ADDRESS.search(str(last if isinstance(last, str) else last.get("content")))
        to = found.group(0) if found else "team@example.com"
        arguments = {"to": to, "subject": "Hello"}
        call_id = "call_" + secrets.token_hex(8)
        return [
            assistant_message(f"I drafted a mail to {to}."),
            function_call("send_email", arguments, call_id=call_id),
        ]

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        return await ScriptedModel([self.reply(args[1])]).get_response(*args, **kwargs)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for event in ScriptedModel([self.reply(args[1])]).stream_response(*args, **kwargs):
            yield event


agent = Agent(name="mailer", instructions="Draft mails.", model=OfflineModel(), tools=[send_email])

turns = AgentTurns(agent)
hub = StreamHub(on_answer=turns.on_answer)
app = FastAPI(lifespan=hub.lifespan)
app.router.routes.extend(dialect_routes(hub, turns))


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
