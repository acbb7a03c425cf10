"""Where the server's CPU goes per event at a model's pace, step by step.

Runs ``bench_paced.py`` for one variant at a time (K streams, a delta every I seconds,
long enough to sample), attaches py-spy (a sampling profiler: it does not slow the
server down as a tracing profiler would) to the serving process while the streams run,
and sorts the samples' innermost frames into the steps an event takes: the producer and
its pacing, the Publisher, the framing, the delivery line, the store and the hand-over to
the subscriber, the write to the socket, the event loop. Each step's share of the samples
times the server's CPU per delta that the same run measured gives its cost in
microseconds per event.

py-spy must be installed (``pip install py-spy``) and allowed to read the server process
(root, or ptrace allowed). A C function's time is counted in the Python frame that called
it, so "the write" is the socket write itself (the send system call) with what framing
the server does around it.

    python benchmarks/profile_paced.py --server standard
    python benchmarks/profile_paced.py --server h11 --variants raw-sse,essessey-sse
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The step of each innermost frame, by function name (and file where names are common).
STEPS: list[tuple[str, tuple[str, ...]]] = [
    (
        "write to the socket (the send system call, the chunk's framing)",
        ("BodyWriter.write", "RequestResponseCycle.send", "FrameWriter.write"),
    ),
    (
        "event loop (uvloop or asyncio: timers, wake-ups, I/O)",
        ("Runner.run", "_set_result_unless_cancelled", "run_asgi", "TaskHandle._run_coro"),
    ),
    (
        "producer and its pacing (the benchmark's own: sleep, loop)",
        ("sleep", "produce", "raw_sse", "essessey_sse", "app", "stop_when_stdin_closes"),
    ),
    (
        "Publisher (the checker, the delta's JSON)",
        (
            "Publisher.send_content_block_delta_text",
            "Publisher._send_delta",
            "Publisher._check_delta",
            "ProtocolChecker.accept_text_delta",
            "ProtocolChecker.accept_delta",
        ),
    ),
    ("SSE framing", ("encode", "_prefix", "_check_token")),
    (
        "delivery line (the sink, the line's offer and take)",
        (
            "Line.offer",
            "Line.take",
            "Line.write",
            "Line._hold",
            "_LineSink.emit",
            "_LineSink.emit_text",
            "_LineSink._hand",
        ),
    ),
    (
        "store append and ids",
        (
            "_Stream.emit_text",
            "_Stream.append",
            "_Stream.put",
            "_Stream.keep",
            "InMemoryEventStore._append_fields",
            "InMemoryEventStore._create_or_touch",
            "_cost",
        ),
    ),
    (
        "hand-over to the subscriber (wake, in-append delivery)",
        (
            "_Stream.wake",
            "_Stream.offer",
            "_LineSink.take",
            "_LineSink.take_text",
            "_HubSink.emit",
            "_HubSink.emit_text",
            "_HubSink._note",
            "published_text",
        ),
    ),
]
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*)\)$")


def step_of(name: str) -> str:
    for step, names in STEPS:
        if name in names or name.rsplit(".", 1)[-1] in names:
            return step
    return "other"


def innermost(stack: str) -> str:
    frame = stack.rsplit(";", 1)[-1].strip()
    match = _FRAME.match(frame)
    name = match.group("name") if match else frame
    # py-spy writes a closure as outer.<locals>.inner: its own name is what counts.
    return name.rsplit(".<locals>.", 1)[-1]


def shares(raw: Path) -> tuple[collections.Counter[str], int, collections.Counter[str]]:
    """Samples by step, their total, and the "other" samples by function."""
    steps: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        name = innermost(stack)
        step = step_of(name)
        steps[step] += int(count)
        if step == "other":
            others[name] += int(count)
        total += int(count)
    return steps, total, others


def _server_pid(bench: subprocess.Popen[bytes], deadline: float) -> int:
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["pgrep", "-P", str(bench.pid), "-f", "bench_paced.py --serve --port"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if out:
            return int(out[0])
        time.sleep(0.2)
    raise SystemExit("the benchmark's server did not start")


def profile(args: argparse.Namespace, variant: str, work: Path) -> tuple[float, Path]:
    """Run one variant, sample its server; (server CPU per delta in us, samples file)."""
    command = [
        sys.executable,
        str(HERE / "bench_paced.py"),
        "--server",
        args.server,
        "--variants",
        variant,
        "--streams",
        str(args.streams),
        "--deltas",
        str(args.deltas),
        "--interval",
        str(args.interval),
        "--rounds",
        "1",
        "--no-sweep",
        "--json",
        str(work / f"{variant}.json"),
    ]
    raw = work / f"{variant}.txt"
    with tempfile.TemporaryFile() as output:
        bench = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            pid = _server_pid(bench, time.monotonic() + 60)
            time.sleep(args.settle)  # the streams connect and reach their pace
            subprocess.run(
                [
                    *("py-spy", "record", "-p", str(pid), "-d", str(args.seconds)),
                    *("-r", "250", "-f", "raw", "-o", str(raw)),
                ],
                check=True,
                capture_output=True,
            )
            bench.wait(timeout=args.deltas * args.interval * 3 + 120)
        finally:
            if bench.poll() is None:
                bench.send_signal(signal.SIGTERM)
                bench.wait(timeout=30)
        output.seek(0)
        text = output.read().decode(errors="replace")
    try:
        results = json.loads((work / f"{variant}.json").read_text())
        medians = results["flavours"][0]["medians"][variant]
        return float(medians["server_cpu_us_per_delta"]), raw
    except (OSError, ValueError, KeyError, IndexError):
        raise SystemExit(f"no figure for {variant} from the benchmark:\n{text}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="standard", choices=("h11", "standard"))
    parser.add_argument("--variants", default="raw-sse,essessey-sse,essessey-hub-sse")
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--deltas", type=int, default=1500)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--settle", type=float, default=12.0, help="seconds before sampling")
    parser.add_argument("--seconds", type=int, default=8, help="seconds sampled")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    variants = args.variants.split(",")
    columns: dict[str, tuple[float, collections.Counter[str], int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            per_delta, raw = profile(args, variant, Path(tmp))
            steps, total, others = shares(raw)
            columns[variant] = (per_delta, steps, total)
            if total:
                top = ", ".join(f"{n} {c / total:.0%}" for n, c in others.most_common(6))
                print(f"{variant}, most of 'other': {top}", file=sys.stderr)
    print(
        f"server {args.server}, {args.streams} streams, a delta every "
        f"{args.interval * 1000:.0f} ms; us per delta (share of the server's samples)"
    )
    print("| step | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for step in [name for name, _ in STEPS] + ["other"]:
        cells = []
        for variant in variants:
            per_delta, steps, total = columns[variant]
            share = steps[step] / total if total else 0.0
            cells.append(f"{per_delta * share:.1f} ({share:.0%})")
        print(f"| {step} | " + " | ".join(cells) + " |")
    totals = " | ".join(f"**{columns[v][0]:.1f}**" for v in variants)
    print(f"| server CPU per delta | {totals} |")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
