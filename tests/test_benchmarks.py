"""The benchmarks still run: each answers ``--help`` (which imports all it uses), the
paced benchmark's smoke run (``--quick``) delivers every delta of every variant it runs, and
the snapshot benchmark's smoke run reassembles the turn on both hubs, its late readers
getting fewer events from the snapshot hub, and the framework benchmarks' adapters publish
the same turn on every model (the OpenAI client over HTTP too). A results file
(``--json PATH``) says where its figures come from, and benchmarks/README.md is what
``charts.py`` draws from the results files, one page that the docs' links into it still
reach.

Figures are never asserted here (benchmarks/README.md says how to read them); what is
checked is that a change to the package did not break a benchmark without anyone noticing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("bench_*.py"))
VARIANTS = "raw-sse,essessey-sse,essessey-hub-sse,raw-ws,essessey-hub-ws"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_starts(script: str) -> None:
    ran = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "usage:" in ran.stdout


def test_the_paced_benchmark_s_smoke_run_loses_nothing(tmp_path: Path) -> None:
    figures = tmp_path / "paced.json"
    ran = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_paced.py"),
            "--quick",
            "--server",
            "h11",
            "--variants",
            VARIANTS,
            "--json",
            str(figures),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    (flavour,) = json.loads(figures.read_text())["flavours"]
    rounds = flavour["rounds"]
    assert {r["variant"] for r in rounds} == set(VARIANTS.split(","))
    for r in rounds:
        assert (r["variant"], r["received"], r["lost"], r["failed_connections"]) == (
            r["variant"],
            r["expected"],
            0,
            0,
        )


@pytest.mark.parametrize(
    "script", ["bench_openai_agents.py", "bench_langgraph.py", "bench_pydantic_ai.py"]
)
def test_a_framework_benchmark_publishes_the_same_turn_on_every_model(
    script: str, tmp_path: Path
) -> None:
    # The wire model (the framework on the OpenAI client, a scripted server in a process of
    # its own) must give the adapter the turn the scripted models give it (parsed and
    # replayed, or Pydantic AI's function model), or its figures would compare another turn.
    figures = tmp_path / "framework.json"
    ran = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / script),
            *("--turns", "2", "--batch", "1", "--rounds", "2", "--deltas", "3"),
            *("--json", str(figures)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    results = json.loads(figures.read_text())
    models = [key for key, rows in results.items() if isinstance(rows, list)]
    assert "wire" in models, models
    assert len(models) > 1, models
    published = {
        (model, row["path"]): row["events_per_turn"]
        for model in models
        for row in results[model]
        # The Agents SDK's bench also publishes the turn by a hand-written glue: the same.
        if "essessey" in row["path"] or "glue" in row["path"]
    }
    # The same turn on every bench: 2 rounds of 3 text deltas; the message's start, ping,
    # delta and stop and the first text block's start and stop (6); the call between the
    # rounds: its block's start, 3 argument fragments and stop, its result's 3 events, the
    # next text block's 2 (10).
    assert set(published.values()) == {2 * 3 + 6 + 10}, published


def test_the_snapshot_benchmark_s_smoke_run_sends_late_readers_fewer_events() -> None:
    ran = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_snapshot.py"),
            "--deltas",
            "3000",
            "--late-readers",
            "4",
            "--rounds",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    report = json.loads(ran.stdout)
    verified = report["verification"]
    for variant in ("plain", "snap"):
        assert verified[variant]["text_matches"], variant
        assert verified[variant]["ends_at_last_id"], variant
    assert verified["plain"]["events"] == verified["plain"]["stored_events"]
    assert verified["snap"]["events"] < verified["plain"]["events"]
    rounds = {r["variant"]: r for r in report["rounds"]}
    assert set(rounds) == {"plain", "snap"}
    assert rounds["snap"]["events_per_reader"] < rounds["plain"]["events_per_reader"]
    for r in rounds.values():
        assert r["late_readers"] == 4
        # Every late reader received the same: the whole turn, or the same snapshot.
        low, high = r["events_per_reader_min_max"]
        assert low == high
    assert not report["live_reader"]["errors"]


def test_a_results_file_says_where_its_figures_come_from(tmp_path: Path) -> None:
    results = tmp_path / "encode.json"
    ran = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_encode.py"),
            "--deltas",
            "200",
            "--repeat",
            "1",
            "--json",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "x bare" in ran.stdout  # the table is printed beside the file
    document = json.loads(results.read_text())
    assert document["benchmark"] == "bench_encode.py"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", document["date"])
    assert document["commit"]
    assert document["produced_by"].endswith(f"--json {results}")
    assert document["deltas"] == 200
    assert document["results"]


def test_the_benchmarks_page_is_drawn_from_the_results_files() -> None:
    ran = subprocess.run(
        [sys.executable, str(BENCHMARKS / "charts.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, f"run python benchmarks/charts.py: {ran.stderr}"
    lines = (BENCHMARKS / "README.md").read_text().count("\n")
    assert lines < 250, f"benchmarks/README.md is {lines} lines: the history goes in HISTORY.md"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_into_the_benchmarks_page_reaches_a_heading() -> None:
    root = BENCHMARKS.parent
    page = (BENCHMARKS / "README.md").read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", page, re.M)}
    linked = re.compile(r"benchmarks/README\.md#([\w-]+)")
    missing = [
        f"{path.relative_to(root)}: #{anchor}"
        for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
        for anchor in linked.findall(path.read_text())
        if anchor not in anchors
    ]
    assert missing == []
