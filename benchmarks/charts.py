"""The tables and charts of benchmarks/README.md, drawn from the results files.

    python benchmarks/charts.py           # rewrite the page's tables and docs/img/*.svg
    python benchmarks/charts.py --check   # exit 1 if the page or a chart is out of date

Every figure comes from ``benchmarks/results/``:

- ``paced-*.json``: one file per run of ``bench_paced.py --json PATH``. Each variant's
  server CPU per delta on each server flavour is the median of the run's rounds; a table
  cell is the range over the runs. Runs made with the sweep also give the capacity.
- ``burst-*.json``: one file per run of ``bench_sse_e2e.py --json PATH``, if any; and
  ``burst.json``, the ranges of earlier sets of runs whose per-run figures were not kept.
- ``capacity.json``: the capacity of earlier sweeps, run by run, as HISTORY.md records them.
- ``recorded.json``: the other benchmarks' latest figures as recorded (ranges, the number
  of runs, the date and where they are written down).

The page's generated parts sit between ``<!-- charts.py: NAME -->`` and
``<!-- charts.py: end -->``; the rest of the page is prose. The SVG is written by hand:
no plotting library to install.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "benchmarks" / "README.md"
IMAGES = ROOT / "docs" / "img"

FLAVOURS = {
    "h11": ("h11", "#4c78a8"),
    "standard": ("httptools+uvloop", "#f58518"),
    "hypercorn": ("hypercorn", "#54a24b"),
    "granian": ("granian", "#b279a2"),
}


def flavours_of(found: Iterable[str]) -> list[str]:
    """The server flavours found, the known ones in their order, then any other."""
    present = list(found)
    return [f for f in FLAVOURS if f in present] + sorted(set(present) - set(FLAVOURS))


def flavour_style(flavour: str) -> tuple[str, str]:
    """A flavour's name on the page and its colour in the charts."""
    return FLAVOURS.get(flavour, (flavour, "#9d755d"))


LABELS = {
    "raw-sse": "raw ASGI",
    "sse-starlette": "sse-starlette",
    "fastapi-sse": "FastAPI SSE",
    "essessey-sse": "essessey direct",
    "essessey-hub-sse": "essessey hub",
    "essessey-hub-ui": "hub, UI message stream",
    "essessey-hub-agui": "hub, AG-UI",
    "essessey-hub-chat": "hub, Chat Completions",
    "essessey-hub-responses": "hub, Responses",
    "essessey-hub-ws": "hub, WebSocket",
    "raw-ws": "raw ASGI WebSocket",
}
SHORT = {"essessey-hub-chat": "hub, Chat Compl.", "essessey-hub-ui": "hub, UI stream"}
DIALECTS = ("essessey-hub-ui", "essessey-hub-agui", "essessey-hub-chat", "essessey-hub-responses")
RAW, DIRECT, HUB = "raw-sse", "essessey-sse", "essessey-hub-sse"
# issue 34's targets: direct and hub as multiples of raw ASGI, per flavour; a dialect as a
# multiple of the hub's SSE; the hub's p99 within raw's p99 plus this many ms.
DIRECT_TARGET = {"h11": 1.1, "standard": 1.15}
HUB_TARGET = 1.3
DIALECT_TARGET = 1.3
P99_MARGIN_MS = 10.0
BURST_TARGET = 5.0
COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756")

# The at-a-glance table: what each benchmark measures and against what; the figures come
# from the results files.
GLANCE = {
    "bench_paced.py": (
        "server CPU per event, 500 streams at a delta every 20 ms",
        "raw ASGI, sse-starlette",
    ),
    "bench_paced.py (sweep)": (
        "streams one server keeps at 50 deltas/s with p99 under 50 ms",
        "raw ASGI, sse-starlette",
    ),
    "bench_sse_e2e.py": ("events per second in a burst", "sse-starlette, raw ASGI"),
}


# -- reading --------------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    """One results file."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def span(values: Iterable[float], digits: int, suffix: str = "") -> str:
    """``low-high`` at ``digits`` decimals (one figure when they print alike)."""
    found = list(values)
    low, high = f"{min(found):.{digits}f}", f"{max(found):.{digits}f}"
    return f"{low}{suffix}" if low == high else f"{low}-{high}{suffix}"


def paced_runs(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, dict[str, float]]]]:
    """{flavour: [per run {variant: {"us", "p99", "rounds_p99": [...]}}]}: each figure the
    median of the run's rounds."""
    found: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for run in runs:
        for flavour in run["flavours"]:
            rounds: dict[str, list[dict[str, Any]]] = {}
            for row in flavour["rounds"]:
                rounds.setdefault(row["variant"], []).append(row)
            found.setdefault(flavour["flavour"], []).append(
                {
                    variant: {
                        "us": statistics.median(r["server_cpu_us_per_delta"] for r in rows),
                        "p99": statistics.median(r["p99_ms"] for r in rows),
                        "rounds_p99": [r["p99_ms"] for r in rows],
                        "lost": sum(r["lost"] + r["failed_connections"] for r in rows),
                    }
                    for variant, rows in rounds.items()
                }
            )
    return found


def ratio(run: dict[str, dict[str, Any]], variant: str, base: str) -> float | None:
    """A variant's CPU per delta over another's in the same run, if both ran."""
    if variant not in run or base not in run:
        return None
    value: float = run[variant]["us"] / run[base]["us"]
    return value


def ratios(runs: list[dict[str, dict[str, Any]]], variant: str, base: str) -> list[float]:
    """``ratio`` over the runs that have both."""
    return [r for r in (ratio(run, variant, base) for run in runs) if r is not None]


def capacity_sets(recorded: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sets of capacity runs ({label, date, source, flavour, runs: [{variant: streams}]}):
    the sweeps in the paced results files first (one set per flavour), then the recorded."""
    sets: list[dict[str, Any]] = []
    swept: dict[str, list[dict[str, int]]] = {}
    dates: set[str] = set()
    for run in runs:
        for flavour in run["flavours"]:
            if flavour.get("sweep"):
                dates.add(run.get("date", "?"))
                swept.setdefault(flavour["flavour"], []).append(
                    {row["variant"]: row["max_streams_ok"] or 0 for row in flavour["sweep"]}
                )
    for flavour, found in swept.items():
        sets.append(
            {
                "label": f"the paced results files, {flavour_style(flavour)[0]}",
                "date": ", ".join(sorted(dates)),
                "source": "benchmarks/results/paced-*.json",
                "flavour": flavour,
                "runs": found,
            }
        )
    sets.extend(recorded.get("sets", []))
    return sets


def burst_sets(recorded: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sets of burst runs ({label, runs, clients: {count: [low, high]}}): the per-run
    results files first, as one set, then the recorded ranges."""
    sets: list[dict[str, Any]] = []
    if runs:
        per_clients: dict[str, list[float]] = {}
        for run in runs:
            for target in run["targets"]:
                if target["versus"] == "sse-starlette":
                    per_clients.setdefault(str(target["clients"]), []).append(target["ratio"])
        sets.append(
            {
                "label": "the burst results files",
                "date": ", ".join(sorted({run.get("date", "?") for run in runs})),
                "source": "benchmarks/results/burst-*.json",
                "runs": len(runs),
                "clients": {k: [min(v), max(v)] for k, v in per_clients.items()},
            }
        )
    sets.extend(recorded.get("sets", []))
    return sets


# -- tables ---------------------------------------------------------------------------------


def paced_table(found: dict[str, list[dict[str, dict[str, Any]]]]) -> list[str]:
    """Per variant and flavour: us per delta, x raw, x hub and p99, ranges over the runs."""
    flavours = flavours_of(found)
    head = "| variant |" + "".join(
        f" {flavour_style(f)[0]}: us/delta | x raw | x hub | p99 ms |" for f in flavours
    )
    lines = [head, "|---|" + "---|---|---|---|" * len(flavours)]
    for variant, label in LABELS.items():
        if variant in ("essessey-hub-ws", "raw-ws"):
            continue
        if not any(variant in run for f in flavours for run in found[f]):
            continue
        cells = []
        for flavour in flavours:
            runs = [run for run in found[flavour] if variant in run]
            if not runs:
                cells.append(" - | - | - | - |")
                continue
            raw = "1.00" if variant == RAW else span(ratios(runs, variant, RAW), 2)
            hub = "-" if variant == RAW else span(ratios(runs, variant, HUB), 2)
            hub = "1.00" if variant == HUB else hub
            cells.append(
                f" {span((r[variant]['us'] for r in runs), 1)} | {raw} | {hub} | "
                f"{span((r[variant]['p99'] for r in runs), 1)} |"
            )
        lines.append(f"| {label} |" + "".join(cells))
    lost = sum(v["lost"] for f in flavours for run in found[f] for v in run.values())
    lines.append("")
    lines.append(f"Deltas lost or connections failed in these runs: {lost}.")
    return lines


def met(count: int, total: int) -> str:
    """``met`` or how many runs missed."""
    return "met" if count == total else f"missed in {total - count} of {total}"


def paced_targets(found: dict[str, list[dict[str, dict[str, Any]]]]) -> list[str]:
    """issue 34's paced targets, per flavour: the range over the runs and the verdict."""
    flavours = [f for f in flavours_of(found) if f in DIRECT_TARGET]
    lines = [
        "| target |" + "".join(f" {flavour_style(f)[0]} |" for f in flavours),
        "|---|" + "---|" * len(flavours),
    ]
    rows: list[tuple[str, Callable[[str], str]]] = []

    def limit(variant: str, base: str, bound: Callable[[str], float]) -> Callable[[str], str]:
        def cell(flavour: str) -> str:
            found_ratios = ratios(found[flavour], variant, base)
            if not found_ratios:
                return "-"
            kept = sum(r <= bound(flavour) for r in found_ratios)
            return f"{span(found_ratios, 2, 'x')} ({met(kept, len(found_ratios))})"

        return cell

    def p99(flavour: str) -> str:
        runs = [run for run in found[flavour] if RAW in run and HUB in run]
        kept = sum(
            all(
                hub <= raw + P99_MARGIN_MS
                for hub, raw in zip(run[HUB]["rounds_p99"], run[RAW]["rounds_p99"], strict=False)
            )
            for run in runs
        )
        return met(kept, len(runs)) if runs else "-"

    def dialects(flavour: str) -> str:
        worst = [
            max(r for r in (ratio(run, d, HUB) for d in DIALECTS) if r is not None)
            for run in found[flavour]
            if any(d in run for d in DIALECTS) and HUB in run
        ]
        if not worst:
            return "-"
        kept = sum(w <= DIALECT_TARGET for w in worst)
        return f"worst {span(worst, 2, 'x')} ({met(kept, len(worst))})"

    rows.append(
        (
            "direct <= 1.1x raw (h11), 1.15x (httptools+uvloop)",
            limit(DIRECT, RAW, lambda f: DIRECT_TARGET[f]),
        )
    )
    rows.append((f"hub <= {HUB_TARGET}x raw", limit(HUB, RAW, lambda f: HUB_TARGET)))
    rows.append((f"hub p99 <= raw p99 + {P99_MARGIN_MS:g} ms, every round", p99))
    rows.append((f"each dialect <= {DIALECT_TARGET}x the hub's SSE", dialects))
    for name, cell in rows:
        lines.append(f"| {name} |" + "".join(f" {cell(f)} |" for f in flavours))
    return lines


def capacity_table(sets: list[dict[str, Any]]) -> list[str]:
    """Streams at the sweep's pace and p99 limit, per variant, a column per set of runs."""
    lines = [
        "| streams |" + "".join(f" {s['label']} ({len(s['runs'])} runs) |" for s in sets),
        "|---|" + "---|" * len(sets),
    ]
    for variant, label in LABELS.items():
        cells = []
        for run_set in sets:
            values = [run[variant] for run in run_set["runs"] if variant in run]
            cells.append(span(values, 0) if values else "-")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {label} |" + "".join(f" {cell} |" for cell in cells))
    return lines


def burst_table(sets: list[dict[str, Any]]) -> list[str]:
    """essessey's events per second over sse-starlette's, per set of runs."""
    counts = list(sets[0]["clients"])
    lines = [
        "| essessey / sse-starlette, events per second | runs | date |"
        + "".join(f" {c} client{'s' if c != '1' else ''} |" for c in counts),
        "|---|---|---|" + "---|" * len(counts),
    ]
    for run_set in sets:
        cells = "".join(
            f" {span(run_set['clients'][c], 2, 'x')} |" if c in run_set["clients"] else " - |"
            for c in counts
        )
        lines.append(f"| {run_set['label']} | {run_set['runs']} | {run_set['date']} |{cells}")
    return lines


def glance_table(
    paced: list[dict[str, Any]],
    found: dict[str, list[dict[str, dict[str, Any]]]],
    capacity: list[dict[str, Any]],
    burst: list[dict[str, Any]],
    recorded: dict[str, Any],
) -> list[str]:
    """Every benchmark in one row: what it measures, against what, its latest figures,
    how many runs they cover and the target."""
    lines = [
        "| benchmark | measures | against | latest figures | runs | target |",
        "|---|---|---|---|---|---|",
    ]
    parts = []
    for flavour in flavours_of(found):
        runs = found[flavour]
        figures = ", ".join(
            f"{name} {span(ratios(runs, variant, RAW), 2, 'x')}"
            for name, variant in (
                ("direct", DIRECT),
                ("hub", HUB),
                ("sse-starlette", "sse-starlette"),
            )
            if ratios(runs, variant, RAW)
        )
        parts.append(f"{flavour_style(flavour)[0]}: {figures} raw")
    runs_count = max((len(r) for r in found.values()), default=0)
    dates = ", ".join(sorted({run.get("date", "?") for run in paced}))
    measures, against = GLANCE["bench_paced.py"]
    verdict = "partly met (below)" if "missed" in "".join(paced_targets(found)) else "met"
    lines.append(
        f"| bench_paced.py | {measures} | {against} | {'; '.join(parts)} ({dates}) | "
        f"{runs_count} | {verdict} |"
    )
    if capacity:
        # each variant from the newest set that has it
        shown: set[str] = set()
        cells, counts = [], []
        for run_set in capacity:
            named = [v for v in LABELS if v not in shown and any(v in r for r in run_set["runs"])]
            if not named:
                continue
            shown.update(named)
            figures = ", ".join(
                f"{LABELS[v]} {span([r[v] for r in run_set['runs'] if v in r], 0)}" for v in named
            )
            cells.append(f"{figures} ({run_set['date']})")
            counts.append(str(len(run_set["runs"])))
        measures, against = GLANCE["bench_paced.py (sweep)"]
        lines.append(
            f"| bench_paced.py (sweep) | {measures} | {against} | {'; '.join(cells)} | "
            f"{' / '.join(counts)} | none |"
        )
    if burst:
        latest = burst[0]
        burst_cells = ", ".join(
            f"{span(v, 2, 'x')} at {c} client{'s' if c != '1' else ''}"
            for c, v in latest["clients"].items()
        )
        lowest = min(low for low, _ in latest["clients"].values())
        verdict = "met" if lowest >= BURST_TARGET else "missed"
        measures, against = GLANCE["bench_sse_e2e.py"]
        lines.append(
            f"| bench_sse_e2e.py | {measures} | {against} | essessey / sse-starlette: "
            f"{burst_cells} ({latest['date']}) | "
            f"{latest['runs']} | >= {BURST_TARGET:g}x: {verdict} |"
        )
    for row in recorded.get("benchmarks", []):
        dated = f" ({row['date']})" if row.get("date") else ""
        lines.append(
            f"| {row['script']} | {row['measures']} | {row['against']} | {row['figures']}"
            f"{dated} | {row['runs']} | {row['target']} |"
        )
    return lines


# -- charts ---------------------------------------------------------------------------------


def svg_head(width: int, height: int, title: str) -> list[str]:
    """The opening of an SVG chart with its title."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
    ]


def legend(entries: list[tuple[str, str]], start: float, end: float) -> list[str]:
    """A swatch and a name per entry, in rows under the title, each as wide as its name."""
    parts, x, row = [], start, 0
    for name, colour in entries:
        wide = 24 + 6.2 * len(name)
        if x + wide > end and x > start:
            x, row = start, row + 1
        parts.append(
            f'<rect x="{x:.0f}" y="{30 + row * 14}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{39 + row * 14}">{name}</text>'
        )
        x += wide
    return parts


def tick_step(highest: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) of which five reach past ``highest``."""
    power = 10.0 ** math.floor(math.log10(highest / 5))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * power * 5 >= highest * 1.05:
            return factor * power
    return 10 * power


def grouped_bars(
    groups: list[str],
    series: list[tuple[str, str]],
    values: list[dict[str, list[float]]],
    title: str,
    unit: str,
) -> str:
    """A bar per series in each group: the median of its values, their range as a whisker.
    ``values[i][group]`` holds series i's values for a group."""
    step = tick_step(max(max(v) for per in values for v in per.values() if v))
    top = step * 5
    width, height, left, bottom, pad = 760, 380, 60, 110, 20
    plot_w, plot_h = width - left - pad, height - bottom - 60
    group_w = plot_w / len(groups)
    bar = group_w * 0.8 / len(series)

    def y(value: float) -> float:
        return 60 + plot_h * (1 - value / top)

    parts = svg_head(width, height, title)
    for i in range(6):
        value = step * i
        parts.append(
            f'<line x1="{left}" x2="{width - pad}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{left - 5}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{value:g}</text>"
        )
    for i, group in enumerate(groups):
        x0 = left + i * group_w + group_w * 0.1
        for j, (_, colour) in enumerate(series):
            found = values[j].get(group)
            if not found:
                continue
            x = x0 + j * bar
            mid = statistics.median(found)
            centre = x + (bar - 2) / 2
            parts.append(
                f'<rect x="{x:.1f}" y="{y(mid):.1f}" width="{bar - 2:.1f}" '
                f'height="{y(0) - y(mid):.1f}" fill="{colour}"/>'
                f'<line x1="{centre:.1f}" x2="{centre:.1f}" y1="{y(min(found)):.1f}" '
                f'y2="{y(max(found)):.1f}" stroke="black"/>'
            )
        label_x = left + i * group_w + group_w / 2
        parts.append(
            f'<text x="{label_x:.1f}" y="{y(0) + 14:.1f}" text-anchor="end" '
            f'transform="rotate(-30 {label_x:.1f} {y(0) + 14:.1f})">'
            f"{SHORT.get(group, LABELS[group])}</text>"
        )
    parts.extend(legend(series, left + 10, width - pad))
    parts.append(
        f'<text x="14" y="{60 + plot_h / 2}" transform="rotate(-90 14 {60 + plot_h / 2})" '
        f'text-anchor="middle">{unit}</text><text x="{width - pad}" y="{height - 8}" '
        f'text-anchor="end" fill="#555">bar: the median of the runs; line: their range</text>'
    )
    parts.append("</svg>\n")
    return "\n".join(parts)


def paced_chart(found: dict[str, list[dict[str, dict[str, Any]]]]) -> str:
    """Server CPU per delta by variant and server flavour, the median of the runs."""
    flavours = flavours_of(found)
    groups = [v for v in LABELS if any(v in run for f in flavours for run in found[f])]
    runs = max(len(found[f]) for f in flavours)
    return grouped_bars(
        groups,
        [flavour_style(f) for f in flavours],
        [{v: [run[v]["us"] for run in found[f] if v in run] for v in groups} for f in flavours],
        f"Server CPU per delta, 500 streams at a delta every 20 ms ({runs} runs)",
        "server us per delta",
    )


def capacity_chart(sets: list[dict[str, Any]]) -> str:
    """Streams served at the sweep's pace and p99 limit, per variant and set of runs."""
    groups = [v for v in LABELS if any(v in run for s in sets for run in s["runs"])]
    return grouped_bars(
        groups,
        [
            (f"{s['label']} ({len(s['runs'])} runs)", COLOURS[i % len(COLOURS)])
            for i, s in enumerate(sets)
        ],
        [{v: [run[v] for run in s["runs"] if v in run] for v in groups} for s in sets],
        "Capacity: streams at 50 deltas/s each with p99 under 50 ms (one server)",
        "streams",
    )


def burst_chart(sets: list[dict[str, Any]]) -> str:
    """A range bar per set of runs and client count: bench_sse_e2e.py's events per second
    as a multiple of sse-starlette's, from the lowest run to the highest, with the target."""
    clients = list(sets[0]["clients"])
    step = tick_step(max(hi for s in sets for _, hi in s["clients"].values()))
    top = step * 5
    width, height, left, bottom, pad = 760, 300, 60, 40, 20
    plot_w, plot_h = width - left - pad, height - bottom - 60
    group = plot_w / len(clients)
    bar = group * 0.7 / len(sets)

    def y(value: float) -> float:
        return 60 + plot_h * (1 - value / top)

    parts = svg_head(
        width, height, "Bursts: essessey's events per second as a multiple of sse-starlette's"
    )
    for i in range(6):
        value = step * i
        parts.append(
            f'<line x1="{left}" x2="{width - pad}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{left - 5}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{value:g}</text>"
        )
    parts.append(
        f'<line x1="{left}" x2="{width - pad}" y1="{y(BURST_TARGET):.1f}" '
        f'y2="{y(BURST_TARGET):.1f}" stroke="#c00" stroke-dasharray="4 3"/>'
        f'<text x="{left + 4}" y="{y(BURST_TARGET) - 3:.1f}" fill="#c00">'
        f"target {BURST_TARGET:g}x</text>"
    )
    for i, count in enumerate(clients):
        x0 = left + i * group + group * 0.15
        for j, run_set in enumerate(sets):
            if count not in run_set["clients"]:
                continue
            low, high = run_set["clients"][count]
            x = x0 + j * bar
            parts.append(
                f'<rect x="{x:.1f}" y="{y(high):.1f}" width="{bar - 4:.1f}" '
                f'height="{max(y(low) - y(high), 1.5):.1f}" fill="{COLOURS[j % len(COLOURS)]}"/>'
                f'<text x="{x + (bar - 4) / 2:.1f}" y="{y(high) - 4:.1f}" '
                f'text-anchor="middle">{low:.2f}-{high:.2f}</text>'
            )
        label = "1 client" if count == "1" else f"{count} clients"
        parts.append(
            f'<text x="{left + i * group + group / 2:.1f}" y="{y(0) + 16:.1f}" '
            f'text-anchor="middle">{label}</text>'
        )
    parts.extend(
        legend(
            [
                (f"{s['label']} ({s['runs']} runs)", COLOURS[j % len(COLOURS)])
                for j, s in enumerate(sets)
            ],
            left + 10,
            width - pad,
        )
    )
    parts.append(
        f'<text x="14" y="{60 + plot_h / 2}" transform="rotate(-90 14 {60 + plot_h / 2})" '
        f'text-anchor="middle">x sse-starlette</text>'
    )
    parts.append("</svg>\n")
    return "\n".join(parts)


# -- the page -------------------------------------------------------------------------------

MARKER = re.compile(r"(<!-- charts\.py: (\w+) -->\n).*?(<!-- charts\.py: end -->)", re.S)


def fill(page: str, tables: dict[str, list[str]]) -> str:
    """The page with each generated part replaced by its table."""

    def swap(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in tables:
            raise SystemExit(f"benchmarks/README.md names an unknown table: {name}")
        return match.group(1) + "\n".join(tables[name]) + "\n" + match.group(3)

    filled, count = MARKER.subn(swap, page)
    if count != len(tables):
        raise SystemExit(f"benchmarks/README.md holds {count} generated parts, not {len(tables)}")
    return filled


def build(results: Path, page: Path, images: Path = IMAGES) -> dict[Path, str]:
    """Every output: the page with its tables filled in, and each chart."""
    paced_paths = sorted(results.glob("paced-*.json"))
    if not paced_paths:
        raise SystemExit(f"no paced-*.json in {results}: run bench_paced.py --json PATH first")
    paced = [load(path) for path in paced_paths]
    found = paced_runs(paced)
    empty: dict[str, Any] = {}
    capacity = capacity_sets(
        load(results / "capacity.json") if (results / "capacity.json").exists() else empty,
        paced,
    )
    burst = burst_sets(
        load(results / "burst.json") if (results / "burst.json").exists() else empty,
        [load(path) for path in sorted(results.glob("burst-*.json"))],
    )
    recorded = load(results / "recorded.json") if (results / "recorded.json").exists() else empty
    tables = {
        "glance": glance_table(paced, found, capacity, burst, recorded),
        "paced": paced_table(found),
        "paced_targets": paced_targets(found),
        "capacity": capacity_table(capacity) if capacity else ["(no capacity runs recorded)"],
        "burst": burst_table(burst) if burst else ["(no burst runs recorded)"],
    }
    outputs = {page: fill(page.read_text(), tables), images / "paced-cpu.svg": paced_chart(found)}
    if capacity:
        outputs[images / "capacity.svg"] = capacity_chart(capacity)
    if burst:
        outputs[images / "burst-ratio.svg"] = burst_chart(burst)
    return outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results files")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to fill in")
    parser.add_argument("--images", type=Path, default=IMAGES, help="where the charts go")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if an output is out of date"
    )
    args = parser.parse_args()
    outputs = build(args.results, args.page, args.images)
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
