"""A FastAPI backend whose agent asks before a tool runs, served to ``useChat``.

Run it with ``python examples/approval_app.py [--host 127.0.0.1] [--port 8000]`` (it
needs FastAPI besides ``essessey[server]``: ``pip install fastapi``). A React page with
the AI SDK (ai@7) talks to it with its defaults::

    const { messages, sendMessage, addToolApprovalResponse } = useChat({
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    });

The agent answers every message by drafting an email to the address in it and asking to
send it: the ``send_email`` call streams, then a ``tool-approval-request`` (Approve /
Deny in the page, ``addToolApprovalResponse({ id, approved })``). When the user decides,
``useChat`` posts the chat again; the routes find the chat's waiting turn and answer it,
and the same assistant message goes on: ``tool-output-available`` with the sent mail and
"Sent." when approved, ``tool-output-denied`` and "I did not send it." when denied.

The turn runs on the hub, apart from the request: a reload while it waits shows the
request again (``useChat``'s resume), and the answer can come to any replica that shares
the store (``RedisEventStore``, ``JetStreamEventStore``), where it continues the turn
once, however many times it is posted. The protocol's own clients read and answer the
same streams through ``hub_routes`` (``POST /streams/{id}/answer``; docs/asking.md).
"""

from __future__ import annotations

import argparse
import re
import secrets

from fastapi import FastAPI

import essessey
from essessey.bindings.sse import hub_routes
from essessey.dialects import user_text
from essessey.dialects.ui import ChatRequest, ui_chat_routes

MODEL = "scripted-model"
OUTBOX: list[dict[str, str]] = []
"""The mails this app has sent (its tool's effect, for the tests to see)."""

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def turn(chat: ChatRequest) -> essessey.TurnProducer:
    """The agent's answer to a chat message: draft the mail, then ask before sending it."""
    found = _ADDRESS.search(user_text(chat))
    to = found.group(0) if found else "team@example.com"

    async def produce(publisher: essessey.Publisher) -> None:
        async with essessey.stream_turn(
            publisher, message_id="msg_" + secrets.token_hex(8), stream_id=chat.id, model=MODEL
        ) as turn:
            await (await turn.text()).write(f"I drafted a mail to {to}.")
            tools = await turn.tools()
            call_id = "call_" + secrets.token_hex(8)
            await tools.start_call(call_id, "send_email", f'{{"to": "{to}", "subject": "Hi"}}')
            await turn.ask_approval(call_id, reason="sends an email on your behalf")

    return produce


async def go_on(publisher: essessey.Publisher, answered: essessey.Answered) -> None:
    """What runs when the user decides: send the approved mails, then say what happened."""
    async with essessey.continue_turn(publisher, answered) as turn:
        sent = 0
        for request, approval in answered.approvals():
            if approval.approved:
                OUTBOX.append(dict(request.input))
                await turn.tool_result(request.tool_use_id, {"sent": True})
                sent += 1
        await (await turn.text()).write("Sent." if sent else "I did not send it.")


hub = essessey.StreamHub(on_answer=go_on)
app = FastAPI(lifespan=hub.lifespan)
# useChat's default paths: POST /api/chat (a new message, or the answer to a waiting
# turn), GET /api/chat/{id}/stream (the reconnect), POST /api/chat/{id}/stop.
app.router.routes.extend(ui_chat_routes(hub, turn))
# The protocol's own SSE, resume and answer routes, for clients that are not useChat.
app.router.routes.extend(hub_routes(hub))


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
