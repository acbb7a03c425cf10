"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
import pstats
import sys


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
