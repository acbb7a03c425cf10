"""The ``essessey demo`` app: a page that runs a scripted agent turn and renders it live,
the endpoints behind it, and a fake Anthropic Messages API (see docs/demo.md).

:func:`create_app` builds the Starlette app and :func:`serve` runs it under uvicorn; both
need the ``server`` extra (Starlette, uvicorn), and a NATS URL needs the ``nats`` extra.
They import it on first use, so the script (:func:`scenario_script`) is available
without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from essessey._public import import_lazily, missing_extra, public_dir, set_public_module
from essessey.demo._scenario import (
    ASKING_SCENARIOS,
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
    from starlette.applications import Starlette

    from essessey.demo._app import serve as serve


def create_app(
    *,
    nats_url: str | None = None,
    redis_url: str | None = None,
    nats_stream: str = "ESSESSEY_DEMO",
    max_age: float = 3600.0,
    ping_interval: float = 15.0,
    cors_origins: Sequence[str] = (),
    store_mib: int = 256,
    metrics: bool = False,
) -> Starlette:
    """The demo as a Starlette app (the options: docs/demo.md); its lifespan runs the hub.

    A function of this module, not a name imported on first use: servers that take a
    factory (``hypercorn 'essessey.demo:create_app()'``, ``granian --factory``) look it up
    in the module's namespace. Starlette is imported when it is called."""
    try:
        from essessey.demo._app import create_app as build
    except ModuleNotFoundError as exc:  # the server extra is not installed
        raise missing_extra(f"{__name__}.create_app", exc, extra="server") from None

    return build(
        nats_url=nats_url,
        redis_url=redis_url,
        nats_stream=nats_stream,
        max_age=max_age,
        ping_interval=ping_interval,
        cors_origins=cors_origins,
        store_mib=store_mib,
        metrics=metrics,
    )


# What a test or a load tool needs to start a turn and check what it read (docs/demo.md,
# "As a load target"): the script of a turn, the producer the app runs, and the bounds of
# its options. The rest of the scenario (the weather tool, the model name) is the app's.
__all__ = [
    "ASKING_SCENARIOS",
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

_NEEDS_SERVER = {"serve": "_app"}


def __getattr__(name: str) -> Any:
    # Starlette and uvicorn (the ``server`` extra) are imported when the app is asked for.
    return import_lazily(__name__, _NEEDS_SERVER, name, extra="server")


def __dir__() -> list[str]:
    return public_dir(globals(), __all__)
