"""What publishing a framework's run costs, counted in machine instructions: the same turns
as bench_pydantic_ai.py, bench_openai_agents.py and bench_langgraph.py (their ``replayed``
or ``function`` model), counted by valgrind instead of timed.

Run ``python benchmarks/bench_instructions.py [--frameworks langgraph,openai_agents,
pydantic_ai] [--turns 150] [--json [PATH]]``. Needs ``valgrind`` (the Debian package).

CPU time on a shared two-core machine moves by a tenth from one batch to the next, more
than the difference a change to the adapters makes. An instruction count does not move:
each path's turns run in a process of their own under ``valgrind --tool=cachegrind
--cache-sim=no``, once with no measured turn and once with ``--turns`` of them (both after
the same warm-up, hash seed fixed), and the difference divided by ``--turns`` is the
path's instructions per turn. A run of the same tree gives the same figures to within
0.1%. Instructions are not time (cache misses are left out: the adapters' share of the
time is somewhat higher than of the instructions), so bench_*.py stay the figures the
targets are measured on; this one says, exactly, whether a change made a path do less.

The paths: the framework's own run consumed to nothing, and the same run through
essessey's ``AgentTurns`` into a ``StreamHub`` (in-memory store), as in the timed
benchmarks; the ratio is hub / framework.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _cli import add_json_option, json_only, write_json

FRAMEWORKS = ("langgraph", "openai_agents", "pydantic_ai")
PATHS = ("framework", "hub")
WARM_UP = 20
ROUNDS, DELTAS = 3, 40  # as the timed benchmarks' defaults

_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")


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
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        f"{framework}:{path}:{turns}",
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, env=env, check=True)
    found = _REFS.search(done.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count for {framework} {path}")
    return int(found.group(1).replace(b",", b""))


def per_turn(framework: str, path: str, turns: int) -> float:
    """Instructions per turn of ``path``: a process with ``turns`` turns less one with none."""
    return (count(framework, path, turns) - count(framework, path, 0)) / turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help=f"some of {','.join(FRAMEWORKS)}, comma-separated (default all)",
    )
    parser.add_argument("--turns", type=int, default=150, help="measured turns (default 150)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        framework, path, turns = args.child.split(":")
        asyncio.run(_child(framework, path, int(turns)))
        return
    picked = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    if not picked or not set(picked) <= set(FRAMEWORKS):
        parser.error(f"--frameworks takes some of {','.join(FRAMEWORKS)}")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    quiet = json_only(args.json)
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
