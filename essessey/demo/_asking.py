"""What the demo runs when a client answers one of its turns that ask (the
``approval`` and ``client_tool`` scenarios of ``essessey.demo._scenario``; docs/asking.md):
the demo hub's ``on_answer``, on whichever replica takes the answer.

- after approvals: the approved ``get_weather`` calls run (their results land on the calls
  the first message made), and the answer reports the approved cities and says which
  lookups were declined;
- after ``get_location``'s output (``{"city": ...}``): ``get_weather`` for that city, then
  the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from essessey import Answered, Publisher
from essessey.adapters import ToolCallRequest, continue_rounds
from essessey.demo._scenario import LOCATION_TOOL, WEATHER, weather_report

__all__ = ["demo_continuation"]


async def demo_continuation(publisher: Publisher, answered: Answered) -> None:
    """What the demo runs when a client answers: the approved lookups and the answer, or
    the weather where the client said it is."""
    go_on: Callable[[Publisher, Answered], Awaitable[None]] = (
        _after_approvals if answered.approvals() else _after_location
    )
    await go_on(publisher, answered)


async def _after_approvals(publisher: Publisher, answered: Answered) -> None:
    async with continue_rounds(publisher, answered) as rounds:
        lines: list[str] = []
        for request, approval in answered.approvals():
            city = _city_of(request.input)
            if not approval.approved:
                why = f" ({approval.reason})" if approval.reason else ""
                lines.append(f"You declined the lookup for {city}{why}, so I did not check it.")
                continue
            report = weather_report(city)
            await rounds.earlier_result(request.tool_use_id, report)
            lines.append(_sentence(city))
        await rounds.round_start()
        await rounds.delta(text=" ".join(lines))
        await rounds.round_end()


async def _after_location(publisher: Publisher, answered: Answered) -> None:
    async with continue_rounds(publisher, answered) as rounds:
        city = None
        for call, output in answered.tool_outputs():
            if call.name == LOCATION_TOOL and not output.is_error:
                city = _city_of(_decoded(output.output))
        await rounds.round_start()
        if city is None or city not in WEATHER:
            await rounds.delta(
                text="I could not tell where you are, so I cannot look up your weather."
            )
            await rounds.round_end()
            return
        arguments = orjson.dumps({"city": city}).decode()
        lookup = ToolCallRequest(f"toolu_{answered.message_id}_weather", "get_weather")
        await rounds.tool_call_start(0, lookup)
        await rounds.tool_call_delta(0, arguments)
        await rounds.assistant_message([ToolCallRequest(lookup.id, lookup.name, arguments)])
        await rounds.tool_result(0, weather_report(city))
        await rounds.round_end()
        await rounds.round_start()
        await rounds.delta(text=f"You are in {city}. {_sentence(city)}")
        await rounds.round_end()


def _sentence(city: str) -> str:
    temperature, conditions = WEATHER[city]
    return f"{city} has {conditions} at {temperature} °C."


def _decoded(output: Any) -> Any:
    if isinstance(output, str):
        try:
            return orjson.loads(output)
        except orjson.JSONDecodeError:
            return output
    return output


def _city_of(value: Any) -> str:
    if isinstance(value, dict) and isinstance(value.get("city"), str):
        return str(value["city"])
    return str(value) if isinstance(value, str) else "?"
