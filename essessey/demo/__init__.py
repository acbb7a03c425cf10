"""The ``essessey demo`` app: a page that runs a scripted agent turn and renders it live,
the endpoints behind it, and a fake Anthropic Messages API (see docs/demo.md).

:func:`create_app` builds the Starlette app and :func:`serve` runs it under uvicorn; both
need the ``server`` extra (Starlette, uvicorn), and a NATS URL needs the ``nats`` extra.
They are imported on first use, so the script (:func:`scenario_script`) is available
without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from essessey.demo._scenario import (
    DEFAULT_DELAY_MS,
    DEFAULT_DELTAS,
    DEFAULT_SCENARIO,
    MAX_DELAY_MS,
    MAX_DELTAS,
    MIN_DELTAS,
    MODEL,
    SCENARIOS,
    DemoScript,
    ToolStep,
    agent_turn,
    get_weather,
    scenario_script,
    weather_report,
)

__all__ = [
    "DEFAULT_DELAY_MS",
    "DEFAULT_DELTAS",
    "DEFAULT_SCENARIO",
    "MAX_DELAY_MS",
    "MAX_DELTAS",
    "MIN_DELTAS",
    "MODEL",
    "SCENARIOS",
    "DemoScript",
    "ToolStep",
    "agent_turn",
    "create_app",
    "get_weather",
    "scenario_script",
    "serve",
    "weather_report",
]

if TYPE_CHECKING:
    from essessey.demo._app import create_app as create_app
    from essessey.demo._app import serve as serve

_NEEDS_SERVER = {"create_app": "_app", "serve": "_app"}


def __getattr__(name: str) -> Any:
    # Starlette and uvicorn (the ``server`` extra) are imported when the app is asked for.
    module = _NEEDS_SERVER.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
