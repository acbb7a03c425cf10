"""The charts of benchmarks/README.md, drawn from machine-readable results.

    python benchmarks/bench_paced.py --no-sweep --json benchmarks/results/paced-1.json
    ...                                  # as many runs as the page reports
    python benchmarks/charts.py          # docs/img/paced-cpu.svg, docs/img/burst-ratio.svg

It reads every ``benchmarks/results/paced-*.json`` (bench_paced.py's ``--json``), takes
each variant's server CPU per delta on each server flavour (the median of its rounds in a
run), and draws, for each variant and flavour, the median over the runs with the range of
the runs as a whisker (paced-cpu.svg). From ``benchmarks/results/burst.json`` (the burst
benchmark's ratio to sse-starlette, a range over the runs of each set, as the page gives
it) it draws each set's range at one and eight clients (burst-ratio.svg). The SVG is
written by hand: no plotting library to install.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "img"

FLAVOURS = {"h11": ("h11 + asyncio", "#4c78a8"), "standard": ("httptools + uvloop", "#f58518")}
LABELS = {
    "raw-sse": "raw ASGI",
    "sse-starlette": "sse-starlette",
    "fastapi-sse": "FastAPI SSE",
    "essessey-sse": "essessey direct",
    "essessey-hub-sse": "essessey hub",
    "essessey-hub-ui": "hub, UI stream",
    "essessey-hub-agui": "hub, AG-UI",
    "essessey-hub-chat": "hub, Chat Compl.",
    "essessey-hub-responses": "hub, Responses",
    "essessey-hub-ws": "hub, WebSocket",
}


def per_run(paths: list[Path]) -> dict[str, dict[str, list[float]]]:
    """{flavour: {variant: [server us per delta, one per run]}}, each run's figure the
    median of its rounds."""
    found: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        data: dict[str, Any] = json.loads(path.read_text())
        for flavour in data["flavours"]:
            rounds: dict[str, list[float]] = {}
            for row in flavour["rounds"]:
                rounds.setdefault(row["variant"], []).append(row["server_cpu_us_per_delta"])
            into = found.setdefault(flavour["flavour"], {})
            for variant, figures in rounds.items():
                into.setdefault(variant, []).append(statistics.median(figures))
    return found


def bar_chart(
    found: dict[str, dict[str, list[float]]], title: str, unit: str, lines: tuple[float, ...] = ()
) -> str:
    """A grouped bar chart (a bar per flavour for each variant): the median of the runs,
    the range of the runs as a whisker, and dashed lines at ``lines`` (targets)."""
    variants = [v for v in LABELS if any(v in found[f] for f in found)]
    flavours = [f for f in FLAVOURS if f in found]
    top = max(max(max(vals) for vals in found[f].values()) for f in flavours)
    top = max(top, *lines) * 1.15 if lines else top * 1.15
    width, height, left, bottom, pad = 760, 360, 60, 90, 20
    plot_w, plot_h = width - left - pad, height - bottom - 40
    group = plot_w / len(variants)
    bar = group * 0.8 / len(flavours)

    def y(value: float) -> float:
        return 40 + plot_h * (1 - value / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
    ]
    for i in range(6):
        value = top * i / 5
        parts.append(
            f'<line x1="{left}" x2="{width - pad}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{left - 5}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{value:.1f}</text>"
        )
    for target in lines:
        parts.append(
            f'<line x1="{left}" x2="{width - pad}" y1="{y(target):.1f}" y2="{y(target):.1f}" '
            f'stroke="#c00" stroke-dasharray="4 3"/><text x="{left + 4}" '
            f'y="{y(target) - 3:.1f}" fill="#c00">{target:g}x</text>'
        )
    for i, variant in enumerate(variants):
        x0 = left + i * group + group * 0.1
        for j, flavour in enumerate(flavours):
            values = found[flavour].get(variant)
            if not values:
                continue
            colour = FLAVOURS[flavour][1]
            x = x0 + j * bar
            mid = statistics.median(values)
            parts.append(
                f'<rect x="{x:.1f}" y="{y(mid):.1f}" width="{bar - 2:.1f}" '
                f'height="{y(0) - y(mid):.1f}" fill="{colour}"/>'
            )
            centre = x + (bar - 2) / 2
            parts.append(
                f'<line x1="{centre:.1f}" x2="{centre:.1f}" y1="{y(min(values)):.1f}" '
                f'y2="{y(max(values)):.1f}" stroke="black"/>'
            )
        label_x = left + i * group + group / 2
        parts.append(
            f'<text x="{label_x:.1f}" y="{y(0) + 14:.1f}" text-anchor="end" '
            f'transform="rotate(-30 {label_x:.1f} {y(0) + 14:.1f})">{LABELS[variant]}</text>'
        )
    for j, flavour in enumerate(flavours):
        name, colour = FLAVOURS[flavour]
        parts.append(
            f'<rect x="{left + 10 + j * 170}" y="30" width="12" height="12" fill="{colour}"/>'
            f'<text x="{left + 26 + j * 170}" y="40">{name}</text>'
        )
    parts.append(
        f'<text x="14" y="{40 + plot_h / 2}" transform="rotate(-90 14 {40 + plot_h / 2})" '
        f'text-anchor="middle">{unit}</text>'
    )
    parts.append("</svg>\n")
    return "\n".join(parts)


def burst_chart(burst: dict[str, Any]) -> str:
    """A range bar per set of runs and client count: bench_sse_e2e.py's events per second
    as a multiple of sse-starlette's, from the lowest run to the highest, with the target."""
    sets = burst["sets"]
    clients = list(sets[0]["clients"])
    colours = ["#4c78a8", "#f58518", "#54a24b", "#b279a2"]
    top = max(hi for s in sets for _, hi in s["clients"].values()) * 1.15
    width, height, left, bottom, pad = 760, 300, 60, 40, 20
    plot_w, plot_h = width - left - pad, height - bottom - 60
    group = plot_w / len(clients)
    bar = group * 0.7 / len(sets)

    def y(value: float) -> float:
        return 60 + plot_h * (1 - value / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
        f"Bursts: essessey's events per second as a multiple of sse-starlette's</text>",
    ]
    for i in range(6):
        value = top * i / 5
        parts.append(
            f'<line x1="{left}" x2="{width - pad}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{left - 5}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{value:.1f}</text>"
        )
    target = 5.0
    parts.append(
        f'<line x1="{left}" x2="{width - pad}" y1="{y(target):.1f}" y2="{y(target):.1f}" '
        f'stroke="#c00" stroke-dasharray="4 3"/><text x="{left + 4}" y="{y(target) - 3:.1f}" '
        f'fill="#c00">target {target:g}x</text>'
    )
    for i, count in enumerate(clients):
        x0 = left + i * group + group * 0.15
        for j, run_set in enumerate(sets):
            low, high = run_set["clients"][count]
            x = x0 + j * bar
            parts.append(
                f'<rect x="{x:.1f}" y="{y(high):.1f}" width="{bar - 4:.1f}" '
                f'height="{max(y(low) - y(high), 1.5):.1f}" fill="{colours[j % len(colours)]}"/>'
                f'<text x="{x + (bar - 4) / 2:.1f}" y="{y(high) - 4:.1f}" '
                f'text-anchor="middle">{low:.2f}-{high:.2f}</text>'
            )
        label = "1 client" if count == "1" else f"{count} clients"
        parts.append(
            f'<text x="{left + i * group + group / 2:.1f}" y="{y(0) + 16:.1f}" '
            f'text-anchor="middle">{label}</text>'
        )
    for j, run_set in enumerate(sets):
        parts.append(
            f'<rect x="{left + 10 + j * 225}" y="32" width="12" height="12" '
            f'fill="{colours[j % len(colours)]}"/><text x="{left + 26 + j * 225}" y="42">'
            f"{run_set['label']} ({run_set['runs']} runs)</text>"
        )
    parts.append(
        f'<text x="14" y="{60 + plot_h / 2}" transform="rotate(-90 14 {60 + plot_h / 2})" '
        f'text-anchor="middle">x sse-starlette</text>'
    )
    parts.append("</svg>\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    paths = sorted(args.results.glob("paced-*.json"))
    if not paths:
        raise SystemExit(f"no paced-*.json in {args.results}: run bench_paced.py --json first")
    found = per_run(paths)
    runs = len(paths)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paced-cpu.svg").write_text(
        bar_chart(
            found,
            f"Server CPU per delta, 500 streams at a delta every 20 ms ({runs} runs)",
            "server us per delta",
        )
    )
    print(f"wrote paced-cpu.svg from {runs} run(s)")
    burst_path = args.results / "burst.json"
    if burst_path.exists():
        (args.out / "burst-ratio.svg").write_text(burst_chart(json.loads(burst_path.read_text())))
        print(f"wrote burst-ratio.svg from {burst_path.name}")


if __name__ == "__main__":
    main()
