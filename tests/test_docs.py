"""The docs' snippets: every Python block runs (against a demo and a nats-server of the
test's own where it needs them), each one shown with its output prints exactly that, and
every shell block sets the variables it uses."""

import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# A python block, then (optionally) "Output:" and a text block with what it prints.
_BLOCK = re.compile(r"```python\n(.*?)```(\s*\nOutput:\s*\n```text\n(.*?)```)?", re.DOTALL)


def _blocks() -> list[tuple[str, str, str | None]]:
    found = []
    for path in DOCS:
        for number, match in enumerate(_BLOCK.finditer(path.read_text()), 1):
            found.append((f"{path.name}#{number}", match.group(1), match.group(3)))
    return found


BLOCKS = _blocks()
Ran = subprocess.CompletedProcess[str]


# What a block needs to run, found in its text, and where the test puts it: the demo's
# address (the docs assume `essessey demo` on port 8000) becomes a demo this test serves on
# a free port; NATS_URL (which the NATS blocks read) points at a nats-server of its own.
DEMO_ADDRESS = "127.0.0.1:8000"
# Each block is a Python process of its own, which is mostly its start: three at a time
# (the NATS blocks one at a time, as they share the server's streams).
RUNNERS = 3


@pytest.fixture(scope="module")
def snippet_runs() -> Iterator[dict[str, Future[Ran]]]:
    """Every block, started once: what each printed and how it exited, by name, as each
    finishes. A test waits for its own block only, so the test timeout bounds one block's
    wait, not the whole batch's (on a loaded machine the batch takes minutes)."""
    from essessey.demo import create_app
    from tests.nats_server import nats_server
    from tests.servers import serve

    with ExitStack() as stack:
        demo = stack.enter_context(serve(create_app(), lifespan="on")).removeprefix("http://")
        nats = stack.enter_context(nats_server())
        one_at_a_time = threading.Lock()

        def run(code: str) -> Ran:
            # The checkout itself, installed or not, is what the docs describe.
            env = {**os.environ, "PYTHONPATH": str(ROOT), "NATS_URL": nats.url}
            with tempfile.TemporaryDirectory(prefix="essessey-snippet-") as folder:
                script = Path(folder) / "snippet.py"
                script.write_text(code.replace(DEMO_ADDRESS, demo))
                command = [sys.executable, str(script)]
                options: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}
                if "NATS_URL" in code:
                    with one_at_a_time:
                        return subprocess.run(command, cwd=folder, env=env, **options)
                return subprocess.run(command, cwd=folder, env=env, **options)

        # Entered last, left first: the blocks end before their servers stop.
        pool = stack.enter_context(ThreadPoolExecutor(RUNNERS))
        yield {name: pool.submit(run, code) for name, code, _ in BLOCKS}


@pytest.mark.parametrize(("name", "code", "output"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_snippet(
    name: str, code: str, output: str | None, snippet_runs: dict[str, Future[Ran]]
) -> None:
    """Every block runs (a block that only defines an app runs its definitions), and one
    shown with its output prints exactly that."""
    compile(code, name, "exec")
    ran = snippet_runs[name].result()
    assert ran.returncode == 0, ran.stderr
    if output is not None:
        assert ran.stdout == output


# A shell block of the docs uses only variables that it, or a block before it in the same
# page, sets: a reader who pastes the blocks in order never runs `curl .../$STREAM_ID`
# with STREAM_ID empty.
_SHELL = re.compile(r"```(?:sh|bash)\n(.*?)```", re.DOTALL)
_ASSIGNED = re.compile(r"(?:^|[\s;(&|])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)
_USED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_FROM_THE_SHELL = {"HOME", "PATH", "PWD"}


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_shell_blocks_set_every_variable_they_use(path: Path) -> None:
    assigned = set(_FROM_THE_SHELL)
    unset: list[str] = []
    for block in _SHELL.findall(path.read_text()):
        for line in block.splitlines():
            assigned.update(_ASSIGNED.findall(line))
            unset.extend(name for name in _USED.findall(line) if name not in assigned)
    assert unset == [], f"{path.name} uses shell variables it never sets: {unset}"


# Every essessey name the docs write out (`essessey.check.Rule`,
# `essessey.shutdown.begin_shutdown()`) imports from where they say; the strings that only
# look like one are logger and metric names, read from the package's own source.
_NAMED = re.compile(r"`(essessey(?:\.[A-Za-z_]\w*)+)")
_NOT_A_PATH = re.compile(r"""(?:getLogger|create_\w+|_metric)\(\s*["'](essessey[\w.]*)["']""")


def _resolves(path: str) -> bool:
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_every_name_the_docs_give_imports_from_where_they_say() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "essessey").rglob("*.py"))
    not_paths = set(_NOT_A_PATH.findall(source))
    named = {
        (match.group(1), path.name) for path in DOCS for match in _NAMED.finditer(path.read_text())
    }
    wrong = sorted(
        (name, page) for name, page in named if name not in not_paths and not _resolves(name)
    )
    assert wrong == [], wrong
