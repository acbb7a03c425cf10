"""Turn an LLM's stream into the protocol: one round, or an agent's many rounds.

:class:`RoundStream` runs the rounds of an agent loop in one message, on the streamers'
one owner of block indexes. The provider adapters publish a provider's stream through
it: :mod:`essessey.adapters.openai` (chat completions chunks, as OpenAI, vLLM, Ollama,
LiteLLM, OpenRouter, Groq and Mistral send them), :mod:`essessey.adapters.openai_responses`
(the OpenAI Responses API's typed events) and :mod:`essessey.adapters.anthropic`
(Anthropic Messages stream events). None needs the provider's SDK; each accepts its
objects as well as plain dicts.

Agents written on a framework publish through :mod:`essessey.adapters.pydantic_ai`,
:mod:`essessey.adapters.openai_agents` and :mod:`essessey.adapters.langgraph` (each in an
extra of its own), which keep a run that stops to ask in :class:`RunStates`.
"""

from essessey._public import set_public_module
from essessey.adapters._message import PublishedMessage, PublishedToolCall
from essessey.adapters._run_state import MAX_STATE_BYTES, RunStates
from essessey.adapters.rounds import (
    RoundStream,
    RoundSummary,
    ToolCallRequest,
    continue_rounds,
    result_text,
    stream_rounds,
)

__all__ = [
    "MAX_STATE_BYTES",
    "PublishedMessage",
    "PublishedToolCall",
    "RoundStream",
    "RoundSummary",
    "RunStates",
    "ToolCallRequest",
    "continue_rounds",
    "result_text",
    "stream_rounds",
]

set_public_module(__name__, globals(), __all__)
