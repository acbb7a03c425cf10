"""A turn as OpenAI Chat Completions chunks, the stream every OpenAI-compatible client
reads (the ``openai`` SDKs, LangChain's ChatOpenAI, Open WebUI, LiteLLM); docs/dialects.md.

Each frame is ``data: {chat.completion.chunk}`` and the stream ends with
``data: [DONE]``. The mapping:

- the turn's first ``message_start``: the first chunk, ``delta.role`` ``assistant``;
- a text delta: ``delta.content``; a thinking delta: ``delta.reasoning_content`` (what
  vLLM, DeepSeek and LiteLLM write); a thinking signature has no field and is left out;
- a tool use: ``delta.tool_calls`` with its ``index`` (counted over the whole turn, so
  the calls of two rounds never merge), ``id``, ``function.name`` and the arguments that
  came, at the end of its round (a round's calls are held until its approvals are known:
  see below), then one chunk per argument fragment that comes later;
- the stop of a message that does not stop for a tool: ``finish_reason`` (``stop``,
  ``length``, ``tool_calls``, ``content_filter``); a turn that ends on a tool stop gets
  ``tool_calls`` at its end;
- usage, when asked for (``stream_options.include_usage``): one last chunk with empty
  ``choices`` and the turn's ``prompt_tokens`` and ``completion_tokens``;
- an ``error`` event: the in-band ``{"error": {...}}`` object OpenAI-compatible servers
  send, then ``[DONE]``;
- a turn that asks (docs/asking.md): a question is a tool call of ``ask_user``, an
  approval request one of ``approve_tool_call`` (the call it gates is not written: a
  round's calls are held until its approvals are known), a client call a tool call; the
  message that asks ends the completion (``finish_reason`` ``tool_calls``). A request
  whose ``tool`` messages answer them continues the turn (``chat_completions_routes``).

Left out, because Chat Completions has no place for them in the model's output: tool
results (a turn that runs tools and answers again reads as the rounds' output, one after
another), server tool blocks and any block type this module does not know (logged once
per block at debug level), citations.
"""

from essessey._public import missing_extra, set_public_module
from essessey.dialects.chat_completions._encoder import (
    APPROVAL_TOOL,
    DONE,
    FINISH_REASONS,
    MAX_HELD,
    ChatCompletionsEncoder,
    completion,
    error_object,
)

try:
    from essessey.dialects.chat_completions._routes import (
        ChatCompletionRequest,
        ChatTurnFactory,
        answering_messages,
        chat_completions_routes,
        parse_chat_completion_request,
        split_completion_id,
        tool_message_answers,
    )
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None


__all__ = [
    "APPROVAL_TOOL",
    "DONE",
    "FINISH_REASONS",
    "MAX_HELD",
    "ChatCompletionRequest",
    "ChatCompletionsEncoder",
    "ChatTurnFactory",
    "answering_messages",
    "chat_completions_routes",
    "completion",
    "error_object",
    "parse_chat_completion_request",
    "split_completion_id",
    "tool_message_answers",
]

set_public_module(__name__, globals(), __all__)
