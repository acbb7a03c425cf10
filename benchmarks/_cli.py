"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
import json
import pstats
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def parse_counts(value: str, *, minimum: int, what: str) -> list[int]:
    """A comma-separated list of integers, each at least ``minimum`` (an argparse type;
    ``what`` names them in the error)."""
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers") from None
    if not counts or min(counts) < minimum:
        raise argparse.ArgumentTypeError(f"{what} must be at least {minimum}")
    return counts


def parse_clients(value: str) -> list[int]:
    """``--clients``: concurrent client counts, each at least 1."""
    return parse_counts(value, minimum=1, what="client counts")


def print_profile(path: str, limit: int = 25) -> None:
    """Print the hottest functions of a server profile, on stderr so --json output stays
    parseable."""
    print(f"\nserver profile written to {path}; hottest functions by own time:", file=sys.stderr)
    stats = pstats.Stats(path, stream=sys.stderr)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(limit)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json [PATH]``: the figures as JSON, to PATH as a results file (the page's tables
    and charts are drawn from those, see charts.py), or to stdout alone without PATH."""
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write the figures as JSON to PATH, with the date, commit and command that "
        "produced them (a results file for charts.py); without PATH, print them instead "
        "of the table",
    )


def json_only(target: str | None) -> bool:
    """Whether ``--json`` asked for JSON on stdout in place of the printed table."""
    return target == "-"


def commit() -> str:
    """The commit the benchmarks run from (``git describe --always --dirty``), or
    ``unknown`` outside a git checkout."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() or "unknown"


def write_json(
    target: str, figures: Mapping[str, Any], script: str, argv: Sequence[str] | None = None
) -> None:
    """Write a benchmark's figures for ``--json``: to stdout for ``-``, else to the file
    ``target``, with the benchmark, the date, the commit and the command line (``argv``,
    by default the process's) beside them, keys a benchmark's figures must not use."""
    args = sys.argv[1:] if argv is None else list(argv)
    document: dict[str, Any] = {
        "benchmark": Path(script).name,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit(),
        "produced_by": shlex.join(["python", f"benchmarks/{Path(script).name}", *args]),
    }
    clash = set(document) & set(figures)
    if clash:
        raise ValueError(f"figures use the results file's own keys {sorted(clash)}")
    document.update(figures)
    if json_only(target):
        json.dump(document, sys.stdout, indent=2)
        print()
        return
    with open(target, "w") as out:
        json.dump(document, out, indent=2)
        out.write("\n")
    print(f"figures written to {target}")
