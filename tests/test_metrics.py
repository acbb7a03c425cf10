"""essessey's metrics, scraped from the demo's ``/metrics`` (Prometheus' text format, read
with prometheus_client's own parser) while a turn runs and after it, on a real uvicorn (the
demo's ``serve``, in a subprocess).

The counts are the process's (other tests add to them), so each check is of a change.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import WAIT, stop_process
from tests.test_demo import _first_line, _spawn_demo

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str) -> Samples:
    """Every sample of ``/metrics`` by name and labels (OpenTelemetry's scope labels
    left out)."""
    response = httpx.get(f"{base}/metrics", timeout=WAIT)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if not k.startswith("otel_"))
            )
            samples[(sample.name, labels)] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    # In its own process: the meter provider OpenTelemetry is given is the process's for
    # good (and FastAPI then instruments every app it builds, wrapping their send).
    process = _spawn_demo(metrics=True)
    try:
        yield _first_line(process, WAIT).removeprefix("essessey demo on ")
    finally:
        stop_process(process, kill=True)


def test_a_running_turn_and_its_reader_show_while_it_runs(base: str) -> None:
    before = scrape(base)
    stream_id = httpx.post(
        f"{base}/streams", json={"deltas": 40, "delay_ms": 15}, timeout=WAIT
    ).json()["stream_id"]
    during: Samples = {}
    last_id = None
    with httpx.stream("GET", f"{base}/streams/{stream_id}", timeout=WAIT) as response:
        for n, line in enumerate(response.iter_lines()):
            if line.startswith("id: "):
                last_id = line[4:]
            if n == 30:
                during = scrape(base)
    after = scrape(base)
    assert value(during, "essessey_turns_running") >= 1
    assert value(during, "essessey_subscribers", transport="sse") >= 1
    assert value(during, "essessey_store_events") > 0
    assert value(during, "essessey_store_bytes") > 0
    sent = value(after, "essessey_events_sent_total", transport="sse") - value(
        before, "essessey_events_sent_total", transport="sse"
    )
    assert sent >= 40  # the turn's deltas at least
    assert value(after, "essessey_bytes_sent_bytes_total", transport="sse") > value(
        before, "essessey_bytes_sent_bytes_total", transport="sse"
    )
    finished = value(after, "essessey_turns_finished_total", outcome="end_turn") - value(
        before, "essessey_turns_finished_total", outcome="end_turn"
    )
    assert finished == 1
    first = value(after, "essessey_first_event_duration_seconds_count", transport="sse")
    assert first > value(before, "essessey_first_event_duration_seconds_count", transport="sse")
    # Resumes by outcome: one replayed, one unknown id.
    assert last_id is not None
    url = f"{base}/streams/{stream_id}"
    # From the finished turn's last event: accepted, nothing after it, so 204 (an
    # EventSource stops there); it counts as replayed.
    assert httpx.get(url, headers={"last-event-id": last_id}, timeout=WAIT).status_code == 204
    unknown = {"last-event-id": "ffffffff-1"}
    assert httpx.get(url, headers=unknown, timeout=WAIT).status_code == 410
    resumed = scrape(base)
    for outcome in ("replayed", "unknown_id"):
        assert (
            value(resumed, "essessey_resumes_total", outcome=outcome)
            == value(after, "essessey_resumes_total", outcome=outcome) + 1
        ), outcome


def test_a_cancelled_turn_is_counted_by_its_outcome(base: str) -> None:
    before = scrape(base)
    stream_id = httpx.post(
        f"{base}/streams", json={"deltas": 1000, "delay_ms": 20}, timeout=WAIT
    ).json()["stream_id"]
    assert httpx.post(f"{base}/streams/{stream_id}/cancel", timeout=WAIT).status_code == 200
    httpx.get(f"{base}/streams/{stream_id}", timeout=WAIT)  # to its end
    after = scrape(base)
    assert (
        value(after, "essessey_turns_finished_total", outcome="cancelled")
        == value(before, "essessey_turns_finished_total", outcome="cancelled") + 1
    )
