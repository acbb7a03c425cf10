"""The public API's rules (essessey's package docstring says them): every exception in
one home and at the top level, a public name's ``__module__`` the path the docs import
it from (the names a package imports on first use included), the demo built on public
names only, the bindings' id rules without Starlette, and the hub's ``cancel_all``."""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import typing
from pathlib import Path

import anyio
import pytest

import essessey
from essessey import InMemoryEventStore, Publisher, StreamHub, reassemble_events, stream_turn

PUBLIC_PACKAGES = [
    "essessey",
    "essessey.adapters",
    "essessey.bindings.http",
    "essessey.bindings.nats",
    "essessey.bindings.sse",
    "essessey.dialects.ui",
    "essessey.bindings.ws",
    "essessey.demo",
    "essessey.shutdown",
    "essessey.stores.jetstream",
    "essessey.stores.redis",
]

LAZY_NAMES = {
    "essessey.bindings.sse": [
        "EventStreamResponse",
        "HubSubscription",
        "RESUME_HEADERS_WITHIN",
        "SSEOptions",
        "cancel_response",
        "hub_routes",
        "requested_resume_point",
        "stream_response",
        "subscription_response",
    ],
    "essessey.bindings.ws": ["PING_FRAME", "stall_guard", "websocket_subscription", "ws_route"],
    # create_app is a plain function that imports the app when called: hypercorn and
    # granian look a factory up in the module's own namespace, not through __getattr__.
    "essessey.demo": ["serve"],
    "essessey.dialects": [
        "ConversationMessage",
        "DialectRequest",
        "DialectTurnFactory",
        "Role",
        "conversation",
        "dialect_routes",
        "user_text",
    ],
}
"""The names each package imports on first use (they need the ``server`` extra)."""


def _modules() -> list[str]:
    names = ["essessey"]
    for info in pkgutil.walk_packages(essessey.__path__, "essessey."):
        names.append(info.name)
    return names


def test_every_exception_lives_in_errors_and_is_exported_at_the_top() -> None:
    import essessey.errors as errors

    found = set()
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, essessey.EssesseyError)
                and value.__qualname__ in [*errors.__all__, "EssesseyError"]
            ):
                found.add(value)
            elif isinstance(value, type) and issubclass(value, essessey.EssesseyError):
                pytest.fail(f"{value.__qualname__} ({name}) is not in essessey.errors")
    assert {cls.__name__ for cls in found} == set(errors.__all__)
    assert set(errors.__all__) <= set(essessey.__all__)
    # No binding hands an error on under a second name.
    for package in PUBLIC_PACKAGES[1:]:
        exported = importlib.import_module(package).__all__
        assert not set(exported) & set(errors.__all__), package


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_a_public_name_says_the_path_it_is_imported_from(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == package, (name, value.__module__)
            if isinstance(value, type) and not issubclass(value, enum.Enum):
                assert repr(value) == f"<class '{package}.{name}'>"


def _fresh(code: str) -> str:
    """What ``code`` prints, run in a new interpreter (nothing imported beforehand)."""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_a_package_s_lazy_names_are_in_its_all_and_dir_before_they_are_imported() -> None:
    code = (
        "import importlib, json, sys\n"
        f"packages = {sorted(LAZY_NAMES)!r}\n"
        "found = {}\n"
        "for package in packages:\n"
        "    module = importlib.import_module(package)\n"
        "    found[package] = {\n"
        "        'lazy': sorted(n for n in module.__all__ if n not in vars(module)),\n"
        "        'not_in_dir': sorted(set(module.__all__) - set(dir(module))),\n"
        "        'private_in_dir': sorted(\n"
        "            n for n in dir(module) if n.startswith('_') and not n.startswith('__')\n"
        "        ),\n"
        "    }\n"
        "found['starlette imported'] = 'starlette' in sys.modules\n"
        "print(json.dumps(found))\n"
    )
    found = json.loads(_fresh(code))
    assert found.pop("starlette imported") is False
    for package, names in LAZY_NAMES.items():
        assert found[package] == {"lazy": names, "not_in_dir": [], "private_in_dir": []}


@pytest.mark.parametrize("package", sorted(LAZY_NAMES))
def test_every_name_a_package_imports_lazily_is_in_its_all(package: str) -> None:
    """mypy sees a lazy name through the package's ``if TYPE_CHECKING:`` re-exports
    (``import X as X``): each one there is a public name, so it must be in ``__all__`` (and
    so in the tests above). A type the package only annotates with is imported plainly."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    typing_only = [
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
        if alias.asname == alias.name
    ]
    assert sorted(typing_only) == LAZY_NAMES[package]
    assert set(typing_only) <= set(module.__all__)


def test_the_demo_factory_takes_what_the_demo_app_takes() -> None:
    # essessey.demo.create_app forwards to the app's builder (a plain function, for the
    # servers that look a factory up in the module): the same options, the same defaults.
    from essessey.demo import _app, create_app

    assert inspect.signature(create_app).parameters == inspect.signature(_app.create_app).parameters


def test_a_name_reached_through_another_lazy_name_says_its_public_path_too() -> None:
    # The routes build the response: a traceback through a route names the response by
    # its public path even when the app never asked the package for it.
    code = (
        "from essessey.bindings.sse import hub_routes\n"
        "print(hub_routes.__globals__['EventStreamResponse'].__module__)\n"
        "import essessey.bindings.sse as sse\n"
        "print('EventStreamResponse' in vars(sse))\n"
    )
    assert _fresh(code) == "essessey.bindings.sse\nTrue\n"


def test_a_lazy_name_without_its_extra_says_which_extra_to_install() -> None:
    # None in sys.modules is how Python marks a module that cannot be imported.
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None\n"
        "import essessey.bindings.ws as ws\n"
        "print(ws.encode_frame.__module__)\n"
        "try:\n"
        "    ws.ws_route\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    assert _fresh(code) == (
        "essessey.bindings.ws\n"
        "starlette | essessey.bindings.ws.ws_route needs starlette, which is not installed: "
        "pip install 'essessey[server]'\n"
    )


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [
        ("essessey.adapters.pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("essessey.adapters.openai_agents", "agents", "openai-agents"),
        ("essessey.adapters.langgraph", "langchain_core", "langgraph"),
        ("essessey.adapters.langgraph", "langgraph", "langgraph"),
    ],
)
def test_a_framework_adapter_without_its_extra_says_which_extra_to_install(
    module: str, framework: str, extra: str
) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{framework!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    assert _fresh(code) == (
        f"{framework} | {module} needs {framework}, which is not installed: "
        f"pip install 'essessey[{extra}]'\n"
    )


@pytest.mark.parametrize(
    ("module", "library", "extra"),
    [
        ("essessey.bindings.nats", "nats", "nats"),
        ("essessey.stores.redis", "redis", "redis"),
        ("essessey.stores.jetstream", "nats", "nats"),
        ("essessey.dialects.ui", "starlette", "server"),
        ("essessey.dialects.agui", "starlette", "server"),
        ("essessey.dialects.chat_completions", "starlette", "server"),
        ("essessey.dialects.responses", "starlette", "server"),
        ("essessey.bindings.http", "starlette", "server"),
        ("essessey.bindings.answering", "starlette", "server"),
        ("essessey.testing", "pytest", "testing"),
    ],
)
def test_a_module_without_its_extra_says_which_extra_to_install(
    module: str, library: str, extra: str
) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{library!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    assert _fresh(code) == (
        f"{library} | {module} needs {library}, which is not installed: "
        f"pip install 'essessey[{extra}]'\n"
    )


def test_the_demo_app_without_its_extra_says_which_extra_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None\n"
        "from essessey.demo import create_app\n"
        "try:\n"
        "    create_app()\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, '|', exc)\n"
    )
    assert _fresh(code) == (
        "starlette | essessey.demo.create_app needs starlette, which is not installed: "
        "pip install 'essessey[server]'\n"
    )


def test_a_name_a_package_does_not_have_is_an_attribute_error() -> None:
    import essessey.bindings.sse as sse

    with pytest.raises(AttributeError, match="has no attribute 'EventStreamRespons'"):
        sse.EventStreamRespons  # noqa: B018
    assert not hasattr(sse, "_response_helpers")


def test_the_shutdown_hooks_are_public_and_say_what_they_are_for() -> None:
    import essessey.shutdown as shutdown

    hooks = ["begin_shutdown", "detect_uvicorn_shutdown", "on_shutdown", "shutting_down"]
    assert set(shutdown.__all__) == {*hooks, "wait_for_shutdown"}
    for name in shutdown.__all__:
        assert (getattr(shutdown, name).__doc__ or "").strip(), name


def _public_modules() -> list[str]:
    return [name for name in _modules() if not any(p.startswith("_") for p in name.split("."))]


@pytest.mark.parametrize("module_name", _public_modules())
def test_every_public_name_says_a_public_path_that_exports_it(module_name: str) -> None:
    """In every public module (a package or not), a class or function of ``__all__``
    names a public module as its ``__module__``, one that exports it under that name in
    its ``__all__``; and it has a docstring saying what it is for."""
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", []):
        value = getattr(module, name)
        if not (isinstance(value, type) or inspect.isfunction(value)):
            continue
        if not value.__module__.startswith("essessey"):
            continue
        home = value.__module__
        assert not any(part.startswith("_") for part in home.split(".")), (name, home)
        exporter = importlib.import_module(home)
        assert getattr(exporter, name, None) is value, (name, home)
        assert name in exporter.__all__, (name, home)
        assert (value.__doc__ or "").strip(), (module_name, name)


_DEMO = Path(essessey.__file__).parent / "demo"


@pytest.mark.parametrize(
    "path", sorted(p.name for p in _DEMO.glob("*.py") if p.name != "__init__.py")
)
def test_the_demo_app_uses_only_public_names_of_the_library(path: str) -> None:
    """The demo is written as a user's app would be: each name of the library imported
    from the public path its ``__module__`` gives (or a public module's ``__all__``), no
    private module or name, no private attribute of the library's objects. Its own
    modules (``essessey.demo._*``) are the app's; its ``__init__`` is the library's
    packaging of it, under the package rules tested above."""
    tree = ast.parse((_DEMO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                assert not any(p.startswith("_") for p in parts), (node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("essessey"):
            assert node.module is not None
            if node.module.startswith("essessey.demo."):
                continue
            assert not any(p.startswith("_") for p in node.module.split(".")), (
                node.lineno,
                node.module,
            )
            exporter = importlib.import_module(node.module)
            for alias in node.names:
                assert alias.name in exporter.__all__, (node.lineno, node.module, alias.name)
                value = getattr(exporter, alias.name)
                if isinstance(value, type) or inspect.isfunction(value):
                    assert value.__module__ == node.module, (node.lineno, alias.name)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            assert own or node.attr.startswith("__"), (node.lineno, ast.unparse(node))


def test_the_top_level_holds_no_reassembly_record_or_shutdown_hook() -> None:
    for name in ("TextItem", "Reassembler", "ProtocolChecker", "begin_shutdown", "EventBatch"):
        assert not hasattr(essessey, name), name
    from essessey.check import ProtocolChecker
    from essessey.event import EventBatch
    from essessey.reassemble import Reassembler, TextItem
    from essessey.shutdown import begin_shutdown

    assert all((ProtocolChecker, EventBatch, Reassembler, TextItem, begin_shutdown))


def test_the_sse_binding_s_id_rules_import_without_starlette() -> None:
    code = (
        "import sys\n"
        "from essessey.bindings.sse import MAX_ID_LENGTH, is_event_id, is_stream_id\n"
        "assert 'starlette' not in sys.modules\n"
        "print(MAX_ID_LENGTH, is_stream_id('turn-1'), is_stream_id('a.b'), is_event_id('e-1'))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ran.stdout == "256 True False True\n"


@pytest.mark.anyio
async def test_cancel_all_ends_every_running_turn_and_the_hub_runs_on() -> None:
    store = InMemoryEventStore()
    started = [anyio.Event(), anyio.Event()]

    def endless(n: int) -> essessey.TurnProducer:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id=f"msg_{n}", stream_id=f"s{n}", model="m"
            ) as turn:
                await (await turn.text()).write("thinking it over")
                started[n].set()
                await anyio.sleep_forever()

        return produce

    with anyio.fail_after(10):
        async with StreamHub(store, shutdown_grace=0) as hub:
            assert await hub.cancel_all() == 0
            await hub.start("s0", endless(0))
            await hub.start("s1", endless(1))
            for event in started:
                await event.wait()
            assert await hub.cancel_all() == 2
            assert not hub.running("s0")
            assert not hub.running("s1")
            for stream_id in ("s0", "s1"):
                events, _ = await store.since(stream_id, None)
                assert reassemble_events(events).stop_reason == "cancelled"
            await hub.start("s0", endless(0))  # the hub runs on
            assert hub.running("s0")


@pytest.mark.parametrize(
    ("module", "options", "store"),
    [
        ("essessey.stores.jetstream", "JetStreamStoreOptions", "JetStreamEventStore"),
        ("essessey.stores.redis", "RedisStoreOptions", "RedisEventStore"),
    ],
)
def test_a_store_s_options_type_names_every_constructor_option_with_its_type(
    module: str, options: str, store: str
) -> None:
    """``connect`` and ``from_url`` take the constructor's options as a TypedDict; one
    added to the constructor and not to it would be untyped there."""
    package = importlib.import_module(module)
    typed = typing.get_type_hints(getattr(package, options))
    init = getattr(package, store).__init__
    hints = typing.get_type_hints(init)
    parameters = inspect.signature(init).parameters.values()
    keyword_only = {p.name: hints[p.name] for p in parameters if p.kind is p.KEYWORD_ONLY}
    assert typed == keyword_only
