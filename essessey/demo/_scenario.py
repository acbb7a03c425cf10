"""The demo's scripted agent turn: deterministic content, real concurrent tools.

A turn is one message of two rounds, published with :func:`~essessey.adapters.stream_rounds`:

1. reasoning, a line of text, then two ``get_weather`` calls whose arguments stream in
   fragments; the tools are async functions run at the same time, and the second city's
   answer comes first (its latency is shorter), so the round's results arrive out of
   order and :class:`~essessey.adapters.RoundStream` puts them back in call order;
2. the final answer, in exactly ``deltas`` text deltas.

Everything the stream carries is fixed by the scenario and ``deltas`` (only the message
and stream ids differ per turn), so :func:`scenario_script` tells a test, or a load tool,
exactly what a reader must end up with. ``delay_ms`` only paces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson

from essessey import Publisher, StopReason, TurnProducer
from essessey.adapters import ToolCallRequest, stream_rounds

__all__ = [
    "ASKING_SCENARIOS",
    "DEFAULT_DELAY_MS",
    "DEFAULT_DELTAS",
    "DEFAULT_SCENARIO",
    "LOCATION_TOOL",
    "MAX_DELAY_MS",
    "MAX_DELTAS",
    "MIN_DELTAS",
    "MODEL",
    "SCENARIOS",
    "THINKING",
    "WEATHER",
    "DemoScript",
    "ToolStep",
    "agent_turn",
    "get_weather",
    "location_call_id",
    "scenario_script",
    "weather_call_ids",
    "weather_report",
]

MODEL: Final = "essessey-demo-agent"
"""The model name the scripted turns report in ``message_start``."""

SCENARIOS: Final = ("agent", "tool_error", "approval", "client_tool")
"""``agent``: both tools succeed. ``tool_error``: the second city is unknown, so its tool
fails and its result block carries ``is_error``. ``approval`` and ``client_tool``: the turn
asks its client before it goes on (:data:`ASKING_SCENARIOS`)."""

ASKING_SCENARIOS: Final = ("approval", "client_tool")
"""The scenarios whose turn asks (docs/asking.md): ``approval`` calls ``get_weather`` for
Paris and Tokyo and asks to approve each call before it runs it; ``client_tool`` asks the
client for its location with ``get_location``, a tool only the client runs (it answers
``{"city": ...}``). The demo hub's ``on_answer`` goes on when the answer comes."""

LOCATION_TOOL: Final = "get_location"
"""The client-side tool of the ``client_tool`` scenario."""

DEFAULT_SCENARIO: Final = "agent"
MIN_DELTAS: Final = 1
MAX_DELTAS: Final = 100_000
"""Bounds of ``deltas``, the number of text deltas of the final answer."""
MAX_DELAY_MS: Final = 10_000
"""Upper bound of ``delay_ms``, the pause after every delta."""
DEFAULT_DELAY_MS: Final = 0

WEATHER: Final[Mapping[str, tuple[int, str]]] = {
    "Paris": (18, "light rain"),
    "Tokyo": (24, "clear skies"),
}
# Relative tool latencies: the first call's tool is the slowest, so results come back
# in the opposite order from the calls.
_LATENCY: Final[Mapping[str, int]] = {"Paris": 3, "Tokyo": 1, "Atlantis": 1}
_MIN_LATENCY: Final = 0.01  # seconds per latency unit when the turn is not paced

THINKING: Final = (
    "The user wants today's weather in Paris and Tokyo. ",
    "I have a get_weather tool that takes one city; ",
    "the two lookups do not depend on each other, ",
    "so I can call it twice in parallel ",
    "and compare the answers afterwards.",
)
_INTRO: Final = ("Let me check ", "the weather in both cities ", "at once.")

_ANSWERS: Final[Mapping[str, str]] = {
    "agent": (
        "Paris has light rain at 18 °C, so take an umbrella; Tokyo has clear skies at "
        "24 °C, a good day for a walk. Both lookups ran at the same time: Tokyo answered "
        "first, yet each result is shown under the call that asked for it, in the order "
        "the calls were made."
    ),
    "tool_error": (
        "Paris has light rain at 18 °C, so take an umbrella. I could not get the weather "
        "for Atlantis: the tool has no station there, and its failed result is marked as "
        "an error. Ask me about a city on the map and I will look it up."
    ),
}
_CITIES: Final[Mapping[str, tuple[str, str]]] = {
    "agent": ("Paris", "Tokyo"),
    "tool_error": ("Paris", "Atlantis"),
}


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call of the script: its id, tool name, arguments and the result the tool
    gives (``is_error`` when it fails)."""

    tool_use_id: str
    name: str
    arguments: Mapping[str, Any]
    result: str
    is_error: bool = False

    @property
    def arguments_json(self) -> str:
        """The arguments as the JSON text the call carries."""
        return orjson.dumps(dict(self.arguments)).decode()

    @property
    def fragments(self) -> tuple[str, str]:
        """The arguments in the two fragments they stream in (cut mid-token, as a model
        streams them)."""
        text = self.arguments_json
        cut = len(text) // 2
        return text[:cut], text[cut:]


@dataclass(frozen=True, slots=True)
class DemoScript:
    """What a scripted turn publishes, chunk by chunk.

    ``thinking`` and ``intro`` are round 1's reasoning and text deltas, ``tools`` its
    calls in call order, ``answer`` round 2's text deltas (``deltas`` of them).
    """

    scenario: str
    model: str
    thinking: tuple[str, ...]
    intro: tuple[str, ...]
    tools: tuple[ToolStep, ...]
    answer: tuple[str, ...]

    @property
    def thinking_text(self) -> str:
        """All the reasoning, as a reader reassembles it."""
        return "".join(self.thinking)

    @property
    def intro_text(self) -> str:
        """Round 1's text."""
        return "".join(self.intro)

    @property
    def final_text(self) -> str:
        """The final answer (round 2's text)."""
        return "".join(self.answer)

    @property
    def text(self) -> str:
        """All the text of the message (both rounds), as ``reassemble`` concatenates it."""
        return self.intro_text + self.final_text

    @property
    def output_tokens(self) -> int:
        """The ``output_tokens`` the turn reports: one per delta of model output."""
        fragments = sum(len(tool.fragments) for tool in self.tools)
        return len(self.thinking) + len(self.intro) + fragments + len(self.answer)


def weather_report(city: str) -> str:
    """The weather tool's answer for ``city`` as JSON text; LookupError for a city it has
    no station in."""
    known = WEATHER.get(city)
    if known is None:
        raise LookupError(f"no weather station in {city}")
    temperature, conditions = known
    return orjson.dumps(
        {"city": city, "temperature_c": temperature, "conditions": conditions}
    ).decode()


def _error_text(exc: Exception) -> str:
    return f"error: {exc}"


async def get_weather(city: str, *, latency: float = 0.0) -> str:
    """The demo's tool: waits ``latency`` seconds (a remote call), then answers as
    :func:`weather_report` does."""
    await anyio.sleep(latency)
    return weather_report(city)


def _split(pieces: list[str], deltas: int) -> tuple[str, ...]:
    """``pieces`` in ``deltas`` chunks: grouped evenly when there are fewer deltas than
    pieces (the answer stays whole), cycled when there are more (a longer answer for a
    load test, one word per delta, the paragraph repeated)."""
    if deltas <= len(pieces):
        size, extra = divmod(len(pieces), deltas)
        chunks: list[str] = []
        at = 0
        for k in range(deltas):
            n = size + (1 if k < extra else 0)
            chunks.append("".join(pieces[at : at + n]))
            at += n
        return tuple(chunks)
    last = len(pieces) - 1
    cycled = []
    for k in range(deltas):
        piece = pieces[k % len(pieces)]
        if k % len(pieces) == last and k != deltas - 1:
            piece += "\n\n"
        cycled.append(piece)
    return tuple(cycled)


def _pieces(paragraph: str) -> list[str]:
    words = paragraph.split(" ")
    return [word + " " for word in words[:-1]] + [words[-1]]


DEFAULT_DELTAS: Final = len(_pieces(_ANSWERS["agent"]))
"""The default ``deltas``: one word per delta, the answer said once."""


def scenario_script(deltas: int = DEFAULT_DELTAS, scenario: str = DEFAULT_SCENARIO) -> DemoScript:
    """The script of ``scenario`` with a final answer of ``deltas`` text deltas.

    Raises ValueError for an unknown scenario or ``deltas`` outside
    ``MIN_DELTAS..MAX_DELTAS``.
    """
    if scenario not in _CITIES:
        known = ", ".join(_CITIES)
        raise ValueError(f"no script for scenario {scenario!r}; scripted: {known}")
    if not MIN_DELTAS <= deltas <= MAX_DELTAS:
        raise ValueError(f"deltas must be between {MIN_DELTAS} and {MAX_DELTAS}")
    tools = []
    for n, city in enumerate(_CITIES[scenario], start=1):
        try:
            result, is_error = weather_report(city), False
        except LookupError as exc:
            result, is_error = _error_text(exc), True
        tools.append(
            ToolStep(f"toolu_demo_{n:02d}", "get_weather", {"city": city}, result, is_error)
        )
    return DemoScript(
        scenario=scenario,
        model=MODEL,
        thinking=THINKING,
        intro=_INTRO,
        tools=tuple(tools),
        answer=_split(_pieces(_ANSWERS[scenario]), deltas),
    )


def agent_turn(
    stream_id: str,
    *,
    scenario: str = DEFAULT_SCENARIO,
    deltas: int = DEFAULT_DELTAS,
    delay_ms: int = DEFAULT_DELAY_MS,
) -> TurnProducer:
    """The producer of one scripted turn on ``stream_id``, for :meth:`StreamHub.start`:
    :func:`scenario_script` published in two rounds, pausing ``delay_ms`` after every
    delta. Raises ValueError for bad parameters (before anything runs). The scenarios
    that ask (:data:`ASKING_SCENARIOS`) have no final answer here: ``deltas`` does not
    apply to them."""
    if scenario in ASKING_SCENARIOS:
        if not 0 <= delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be between 0 and {MAX_DELAY_MS}")
        return _asking_turn(stream_id, scenario, delay_ms / 1000)
    script = scenario_script(deltas, scenario)
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        raise ValueError(f"delay_ms must be between 0 and {MAX_DELAY_MS}")
    delay = delay_ms / 1000
    unit = max(4 * delay, _MIN_LATENCY)

    async def pause() -> None:
        # sleep(0) still yields: an unpaced turn of 100k deltas must not hold the loop.
        await anyio.sleep(delay)

    async def produce(publisher: Publisher) -> None:
        async with stream_rounds(
            publisher,
            message_id=f"msg_{stream_id}",
            stream_id=stream_id,
            model=script.model,
            input_tokens=42,
        ) as rounds:
            await rounds.round_start()
            for chunk in script.thinking:
                await rounds.delta(reasoning=chunk)
                await pause()
            for chunk in script.intro:
                await rounds.delta(text=chunk)
                await pause()
            calls = []
            for i, step in enumerate(script.tools):
                await rounds.tool_call_start(i, ToolCallRequest(step.tool_use_id, step.name))
                for fragment in step.fragments:
                    await rounds.tool_call_delta(i, fragment)
                    await pause()
                calls.append(ToolCallRequest(step.tool_use_id, step.name, step.arguments_json))
            await rounds.assistant_message(calls)

            async def run_tool(i: int, city: str) -> None:
                try:
                    result = await get_weather(city, latency=_LATENCY.get(city, 1) * unit)
                except LookupError as exc:
                    await rounds.tool_result(i, _error_text(exc), is_error=True)
                else:
                    await rounds.tool_result(i, result)

            async with anyio.create_task_group() as tools:
                for i, step in enumerate(script.tools):
                    tools.start_soon(run_tool, i, str(step.arguments["city"]))
            await rounds.round_end()

            await rounds.round_start()
            for chunk in script.answer:
                await rounds.delta(text=chunk)
                await pause()
            await rounds.round_end()
            rounds.output_tokens = script.output_tokens

    return produce


_APPROVAL_REASON: Final = "looks up the weather with an outside service"
_ASKING_INTRO: Final = "I will look up the weather in Paris and Tokyo once you approve each lookup."
_LOCATION_INTRO: Final = "To tell you the weather where you are, I need your location."


def weather_call_ids(stream_id: str) -> tuple[str, ...]:
    """The ids of the ``approval`` scenario's ``get_weather`` calls on ``stream_id``."""
    return tuple(f"toolu_{stream_id}_{n}" for n in range(1, len(_CITIES["agent"]) + 1))


def location_call_id(stream_id: str) -> str:
    """The id of the ``client_tool`` scenario's ``get_location`` call on ``stream_id``."""
    return f"toolu_{stream_id}_location"


def _asking_turn(stream_id: str, scenario: str, delay: float) -> TurnProducer:
    async def produce(publisher: Publisher) -> None:
        async with stream_rounds(
            publisher,
            message_id=f"msg_{stream_id}",
            stream_id=stream_id,
            model=MODEL,
            input_tokens=42,
        ) as rounds:
            await rounds.round_start()
            if scenario == "approval":
                for chunk in THINKING:
                    await rounds.delta(reasoning=chunk)
                    await anyio.sleep(delay)
                await rounds.delta(text=_ASKING_INTRO)
                ids = weather_call_ids(stream_id)
                for i, (call_id, city) in enumerate(zip(ids, _CITIES["agent"], strict=True)):
                    await rounds.tool_call_start(i, ToolCallRequest(call_id, "get_weather"))
                    await rounds.tool_call_delta(i, orjson.dumps({"city": city}).decode())
                    await anyio.sleep(delay)
                await rounds.round_end(answer_missing=False)
                for call_id in ids:
                    await rounds.ask_approval(call_id, reason=_APPROVAL_REASON)
            else:
                await rounds.delta(text=_LOCATION_INTRO)
                await anyio.sleep(delay)
                call = ToolCallRequest(location_call_id(stream_id), LOCATION_TOOL, "{}")
                await rounds.tool_call_start(0, call)
                await rounds.round_end(answer_missing=False)
                rounds.stop_reason = StopReason.TOOL_USE

    return produce
