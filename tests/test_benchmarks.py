"""The benchmarks still run: each answers ``--help`` (which imports all it uses), the
paced benchmark's smoke run (``--quick``) delivers every delta of every variant it runs, and
the snapshot benchmark's smoke run reassembles the turn on both hubs, its late readers
getting fewer events from the snapshot hub.

Figures are never asserted here (benchmarks/README.md says how to read them); what is
checked is that a change to the package did not break a benchmark without anyone noticing.
"""

from __future__ import annotations

import json
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
