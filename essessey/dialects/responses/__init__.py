"""A turn as OpenAI Responses stream events, what the OpenAI Agents SDK and Codex read;
docs/dialects.md.

Each frame is ``event: <type>`` and ``data: {...}`` with the event's ``sequence_number``
(0, 1, 2, ... over the response). The mapping:

- the turn's first ``message_start``: ``response.created`` then ``response.in_progress``,
  the response ``in_progress`` with no output yet;
- a thinking block: a ``reasoning`` output item, ``response.reasoning_text.delta`` per
  delta and ``.done``; its signature (or a redacted block's data) is the item's
  ``encrypted_content``;
- a text block: a ``message`` output item with one ``output_text`` part:
  ``response.output_text.delta`` per delta, then ``.done``, the part's and the item's
  ``done``;
- a tool use: a ``function_call`` item, ``response.function_call_arguments.delta`` per
  fragment, then ``.done`` with the arguments whole;
- a tool result: a ``function_call_output`` item, added and done whole at its stop;
- any other block: one ``response.output_item.done`` of type ``essessey_block`` holding
  the block and its deltas, so nothing the turn carried is lost;
- the turn's end: ``response.completed`` with the whole response (output items and
  usage); ``response.incomplete`` for ``max_tokens`` (reason ``max_output_tokens``) and
  for a cancelled turn (status ``cancelled``); an ``error`` event becomes ``error`` then
  ``response.failed``;
- a turn that asks (docs/asking.md): an approval request is an ``mcp_approval_request``
  item and the call it gates is not written (a round's calls are held until its
  approvals are known), a question a ``function_call`` of ``ask_user``, a client call a
  ``function_call``; the response ends ``completed`` with the message that asks. A
  request with ``previous_response_id`` and ``function_call_output`` or
  ``mcp_approval_response`` items continues the turn as a new response
  (``responses_routes``).

Every output item of every model round is in one response, in order: ``output_index``
counts over the turn. Resume: by ``Last-Event-ID`` (the protocol's ids) or, as OpenAI
serves a background response, by ``starting_after`` a sequence number.
"""

from essessey._public import missing_extra, set_public_module
from essessey.dialects.responses._encoder import (
    APPROVAL_SERVER_LABEL,
    DEFAULT_MAX_BUFFER,
    ResponsesEncoder,
    error_object,
)

try:
    from essessey.dialects.responses._routes import (
        ResponsesRequest,
        ResponsesTurnFactory,
        answers_of,
        continuation_id,
        parse_responses_request,
        responses_routes,
        split_response_id,
    )
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None


__all__ = [
    "APPROVAL_SERVER_LABEL",
    "DEFAULT_MAX_BUFFER",
    "ResponsesEncoder",
    "ResponsesRequest",
    "ResponsesTurnFactory",
    "answers_of",
    "continuation_id",
    "error_object",
    "parse_responses_request",
    "responses_routes",
    "split_response_id",
]

set_public_module(__name__, globals(), __all__)
