"""The approval of a tool call, asked from inside a LangGraph graph (an ``interrupt()``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from langgraph.types import interrupt

__all__ = ["APPROVAL", "Approval", "approval_call", "request_approval"]

logger = logging.getLogger("essessey.adapters.langgraph")

APPROVAL: Final = "tool_approval"
"""The ``"type"`` of the interrupt value :func:`request_approval` sends."""


# -- approvals from inside the graph ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Approval:
    """The answer :func:`request_approval` returns: approved or not, and the reason the
    person who decided gave (None when none)."""

    approved: bool
    reason: str | None = None


def request_approval(tool_call_id: str, *, reason: str | None = None) -> Approval:
    """Ask to approve the tool call ``tool_call_id`` before it runs, from inside a node
    or a tool (``interrupt()`` underneath: the graph needs a checkpointer).

    The run stops; its message asks the approval of that call (an ``approval_request``
    naming its tool_use block), which every dialect shows as its own approval. When the
    answer comes, the node runs again from its start and this returns the decision. Call
    it from a tool with the id LangGraph injects (``runtime: ToolRuntime`` and
    ``runtime.tool_call_id``, or an ``InjectedToolCallId`` argument), or from a review
    node between the model and the tools, once per call of the last ``AIMessage``.
    """
    value: dict[str, Any] = {"type": APPROVAL, "tool_call_id": tool_call_id}
    if reason is not None:
        value["reason"] = reason
    answer = interrupt(value)
    if isinstance(answer, bool):
        return Approval(answer)
    if isinstance(answer, Mapping):
        given = answer.get("reason")
        return Approval(answer.get("approved") is True, given if isinstance(given, str) else None)
    logger.warning("an approval resumed with a %s; taken as denied", type(answer).__name__)
    return Approval(False)


def approval_call(value: object) -> str | None:
    """The call an interrupt's value asks to approve, when it is :func:`request_approval`'s."""
    if isinstance(value, Mapping) and value.get("type") == APPROVAL:
        call = value.get("tool_call_id")
        if isinstance(call, str) and call:
            return call
    return None
