"""Pydantic AI agents on the framework's own offline test doubles, for the adapter's tests.

``FunctionModel`` with a ``stream_function`` scripts each model request by how many
requests the run has made (so a resumed run goes on with the script), ``TestModel``
calls every tool once and answers with JSON of their results. ``AnthropicModel`` reads
a Messages API stream written here (:func:`anthropic_stream`), served over loopback
(:func:`messages_app`), for what only a provider's stream carries (cache counts, a stop
reason, redacted thinking).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from anthropic import AsyncAnthropic
from pydantic_ai import Agent, DeferredToolRequests, ModelRetry, Tool
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

MODEL_NAME = "scripted-pydantic-ai"
SENT: list[dict[str, Any]] = []
"""The mails the approval agents sent (the tool's effect)."""
DENIALS: list[str] = []
"""What the model was told of each denied mail."""


def requests_made(messages: list[ModelMessage]) -> int:
    """How many model requests the run's history holds (this one included)."""
    return sum(1 for message in messages if isinstance(message, ModelRequest))


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """Every tool return in the history, in order."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def _weather_script(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls | dict[int, DeltaThinkingPart]]:
    n = requests_made(messages)
    if n == 1:
        yield {0: DeltaThinkingPart(content="Two cities, ")}
        yield {0: DeltaThinkingPart(content="two calls.", signature="sig-1")}
        yield {1: DeltaToolCall(name="weather", json_args='{"city": ', tool_call_id="call_oslo")}
        yield {1: DeltaToolCall(json_args='"Oslo"}')}
        yield {
            2: DeltaToolCall(name="weather", json_args='{"city": "Rome"}', tool_call_id="call_rome")
        }
    elif n == 2:
        yield {0: DeltaToolCall(name="flaky", json_args="{}", tool_call_id="call_flaky_1")}
    elif n == 3:
        yield {0: DeltaToolCall(name="flaky", json_args="{}", tool_call_id="call_flaky_2")}
    else:
        for word in ("Oslo ", "is ", "cold, ", "Rome ", "is ", "warm."):
            yield word


def weather_agent() -> Agent[None, str]:
    """Thinking, two parallel calls, a call that fails once (``ModelRetry``) and works
    again, then streamed text: four model requests."""
    agent = Agent(FunctionModel(stream_function=_weather_script, model_name=MODEL_NAME))
    attempts: list[int] = []

    @agent.tool_plain
    def weather(city: str) -> dict[str, Any]:
        return {"city": city, "celsius": -3 if city == "Oslo" else 21}

    @agent.tool_plain(retries=2)
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ModelRetry("not yet, try again")
        return "worked"

    return agent


async def _mail_script(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    n = requests_made(messages)
    if n == 1:
        yield "I will look it up and send it."
        yield {
            1: DeltaToolCall(
                name="send_email", json_args='{"to": "ada@example.com"}', tool_call_id="call_mail"
            )
        }
        yield {
            2: DeltaToolCall(name="lookup", json_args='{"name": "ada"}', tool_call_id="call_look")
        }
    else:
        returns = {part.tool_name: part for part in tool_returns(messages)}
        mail = returns.get("send_email")
        if mail is not None and mail.outcome == "success":
            yield "Sent."
        else:
            if mail is not None:
                DENIALS.append(str(mail.content))
            yield "I did not send it."


def mail_agent() -> Agent[None, str | DeferredToolRequests]:
    """Text, then a call that needs approval and one that runs; after the answer, says
    whether the mail went."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(stream_function=_mail_script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain(requires_approval=True)
    def send_email(to: str) -> dict[str, Any]:
        SENT.append({"to": to})
        return {"sent": True, "to": to}

    @agent.tool_plain
    def lookup(name: str) -> str:
        return f"{name}@example.com"

    return agent


async def _client_script(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    if requests_made(messages) == 1:
        yield {0: DeltaToolCall(name="locate", json_args="{}", tool_call_id="call_where")}
    else:
        [where] = [part for part in tool_returns(messages) if part.tool_name == "locate"]
        yield f"You are in {where.content}."


def client_tool_agent() -> Agent[None, str | DeferredToolRequests]:
    """A deferred (external) tool the client runs: the run stops at its call."""
    locate = ToolDefinition(
        name="locate",
        parameters_json_schema={"type": "object", "properties": {}},
        description="The user's city, from the device.",
    )
    return Agent(
        FunctionModel(stream_function=_client_script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
        toolsets=[ExternalToolset([locate])],
    )


def failing_agent() -> Agent[None, str]:
    """Text, then a tool that raises a plain exception: the run fails."""

    async def script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        yield "Trying."
        yield {1: DeltaToolCall(name="broken", json_args="{}", tool_call_id="call_broken")}

    agent = Agent(FunctionModel(stream_function=script, model_name=MODEL_NAME))

    @agent.tool_plain
    def broken() -> str:
        raise RuntimeError("the disk is on fire")

    return agent


def slow_agent(started: Any, gate: Any, closed: list[int]) -> Agent[None, str]:
    """Streams words, waiting on ``gate`` (an anyio Event) after the first and setting
    ``started`` (another) before it: for
    cancellation and drop-and-resume in the middle of a run. ``closed`` gets a 1 when the
    model's stream is closed before its end."""

    async def script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        started.set()
        ended = False
        try:
            yield "first "
            await gate.wait()
            for n in range(20):
                yield f"w{n} "
            ended = True
        finally:
            if not ended:
                closed.append(1)

    return Agent(FunctionModel(stream_function=script, model_name=MODEL_NAME))


def repeated_call_id_agent() -> Agent[None, str]:
    """Three model requests that each call ``count`` under the same id (``call_0``), as a
    model that numbers its calls per response does, then an answer."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        n = requests_made(messages)
        if n <= 3:
            yield {0: DeltaToolCall(name="count", json_args="{}", tool_call_id="call_0")}
        else:
            yield "done"

    agent = Agent(FunctionModel(stream_function=script, model_name=MODEL_NAME))
    made: list[int] = []

    @agent.tool_plain
    def count() -> str:
        made.append(len(made))
        return f"result {made[-1]}"

    return agent


def scripted_client_calls_agent(
    steps: list[str | tuple[int, str, bool]],
) -> Agent[None, str | DeferredToolRequests]:
    """One model request that streams ``steps`` in order: a string is text, a
    ``(k, fragment, first)`` the next fragment of the arguments of call ``k`` of an
    external tool (``lookup``, any arguments; its first fragment names it ``call_k``).
    The run stops at the calls, the client's to run."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for step in steps:
            if isinstance(step, str):
                yield step
                continue
            k, fragment, first = step
            # Part 0 is the text's; call k is part k + 1.
            delta = DeltaToolCall(
                name="lookup" if first else None,
                json_args=fragment,
                tool_call_id=f"call_{k}" if first else None,
            )
            yield {k + 1: delta}

    lookup = ToolDefinition(
        name="lookup",
        parameters_json_schema={"type": "object", "additionalProperties": True},
        description="Looks anything up, on the client.",
    )
    return Agent(
        FunctionModel(stream_function=script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
        toolsets=[ExternalToolset([lookup])],
    )


def odd_values_agent(output: object) -> Agent[None, str]:
    """One call of ``odd`` (its arguments holding an integer past 64 bits), whose tool
    returns ``output``, then an answer."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if requests_made(messages) <= 1:
            args = '{"n": 18446744073709551616}'
            yield {0: DeltaToolCall(name="odd", json_args=args, tool_call_id="c1")}
        else:
            yield "done"

    agent = Agent(FunctionModel(stream_function=script, model_name=MODEL_NAME))

    @agent.tool_plain
    def odd(n: int) -> object:
        return output

    return agent


def gated_calls_agent(
    sequence: list[tuple[int, str, bool]], gated: list[bool], ran: list[str]
) -> Agent[None, str | DeferredToolRequests]:
    """One model request that streams parallel calls' fragments in the order
    ``sequence`` gives (``(k, fragment, first)``: call ``k`` is ``call_k`` of tool
    ``f<k>``, which takes any object and needs approval when ``gated[k]``), then, once
    the tools ran (or were denied), the answer ``done``. ``ran`` gets each tool that ran."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        if requests_made(messages) > 1:
            yield "done"
            return
        for k, fragment, first in sequence:
            delta = DeltaToolCall(
                name=f"f{k}" if first else None,
                json_args=fragment,
                tool_call_id=f"call_{k}" if first else None,
            )
            yield {k: delta}

    def tool(k: int) -> Tool[None]:
        def run(**arguments: Any) -> str:
            ran.append(f"f{k}")
            return f"f{k} ran"

        made: Tool[None] = Tool.from_schema(
            run, f"f{k}", "Takes any object.", {"type": "object", "additionalProperties": True}
        )
        made.requires_approval = gated[k]
        return made

    return Agent(
        FunctionModel(stream_function=script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
        tools=[tool(k) for k in range(len(gated))],
    )


def undecodable_name_agent() -> Agent[None, str | DeferredToolRequests]:
    """Lists files (a name decoded with surrogateescape: a lone surrogate), then asks to
    delete one (a tool that needs approval), then says ``done``."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        n = requests_made(messages)
        if n == 1:
            yield {0: DeltaToolCall(name="list_files", json_args="{}", tool_call_id="c1")}
        elif n == 2:
            yield {0: DeltaToolCall(name="delete", json_args='{"name": "x"}', tool_call_id="c2")}
        else:
            yield "done"

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(stream_function=script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain
    def list_files() -> str:
        return b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    @agent.tool_plain(requires_approval=True)
    def delete(name: str) -> str:
        return f"deleted {name}"

    return agent


def client_calls_agent(deltas: Sequence[DeltaToolCalls]) -> Agent[None, str | DeferredToolRequests]:
    """One model request that streams ``deltas`` as they are (a part's name, id and
    arguments, any of them in any delta), the calls of an external tool ``lookup`` (any
    arguments): the run stops at them, the client's to run."""

    async def script(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[DeltaToolCalls]:
        for delta in deltas:
            yield delta

    lookup = ToolDefinition(
        name="lookup",
        parameters_json_schema={"type": "object", "additionalProperties": True},
        description="Looks anything up, on the client.",
    )
    return Agent(
        FunctionModel(stream_function=script, model_name=MODEL_NAME),
        output_type=[str, DeferredToolRequests],
        toolsets=[ExternalToolset([lookup])],
    )


CLAUDE = "claude-sonnet-4-5"


def anthropic_stream(
    blocks: Sequence[Mapping[str, Any]],
    *,
    stop_reason: str = "end_turn",
    usage: Mapping[str, int] | None = None,
    output_tokens: int = 5,
) -> bytes:
    """A Messages API stream as Anthropic sends it: ``message_start`` with ``usage``
    (its input counts), then each of ``blocks`` (a text block's text, a thinking block's
    thinking and signature and a compaction block's content as their deltas after an
    empty start, any other block whole at its start), then ``message_delta`` with
    ``stop_reason`` and ``output_tokens``, and ``message_stop``."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": CLAUDE,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1, **(usage or {})},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(blocks):
        deltas: list[dict[str, Any]] = []
        start = dict(block)
        if block["type"] == "text":
            start["text"] = ""
            deltas.append({"type": "text_delta", "text": block["text"]})
        elif block["type"] == "thinking":
            start.update(thinking="", signature="")
            if block["thinking"]:
                deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif block["type"] == "compaction":
            start.update(content=None, encrypted_content=None)
            deltas.append({**block, "type": "compaction_delta"})
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
    )


def messages_app(body: bytes) -> Starlette:
    """Anthropic's ``POST /v1/messages``, answering every request with the stream
    ``body``."""

    async def messages(request: Request) -> Response:
        return Response(body, media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


def anthropic_agent(client: AsyncAnthropic) -> Agent[None, str]:
    """An agent on Pydantic AI's ``AnthropicModel`` with ``client`` (closed by its
    caller, before the event loop is)."""
    return Agent(AnthropicModel(CLAUDE, provider=AnthropicProvider(anthropic_client=client)))
