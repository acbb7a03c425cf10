"""What publishing a framework's run costs, counted in machine instructions: the same turns
as bench_pydantic_ai.py, bench_openai_agents.py and bench_langgraph.py (their ``replayed``
or ``function`` model), counted by valgrind instead of timed.

Run ``python benchmarks/bench_instructions.py [--frameworks langgraph,openai_agents,
pydantic_ai] [--turns 150] [--json [PATH]]``, or with ``--paced raw-sse,essessey-sse,
essessey-hub-sse [--server standard|h11|both]`` for the paced deltas of bench_paced.py.
Needs ``valgrind`` (the Debian package).

CPU time on a shared two-core machine moves by a tenth from one batch to the next, more
than the difference a change to the adapters makes. An instruction count hardly moves:
each path's turns run in a process of their own under ``valgrind --tool=cachegrind
--cache-sim=no``, once with no measured turn and once with ``--turns`` of them (both after
the same warm-up, hash seed fixed), and the difference divided by ``--turns`` is the
path's instructions per turn. Runs agree to within about 1% (where the garbage collector
runs moves a little with what ran before). Instructions are not time (cache misses are
left out: the adapters' share of the time is somewhat higher than of the instructions),
so bench_*.py stay the figures the targets are measured on; this one says whether a
change made a path do less, by more than that 1%, in one run.

The paths: the framework's own run consumed to nothing, and the same run through
essessey's ``AgentTurns`` into a ``StreamHub`` (in-memory store), as in the timed
benchmarks; the ratio is hub / framework.

``--paced``: bench_paced.py's own server process runs under valgrind, one variant at a
time, and ``PACED_STREAMS`` streams of its deltas are read from it (a token every
``PACED_INTERVAL`` seconds, phases spread), once with ``PACED_FEW`` deltas per stream and
once with ``PACED_MANY``; the difference over the extra deltas is the server's
instructions per delta, user space only (the kernel's writes and wakeups, the same for
every variant, are not counted), and the ratio is to raw ASGI's.

``--paced ... --lines``: the same two servers of each variant run under a Python line
counter instead of valgrind (``sys.settrace``; no valgrind needed), and the difference is
each function's lines and calls per delta: where a variant's extra instructions are, by
function, as exactly as a count can say it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _cli import add_json_option, json_only, write_json

from tests.processes import free_port, spawn

FRAMEWORKS = ("langgraph", "openai_agents", "pydantic_ai")
PATHS = ("framework", "hub")
WARM_UP = 20
ROUNDS, DELTAS = 3, 40  # as the timed benchmarks' defaults

PACED_STREAMS, PACED_INTERVAL, PACED_FEW, PACED_MANY = 20, 0.05, 20, 120
PACED_READY = 300.0  # seconds a server under valgrind may take to listen

_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")
_VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def _turns(framework: str) -> tuple[Callable[[int], Any], Callable[[str], Any]]:
    """The framework's own turn and essessey's producer of the same turn."""
    if framework == "langgraph":
        import bench_langgraph as lg

        graph = lg.make_graph(ROUNDS, DELTAS, checkpointer=False, parsed=False)
        return (lambda n: lg.graph_turn(graph, n)), lg.producer(graph)
    if framework == "openai_agents":
        import bench_openai_agents as oa

        agent = oa.make_agent(oa.scripts(ROUNDS, DELTAS), parsed=False)
        return (lambda n: oa.sdk_turn(agent)), oa.producer(agent)
    import bench_pydantic_ai as pa

    agent = pa.make_agent(ROUNDS, DELTAS)
    return (lambda n: pa.framework(agent, n)), pa.producer(agent)


async def _child(framework: str, path: str, turns: int) -> None:
    """The measured process: both paths warmed up, then ``turns`` of ``path``."""
    from essessey import StreamHub

    own, producer = _turns(framework)
    async with StreamHub() as hub:

        async def through_hub(n: int) -> None:
            stream_id = f"bench_{n}"
            await hub.start(stream_id, producer(stream_id))
            await hub.wait(stream_id)

        for n in range(WARM_UP):
            await own(n)
            await through_hub(-1 - n)
        turn = through_hub if path == "hub" else own
        for n in range(turns):
            await turn(n)


def count(framework: str, path: str, turns: int) -> int:
    """The instructions of one process of ``path`` with ``turns`` measured turns."""
    command = [*_VALGRIND, sys.executable, __file__, "--child", f"{framework}:{path}:{turns}"]
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, env=env, check=True)
    return _instructions(done.stderr, f"{framework} {path}")


def _instructions(stderr: bytes, what: str) -> int:
    found = _REFS.search(stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count for {what}")
    return int(found.group(1).replace(b",", b""))


def per_turn(framework: str, path: str, turns: int) -> float:
    """Instructions per turn of ``path``: a process with ``turns`` turns less one with none."""
    return (count(framework, path, turns) - count(framework, path, 0)) / turns


async def _read_paced(port: int, variant: str, deltas: int) -> None:
    """A warm-up round of a few deltas, then a round of ``deltas`` per stream, each read
    to its end (bench_paced.py's query and round gates)."""
    import httpx
    from bench_paced import Params

    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=PACED_STREAMS + 5)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        for name, count in (("warm", 5), ("measured", deltas)):

            async def read(k: int, name: str = name, count: int = count) -> None:
                offset = PACED_INTERVAL * k / PACED_STREAMS
                query = Params(name, k, count, PACED_INTERVAL, offset).query()
                async with client.stream("GET", f"{base}/{variant}?{query}") as response:
                    async for _ in response.aiter_bytes():
                        pass

            readers = [asyncio.create_task(read(k)) for k in range(PACED_STREAMS)]
            await asyncio.sleep(2.0)  # every stream connected and waiting for the go
            await client.get(f"{base}/ctl/go?r={name}")
            await asyncio.gather(*readers)
            await client.get(f"{base}/ctl/end?r={name}")


def count_paced(variant: str, flavour: str, deltas: int, lines: str | None = None) -> int:
    """The instructions of one bench_paced.py server process that served ``variant``; with
    ``lines`` (a file to write), the server runs under the line counter instead
    (``--lines``) and this returns 0."""
    port = free_port()
    script = Path(__file__).resolve().parent / "bench_paced.py"
    server = [str(script), "--serve", "--port", str(port), "--server", flavour]
    wrapper = _VALGRIND if lines is None else []
    counter = [] if lines is None else [__file__, "--count-lines", lines]
    process = spawn(
        [*wrapper, sys.executable, *counter, *server, "--max-streams", "1000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONHASHSEED="0"),
    )
    try:
        # Not the harness's wait_for_port: under valgrind the imports alone outlast its
        # timeout.
        deadline = time.monotonic() + PACED_READY
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {flavour} server did not start") from None
                time.sleep(0.2)
        asyncio.run(_read_paced(port, variant, deltas))
    finally:
        assert process.stdin is not None
        process.stdin.close()  # the server stops when its stdin closes
        process.stdin = None
        _, stderr = process.communicate(timeout=PACED_READY)
    if lines is not None:
        return 0
    return _instructions(stderr, f"{variant} on {flavour}")


def serve_counting_lines(out: str, argv: list[str]) -> None:
    """Run bench_paced.py (``argv``) in this process with every function's calls and lines
    counted (``sys.settrace``), written to ``out`` as JSON when it exits."""
    import atexit
    import json
    import runpy
    from collections import Counter

    counts: Counter[str] = Counter()
    site = "site-packages/"
    here = str(Path(__file__).resolve().parent.parent)

    def where(frame: Any) -> str:
        code = frame.f_code
        name = code.co_filename
        if site in name:
            name = name.split(site, 1)[1]
        elif name.startswith(here):
            name = os.path.relpath(name, here)
        else:  # the standard library's: its last two parts
            name = "/".join(Path(name).parts[-2:])
        return f"{name}:{code.co_name}"

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            counts["line " + where(frame)] += 1
        elif event == "call":
            counts["call " + where(frame)] += 1
        return trace

    atexit.register(lambda: Path(out).write_text(json.dumps(counts)))
    sys.argv = argv
    sys.settrace(trace)
    runpy.run_path(argv[0], run_name="__main__")


def paced_lines(variants: list[str], flavour: str) -> None:
    """Python lines and calls per delta of each variant's server, by function: the
    difference between a server of ``PACED_MANY`` deltas a stream and one of
    ``PACED_FEW``, over the extra deltas (functions at half a line a delta or more)."""
    import json
    import tempfile

    extra = PACED_STREAMS * (PACED_MANY - PACED_FEW)
    with tempfile.TemporaryDirectory() as scratch:
        for variant in variants:
            files = [str(Path(scratch) / f"{variant}-{n}.json") for n in (PACED_FEW, PACED_MANY)]
            for n, out in zip((PACED_FEW, PACED_MANY), files, strict=True):
                count_paced(variant, flavour, n, lines=out)
            few, many = (json.loads(Path(out).read_text()) for out in files)
            per = {key: (many.get(key, 0) - few.get(key, 0)) / extra for key in many}
            total = sum(v for key, v in per.items() if key.startswith("line "))
            calls = sum(v for key, v in per.items() if key.startswith("call "))
            print(f"{flavour} {variant}: {total:.1f} lines, {calls:.1f} calls a delta")
            for key, value in sorted(per.items(), key=lambda item: -item[1]):
                if key.startswith("line ") and value >= 0.5:
                    function = key[5:]
                    called = per.get("call " + function, 0)
                    print(f"  {value:6.1f} lines {called:5.1f} calls  {function}")


def paced(variants: list[str], flavours: list[str], quiet: bool) -> list[dict[str, Any]]:
    """Instructions per delta of each variant's server, beside raw ASGI's."""
    rows: list[dict[str, Any]] = []
    extra = PACED_STREAMS * (PACED_MANY - PACED_FEW)
    if not quiet:
        print(f"{PACED_STREAMS} streams, a delta every {PACED_INTERVAL} s; server instructions")
        print(f"  {'server':9} {'variant':22} {'per delta':>10} {'x raw':>6}")
    for flavour in flavours:
        raw: float | None = None
        for variant in variants:
            with ThreadPoolExecutor(2) as pool:
                counts = [
                    pool.submit(count_paced, variant, flavour, n) for n in (PACED_FEW, PACED_MANY)
                ]
                few, many = (done.result() for done in counts)
            per_delta = (many - few) / extra
            if variant == "raw-sse":
                raw = per_delta
            ratio = per_delta / raw if raw else None
            rows.append(
                {"server": flavour, "variant": variant, "per_delta": per_delta, "ratio": ratio}
            )
            if not quiet:
                shown = f"{ratio:6.2f}" if ratio is not None else "     -"
                print(f"  {flavour:9} {variant:22} {per_delta:10,.0f} {shown}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help=f"some of {','.join(FRAMEWORKS)}, comma-separated (default all)",
    )
    parser.add_argument("--turns", type=int, default=150, help="measured turns (default 150)")
    parser.add_argument(
        "--paced",
        help="bench_paced.py variants to count per delta instead, comma-separated "
        "(raw-sse first: the others' ratios are to it)",
    )
    parser.add_argument(
        "--server",
        choices=("standard", "h11", "both"),
        default="standard",
        help="with --paced: uvicorn with httptools and uvloop (standard), h11, or both",
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help="with --paced: count each function's Python lines and calls a delta (a line "
        "tracer instead of valgrind; one flavour, the first of --server's)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_json_option(parser)
    if sys.argv[1:2] == ["--count-lines"]:
        serve_counting_lines(sys.argv[2], sys.argv[3:])
        return
    args = parser.parse_args()
    if args.child:
        framework, path, turns = args.child.split(":")
        asyncio.run(_child(framework, path, int(turns)))
        return
    picked = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    if not picked or not set(picked) <= set(FRAMEWORKS):
        parser.error(f"--frameworks takes some of {','.join(FRAMEWORKS)}")
    if args.lines:
        if not args.paced:
            parser.error("--lines counts the --paced variants")
        variants = [name.strip() for name in args.paced.split(",") if name.strip()]
        paced_lines(variants, "h11" if args.server == "h11" else "standard")
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    quiet = json_only(args.json)
    if args.paced:
        variants = [name.strip() for name in args.paced.split(",") if name.strip()]
        flavours = ["standard", "h11"] if args.server == "both" else [args.server]
        rows = paced(variants, flavours, quiet)
        if args.json:
            write_json(args.json, {"paced": rows}, __file__)
        return
    rows: list[dict[str, Any]] = []
    if not quiet:
        print(f"{ROUNDS} rounds of {DELTAS} text deltas per turn; instructions per turn")
        print(f"  {'framework':14} {'framework own':>14} {'through hub':>14} {'ratio':>7}")
    for framework in picked:
        own = per_turn(framework, "framework", args.turns)
        hub = per_turn(framework, "hub", args.turns)
        rows.append({"framework": framework, "own": own, "hub": hub, "ratio": hub / own})
        if not quiet:
            print(f"  {framework:14} {own:14,.0f} {hub:14,.0f} {hub / own:7.3f}", flush=True)
    if args.json:
        write_json(args.json, {"turns": args.turns, "rows": rows}, __file__)


if __name__ == "__main__":
    main()
