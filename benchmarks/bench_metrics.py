"""What the metrics cost at a model's pace: bench_paced.py's essessey variants served by two
uvicorn processes side by side, one without OpenTelemetry configured and one with a meter
provider, a Prometheus reader and ``/metrics`` scraped every second while the streams run.

Run ``python benchmarks/bench_metrics.py`` (K=500 streams x M=100 deltas every 20 ms, 3
rounds, h11: about 3 minutes) or ``--quick`` (50 x 20, 1 round). Other flags: ``--streams K
--deltas M --interval I --rounds R --variants a,b --server h11|standard --scrape-every S
--json PATH``.

The two servers run the same app (bench_paced.build_app); the one with metrics sets its
meter provider after the app is built, as the demo does, and serves ``/metrics`` in front
of it. Each round runs every variant on both servers, in alternating order, so a noisy
neighbour's burst spreads over both; the client scrapes the metrics server's ``/metrics``
every ``--scrape-every`` seconds during its rounds (a Prometheus scraping every second is
15 times the usual rate) and checks that the events it counted are there. Server CPU per
delta comes from /proc, as in bench_paced.py; the ratio is with metrics / without, median
of the rounds. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from typing import Any

from _cli import add_json_option, write_json
from _server import ServerProcess
from bench_paced import (
    ESSESSEY_SSE,
    HOST,
    HUB_SSE,
    HUB_WS,
    STARTUP_TIMEOUT,
    App,
    Round,
    Target,
    check_samples,
    one_round,
    raise_fd_limit,
    run_client,
    serve,
)
from starlette.types import Receive, Scope, Send

VARIANTS = [ESSESSEY_SSE, HUB_SSE, HUB_WS]
TARGET_RATIO = 1.05


# -- the server ---------------------------------------------------------------------------


def with_metrics(app: App) -> App:
    """A meter provider with a Prometheus reader, and ``/metrics`` in front of ``app``."""
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    headers = [(b"content-type", CONTENT_TYPE_LATEST.encode())]

    async def serve_metrics(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            body = generate_latest()
            length = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers + length})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return serve_metrics


# -- the client ---------------------------------------------------------------------------


async def scrape(port: int) -> bytes:
    """One ``GET /metrics``: the body (the server closes the connection)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(10):
            response = await reader.read()
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"/metrics answered {head[:40]!r}")
    return body


def events_sent(body: bytes) -> float:
    """``essessey_events_sent_total`` over every transport, as scraped."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "essessey_events_sent_total"
    )


async def scraping(port: int, every: float, counts: list[float]) -> None:
    """Scrape every ``every`` seconds until cancelled, noting the events sent each time."""
    while True:
        counts.append(events_sent(await scrape(port)))
        await asyncio.sleep(every)


async def measure(args: argparse.Namespace, plain: ServerProcess, metered: ServerProcess) -> Any:
    targets = {
        "off": Target(plain.port, plain.process.pid, None),
        "on": Target(metered.port, metered.process.pid, None),
    }
    for variant in args.variants:  # warm-up, untimed, checking what is sent
        for name, target in targets.items():
            warm = await one_round(
                target, variant, min(10, args.streams), 5, args.interval, 0, capture=True
            )
            wrong = check_samples(warm)
            if warm.lost or wrong is not None:
                raise SystemExit(f"{variant} (metrics {name}): the warm-up failed ({wrong!r})")
    before = events_sent(await scrape(metered.port))
    rounds: list[tuple[str, Round]] = []
    scrapes: list[float] = []
    for round_no in range(1, args.rounds + 1):
        for variant in args.variants:
            order = ["off", "on"] if round_no % 2 else ["on", "off"]
            for name in order:
                scraper = None
                if name == "on":
                    scraper = asyncio.create_task(
                        scraping(metered.port, args.scrape_every, scrapes)
                    )
                try:
                    result = await one_round(
                        targets[name], variant, args.streams, args.deltas, args.interval, round_no
                    )
                finally:
                    if scraper is not None:
                        scraper.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await scraper
                rounds.append((name, result))
                print(
                    f"  round {round_no} {variant} metrics {name}: "
                    f"{fmt(result.server_cpu_us_per_delta)} us/delta, lost {result.lost}",
                    file=sys.stderr,
                )
    after = events_sent(await scrape(metered.port))
    return rounds, scrapes, after - before


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(
    args: argparse.Namespace, rounds: list[tuple[str, Round]], scrapes: list[float], counted: float
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    print()
    print(
        f"{args.streams} streams x {args.deltas} deltas every {args.interval * 1e3:g} ms, "
        f"{args.rounds} round(s), {args.server}; /metrics scraped every {args.scrape_every:g} s "
        f"while the metrics server streams ({len(scrapes)} scrapes)"
    )
    print(f"{'variant':<17} {'off us/delta':>12} {'on us/delta':>12} {'on/off':>7} {'lost':>5}")
    for variant in args.variants:
        figures = {
            name: [
                r.server_cpu_us_per_delta for n, r in rounds if n == name and r.variant == variant
            ]
            for name in ("off", "on")
        }
        lost = sum(r.lost for _, r in rounds if r.variant == variant)
        off = statistics.median([v for v in figures["off"] if v is not None] or [0.0])
        on = statistics.median([v for v in figures["on"] if v is not None] or [0.0])
        ratio = on / off if off else None
        rows[variant] = {"off": figures["off"], "on": figures["on"], "ratio": ratio, "lost": lost}
        print(
            f"{variant:<17} {off:>12.1f} {on:>12.1f} "
            f"{'-' if ratio is None else f'{ratio:.3f}':>7} {lost:>5}"
        )
    print(
        f"events counted by the metrics server's essessey_events_sent_total during the rounds: "
        f"{counted:.0f} (the rounds with metrics sent "
        f"{sum(r.received for n, r in rounds if n == 'on')} deltas, plus each stream's other "
        "events)"
    )
    print(f"target: at most {TARGET_RATIO:.2f}x (5%) with metrics")
    return {"rows": rows, "scrapes": len(scrapes), "counted": counted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Server CPU per delta of essessey's paced variants with OpenTelemetry "
        "metrics configured and scraped, against the same server without."
    )
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--deltas", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.020)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--server", choices=["h11", "standard"], default="h11")
    parser.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--quick", action="store_true", help="K=50, M=20, 1 round")
    add_json_option(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--with-metrics", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-streams", type=int, default=1000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(
            args.port,
            args.server,
            args.max_streams,
            None,
            wrap=with_metrics if args.with_metrics else None,
        )
    if args.quick:
        args.streams, args.deltas, args.rounds = 50, 20, 1
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if set(args.variants) - set(VARIANTS) or not args.variants:
        parser.error(f"--variants: some of {VARIANTS}")
    if min(args.streams, args.deltas, args.rounds) < 1 or args.interval <= 0:
        parser.error("--streams, --deltas, --rounds must be >= 1 and --interval > 0")
    if raise_fd_limit() < 2 * args.streams + 256:
        parser.error(f"the file descriptor limit is too low for {args.streams} streams")
    common = ["--server", args.server, "--max-streams", str(max(1000, args.streams))]
    plain = ServerProcess(__file__, common, startup_timeout=STARTUP_TIMEOUT)
    try:
        metered = ServerProcess(
            __file__, [*common, "--with-metrics"], startup_timeout=STARTUP_TIMEOUT
        )
        try:
            plain.wait_until_ready()
            metered.wait_until_ready()
            started = time.monotonic()
            rounds, scrapes, counted = run_client(measure(args, plain, metered))
            figures = report(args, rounds, scrapes, counted)
            print(f"({time.monotonic() - started:.0f} s)")
        finally:
            metered.stop()
    finally:
        plain.stop()
    if args.json:
        write_json(args.json, figures, __file__)
    lost = sum(r.lost for _, r in rounds)
    return 1 if lost or not scrapes or counted <= 0 else 0


if __name__ == "__main__":
    sys.exit(main())
