"""An Agents SDK ``Model`` of the tests' own: it streams scripted Responses API events
(the ``openai`` SDK's event classes), one script per model call, offline."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from agents.models.interface import Model
from openai.types.responses import ResponseStreamEvent

# Each Responses stream event's class, by its type: the events are the openai SDK's own.
_UNION = get_args(ResponseStreamEvent)[0]
EVENT_CLASSES: dict[str, Any] = {
    get_args(cls.model_fields["type"].annotation)[0]: cls for cls in get_args(_UNION)
}
MODEL_NAME = "gpt-scripted"


@dataclass(frozen=True)
class Pause:
    """A point in a script where the model waits (``until()`` returns)."""

    until: Callable[[], Awaitable[object]]


Step = Any  # an event, an Exception (raised there) or a Pause


class ScriptedResponses(Model):
    """A model whose every ``stream_response`` plays the next script."""

    def __init__(self, scripts: Sequence[Sequence[Step]]) -> None:
        self.scripts = [list(script) for script in scripts]
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the tests stream")

    async def stream_response(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        script = self.scripts[self.calls]
        self.calls += 1
        for step in script:
            if isinstance(step, Exception):
                raise step
            if isinstance(step, Pause):
                await step.until()
                continue
            yield step


class Response:
    """Builds one response's events: ``created``, then the parts, then ``completed``
    with every output item whole (the SDK reads the run's items from it)."""

    _ids = itertools.count(1)

    def __init__(self, *, model: str = MODEL_NAME, usage: tuple[int, int] = (10, 5)) -> None:
        self.id = f"resp_{next(self._ids)}"
        self.model = model
        self.usage = usage
        self.events: list[Any] = []
        self.output: list[dict[str, Any]] = []
        self._seq = 0
        self._add("response.created", response=self._response("in_progress", []))

    def _add(self, kind: str, **fields: Any) -> None:
        body = {"type": kind, "sequence_number": self._seq, **fields}
        self.events.append(EVENT_CLASSES[kind].model_validate(body))
        self._seq += 1

    def _response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": 0,
            "model": self.model,
            "output": output,
            "tool_choice": "auto",
            "tools": [],
            "parallel_tool_calls": True,
            "status": status,
        }
        if status == "completed":
            given, out = self.usage
            body["usage"] = {
                "input_tokens": given,
                "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 1},
                "total_tokens": given + out,
            }
        return body

    def reasoning(self, *chunks: str) -> Response:
        n = len(self.output)
        rid = f"rs_{self.id}_{n}"
        self._add(
            "response.output_item.added",
            output_index=n,
            item={"type": "reasoning", "id": rid, "summary": []},
        )
        for chunk in chunks:
            self._add(
                "response.reasoning_summary_text.delta",
                item_id=rid,
                output_index=n,
                summary_index=0,
                delta=chunk,
            )
        item = {
            "type": "reasoning",
            "id": rid,
            "summary": [{"type": "summary_text", "text": "".join(chunks)}],
        }
        self._add("response.output_item.done", output_index=n, item=item)
        self.output.append(item)
        return self

    def text(self, *chunks: str) -> Response:
        n = len(self.output)
        mid = f"msg_{self.id}_{n}"
        added = {"type": "message", "id": mid, "role": "assistant", "status": "in_progress"}
        self._add("response.output_item.added", output_index=n, item=dict(added, content=[]))
        for chunk in chunks:
            self._add(
                "response.output_text.delta",
                item_id=mid,
                output_index=n,
                content_index=0,
                delta=chunk,
                logprobs=[],
            )
        part = {"type": "output_text", "text": "".join(chunks), "annotations": []}
        item = dict(added, status="completed", content=[part])
        self._add("response.output_item.done", output_index=n, item=item)
        self.output.append(item)
        return self

    def web_search(self, query: str) -> Response:
        """A hosted web search the provider ran itself."""
        n = len(self.output)
        action = {"type": "search", "query": query}
        item = {"type": "web_search_call", "id": f"ws_{self.id}_{n}", "status": "in_progress"}
        item["action"] = action
        self._add("response.output_item.added", output_index=n, item=item)
        whole = dict(item, status="completed")
        self._add("response.output_item.done", output_index=n, item=whole)
        self.output.append(whole)
        return self

    def item(self, item: dict[str, Any]) -> Response:
        """An output item that comes whole: added, then done."""
        n = len(self.output)
        self._add("response.output_item.added", output_index=n, item=item)
        self._add("response.output_item.done", output_index=n, item=item)
        self.output.append(item)
        return self

    def hosted_shell(self, call_id: str, command: str, stdout: str) -> Response:
        """A shell the provider ran in its own container: the call, then its output."""
        first = len(self.output)
        call: dict[str, Any] = {"type": "shell_call", "id": f"sh_{self.id}_{first}"}
        call["call_id"] = call_id
        call |= {"action": {"commands": [command]}, "status": "completed"}
        call["environment"] = {"type": "container_reference", "container_id": "cntr_1"}
        result: dict[str, Any] = {"type": "shell_call_output", "id": f"sho_{self.id}_{first}"}
        result["call_id"] = call_id
        outcome = {"type": "exit", "exit_code": 0}
        result |= {"output": [{"stdout": stdout, "stderr": "", "outcome": outcome}]}
        result["status"] = "completed"
        return self.item(call).item(result)

    def calls(self, *calls: tuple[str, str, Sequence[str]]) -> Response:
        """Function calls ``(call_id, name, argument fragments)``, all announced first,
        their fragments interleaved (one of each in turn), then each done."""
        first = len(self.output)
        items = []
        for k, (call_id, name, _) in enumerate(calls):
            item = {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id}
            item.update(name=name, arguments="", status="in_progress")
            self._add("response.output_item.added", output_index=first + k, item=item)
            items.append(item)
        for fragments in itertools.zip_longest(*(c[2] for c in calls)):
            for k, fragment in enumerate(fragments):
                if fragment is not None:
                    self._add(
                        "response.function_call_arguments.delta",
                        item_id=items[k]["id"],
                        output_index=first + k,
                        delta=fragment,
                    )
        for k, (_, _, fragments) in enumerate(calls):
            whole = dict(items[k], arguments="".join(fragments), status="completed")
            self._add("response.output_item.done", output_index=first + k, item=whole)
            self.output.append(whole)
        return self

    def mixed(
        self,
        steps: Sequence[str | tuple[int, str, bool]],
        calls: Sequence[tuple[str, str, str]],
    ) -> Response:
        """A message and function calls whose deltas arrive interleaved: ``steps`` in
        order, each a piece of the message's text (its item first in the output) or a
        call's fragment ``(k, fragment, first)`` (its item added at its first fragment);
        ``calls[k]`` is call ``k``'s ``(call_id, name, whole arguments)``. Every item is
        done after the last step."""
        first = len(self.output)
        mid = f"msg_{self.id}_{first}"
        added = {"type": "message", "id": mid, "role": "assistant", "status": "in_progress"}
        self._add("response.output_item.added", output_index=first, item=dict(added, content=[]))
        items: dict[int, dict[str, Any]] = {}
        text = []
        for step in steps:
            if isinstance(step, str):
                text.append(step)
                delta = {"item_id": mid, "output_index": first, "content_index": 0}
                self._add("response.output_text.delta", delta=step, logprobs=[], **delta)
                continue
            k, fragment, opens = step
            call_id, name, _ = calls[k]
            if opens:
                item = {"type": "function_call", "id": f"fc_{self.id}_{k}", "call_id": call_id}
                items[k] = dict(item, name=name, arguments="", status="in_progress")
                self._add("response.output_item.added", output_index=first + 1 + k, item=items[k])
            where = {"item_id": items[k]["id"], "output_index": first + 1 + k}
            self._add("response.function_call_arguments.delta", delta=fragment, **where)
        part = {"type": "output_text", "text": "".join(text), "annotations": []}
        item = dict(added, status="completed", content=[part])
        self._add("response.output_item.done", output_index=first, item=item)
        self.output.append(item)
        for k in range(len(calls)):
            whole = dict(items[k], arguments=calls[k][2], status="completed")
            self._add("response.output_item.done", output_index=first + 1 + k, item=whole)
            self.output.append(whole)
        return self

    def done(self) -> list[Any]:
        """The events, ended by ``response.completed``."""
        self._add("response.completed", response=self._response("completed", self.output))
        return self.events


def call(call_id: str, name: str, arguments: str, *, pieces: int = 2) -> tuple[str, str, list[str]]:
    """A function call whose arguments stream in ``pieces`` fragments."""
    size = max(1, -(-len(arguments) // pieces))
    return call_id, name, [arguments[i : i + size] for i in range(0, len(arguments), size)]
