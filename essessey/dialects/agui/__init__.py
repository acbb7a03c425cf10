"""A turn as AG-UI events, what CopilotKit, TanStack AI and ``@ag-ui/client`` read;
docs/dialects.md.

Each frame is ``data: {event}``, camelCase JSON as the AG-UI SDKs write it, without the
fields that are unset, and with the protocol event's ``id:``, so a client that dropped
resumes (AG-UI's own encoder writes no ids). The mapping:

- the turn's first ``message_start``: ``RUN_STARTED``; each model round:
  ``STEP_STARTED`` ... ``STEP_FINISHED``. A round is a protocol message, or, in a message
  that holds several (``stream_rounds``), what comes up to its tool results: a block
  after a round's results starts the next step. A message's last ``STEP_FINISHED``
  carries its ``message_delta`` (stop reason, usage) as ``rawEvent``, as the protocol
  sent it;
- a text block: ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END`` (role ``assistant``);
- a thinking block: ``REASONING_START``, ``REASONING_MESSAGE_START`` / ``_CONTENT`` /
  ``_END``, its signature as ``REASONING_ENCRYPTED_VALUE``, ``REASONING_END``; a
  redacted thinking block: its data as ``REASONING_ENCRYPTED_VALUE`` alone;
- a tool use: ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``; a tool result:
  ``TOOL_CALL_RESULT`` at its stop, its start (``is_error`` with it) as ``rawEvent``;
- a text block's citation: a ``CUSTOM`` event ``essessey-citation`` with the message's
  id and the citation;
- any other block (a server tool's, a type this module does not know): a ``CUSTOM``
  event ``essessey-block`` at its stop, with the block and its deltas;
- the turn's end: ``RUN_FINISHED`` with the turn's usage; an ``error`` event, or a
  cancelled turn, ``RUN_ERROR`` (code: the error's type, or ``CANCELLED``);
- a message that asks (docs/asking.md) ends the run: its approval requests and
  questions are ``RUN_FINISHED``'s ``outcome`` ``{"type": "interrupt", "interrupts":
  [...]}``, its client calls (tool calls without a result) ``pendingToolCallIds`` of a
  ``success`` outcome. A run whose ``resume`` (or ``tool`` messages) answers them is the
  continuation of the turn (:func:`agui_routes`, :func:`resume_answers`).
"""

from essessey._public import missing_extra, set_public_module
from essessey.dialects.agui._encoder import (
    APPROVAL_REASON,
    APPROVAL_SCHEMA,
    BLOCK_EVENT,
    CITATION_EVENT,
    DEFAULT_MAX_BUFFER,
    QUESTION_REASON,
    AGUIEncoder,
    error_object,
    run_stream_id,
)

try:
    from essessey.dialects.agui._routes import (
        AGUIRunRequest,
        AGUITurnFactory,
        ResumeEntry,
        agui_routes,
        answering_tool_messages,
        parse_resume,
        parse_run_agent_input,
        resume_answers,
    )
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None


__all__ = [
    "APPROVAL_REASON",
    "APPROVAL_SCHEMA",
    "BLOCK_EVENT",
    "CITATION_EVENT",
    "DEFAULT_MAX_BUFFER",
    "QUESTION_REASON",
    "AGUIEncoder",
    "AGUIRunRequest",
    "AGUITurnFactory",
    "ResumeEntry",
    "agui_routes",
    "answering_tool_messages",
    "error_object",
    "parse_resume",
    "parse_run_agent_input",
    "resume_answers",
    "run_stream_id",
]

set_public_module(__name__, globals(), __all__)
