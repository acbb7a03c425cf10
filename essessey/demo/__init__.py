"""The ``essessey demo`` app: a page that runs a scripted agent turn and renders it live,
the endpoints behind it, and a fake Anthropic Messages API (see docs/demo.md).

:func:`create_app` builds the Starlette app and :func:`serve` runs it under uvicorn; both
need the ``server`` extra (Starlette, uvicorn), and a NATS URL needs the ``nats`` extra.
They are imported on first use, so the script (:func:`scenario_script`) is available
without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from essessey._public import import_lazily, public_dir, set_public_module
from essessey.demo._scenario import (
    DEFAULT_DELTAS,
    MAX_DELAY_MS,
    MAX_DELTAS,
    SCENARIOS,
    DemoScript,
    ToolStep,
    agent_turn,
    scenario_script,
)

if TYPE_CHECKING:
    from essessey.demo._app import create_app as create_app
    from essessey.demo._app import serve as serve

# What a test or a load tool needs to start a turn and check what it read (docs/demo.md,
# "As a load target"): the script of a turn, the producer the app runs, and the bounds of
# its options. The rest of the scenario (the weather tool, the model name) is the app's.
__all__ = [
    "DEFAULT_DELTAS",
    "MAX_DELAY_MS",
    "MAX_DELTAS",
    "SCENARIOS",
    "DemoScript",
    "ToolStep",
    "agent_turn",
    "create_app",
    "scenario_script",
    "serve",
]

set_public_module(__name__, globals(), __all__)

_NEEDS_SERVER = {"create_app": "_app", "serve": "_app"}


def __getattr__(name: str) -> Any:
    # Starlette and uvicorn (the ``server`` extra) are imported when the app is asked for.
    return import_lazily(__name__, _NEEDS_SERVER, name, extra="server")


def __dir__() -> list[str]:
    return public_dir(globals(), __all__)
