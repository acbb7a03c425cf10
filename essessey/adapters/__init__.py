"""Turn an LLM's stream into the protocol: one round, or an agent's many rounds.

:class:`RoundStream` owns the block indexes of an agent loop. The provider adapters
publish a provider's stream through it: :mod:`essessey.adapters.openai` (chat
completions chunks, as OpenAI, vLLM, Ollama, LiteLLM and OpenRouter send them) and
:mod:`essessey.adapters.anthropic` (Anthropic Messages stream events). Neither needs the
provider's SDK; both accept its objects as well as plain dicts.
"""

from essessey.adapters._message import PublishedMessage, PublishedToolCall
from essessey.adapters.rounds import (
    RoundStream,
    RoundSummary,
    ToolCallRequest,
    result_text,
    stream_rounds,
)
from essessey.errors import RoundOrderError

__all__ = [
    "PublishedMessage",
    "PublishedToolCall",
    "RoundOrderError",
    "RoundStream",
    "RoundSummary",
    "ToolCallRequest",
    "result_text",
    "stream_rounds",
]
