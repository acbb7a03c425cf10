"""The framework benchmarks' command line (bench_pydantic_ai.py, bench_openai_agents.py,
bench_langgraph.py): the options of a turn, the models a run measures, and the report.

Each benchmark measures the same paths (``_sidebyside.py``) once per model: a scripted one,
or ``wire``, the framework on the OpenAI client streaming from ``_model_server.py``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from _cli import add_json_option, json_only, write_json
from _model_server import model_server
from _sidebyside import SidePath, compare, print_rows

MODELS = ("parsed", "replayed", "wire")
"""The ways bench_openai_agents.py and bench_langgraph.py give their framework a model
(their ``--models``; bench_pydantic_ai.py has its own)."""

Rows = list[dict[str, Any]]
Script = Callable[[int, int], dict[str, Any]]
"""The model server's script of a turn of ``rounds`` requests of ``deltas`` text deltas."""
Measure = Callable[[argparse.Namespace, str, "str | None"], Awaitable[Rows]]
"""The paths' rows on a model (``url``: the model server's, for ``wire``)."""


def parse_models(value: str, models: Sequence[str] = MODELS) -> list[str]:
    """``--models``: some of ``models`` (by default MODELS), comma-separated (an argparse
    type)."""
    picked = [part.strip() for part in value.split(",") if part.strip()]
    if not picked or not set(picked) <= set(models):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(models)}, comma-separated")
    return list(dict.fromkeys(picked))


def turn_parser(
    doc: str, *, rounds: str, deltas: str, models: Sequence[str] = MODELS
) -> argparse.ArgumentParser:
    """The options every framework benchmark takes (``rounds`` and ``deltas`` name the
    framework's requests and deltas in their help); add a benchmark's own to it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="runs per path (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help=f"{rounds} per run")
    parser.add_argument("--deltas", type=int, default=40, help=f"{deltas} per request")
    parser.add_argument("--batch", type=int, default=10, help="turns per batch (default 10)")
    parser.add_argument(
        "--models",
        type=lambda value: parse_models(value, models),
        default=list(models),
        help=f"the models' ways to measure, comma-separated (default {','.join(models)})",
    )
    add_json_option(parser)
    return parser


def turn_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The command line's options, each count at least 1."""
    args = parser.parse_args()
    if min(args.turns, args.rounds, args.deltas, args.batch) < 1:
        parser.error("--turns, --rounds, --deltas and --batch must be at least 1")
    return args


def run_models(
    args: argparse.Namespace,
    script: Script,
    measure: Measure,
    *,
    benchmark: str,
    title: str,
    **settings: Any,
) -> None:
    """Measure every model of ``args.models``, each in an event loop of its own (for
    ``wire``, with the model server on ``script`` running beside it); then the figures
    for ``--json`` (``benchmark``: the script's file; ``settings`` beside the counts), and
    a table per model under ``title``."""
    figures: dict[str, Any] = {"turns": args.turns, "rounds": args.rounds, "deltas": args.deltas}
    figures.update(settings)
    for model in args.models:
        figures[model] = _run_on(model, args, script, measure)
    if args.json is not None:
        write_json(args.json, figures, benchmark)
        if json_only(args.json):
            return
    for model in args.models:
        print_rows(f"{model}: {title}", figures[model])


async def compare_closing(
    paths: Sequence[SidePath], args: argparse.Namespace, client: Any = None
) -> Rows:
    """The paths' rows (``compare`` with the turns and batch of ``args``), then ``client``
    closed (the wire model's OpenAI client, None for the others) in this loop, where its
    connections belong."""
    try:
        return await compare(paths, turns=args.turns, batch=args.batch)
    finally:
        if client is not None:
            await client.close()


def _run_on(model: str, args: argparse.Namespace, script: Script, measure: Measure) -> Rows:
    if model != "wire":
        return asyncio.run(measure(args, model, None))
    with model_server(script(args.rounds, args.deltas)) as url:
        return asyncio.run(measure(args, model, url))
