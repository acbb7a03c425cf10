"""The public API's rules (essessey's package docstring says them): every exception in
one home and at the top level, a public name's ``__module__`` the path the docs import
it from, the bindings' id rules without Starlette, and the hub's ``cancel_all``."""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import subprocess
import sys
import typing

import anyio
import pytest

import essessey
from essessey import InMemoryEventStore, Publisher, StreamHub, reassemble_events, stream_turn

PUBLIC_PACKAGES = [
    "essessey",
    "essessey.adapters",
    "essessey.bindings.nats",
    "essessey.bindings.sse",
    "essessey.bindings.ui",
    "essessey.bindings.ws",
    "essessey.demo",
    "essessey.stores.jetstream",
    "essessey.stores.redis",
]


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
