"""A thinking block's signature, read by one rule everywhere (docs/protocol.md): it comes
whole, and when a block has more than one ``signature_delta`` the last replaces the
others, as the reassembler and Anthropic's SDK read it. Each dialect that carries a
signature carries that one: the UI stream on the reasoning part's end, AG-UI as the
reasoning's encrypted value, Responses as the item's ``encrypted_content``; Chat
Completions has no field for it."""

from __future__ import annotations

import orjson
import pytest

from essessey import Event, InMemorySink, Publisher, StopReason
from essessey.bindings.sse import FrameEncoder
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from essessey.protocol import Dialect
from essessey.reassemble import reassemble_events

pytestmark = pytest.mark.anyio

FIRST, LAST = "sig-superseded", "sig-final"


async def signed_turn(signatures: list[str], dialect: Dialect) -> list[Event]:
    sink = InMemorySink()
    p = Publisher(sink, dialect=dialect)
    await p.send_stream_preamble("msg_1", "s", "m")
    await p.send_content_block_start_thinking(0)
    await p.send_content_block_delta_thinking(0, "Thinking.")
    for signature in signatures:
        await p.send_signature_delta(0, signature)
    await p.send_content_block_stop(0)
    await p.send_content_block_start_text(1)
    await p.send_content_block_delta_text(1, "Answer.")
    await p.send_content_block_stop(1)
    await p.send_stream_epilogue(StopReason.END_TURN, 2)
    return sink.events


def payloads(encoder: FrameEncoder, events: list[Event]) -> list[dict[str, object]]:
    """Every JSON payload the encoder writes for ``events``, in order."""
    body = b"".join(encoder.encode(event) for event in events) + encoder.finish()
    out = []
    for line in body.split(b"\n"):
        data = line.removeprefix(b"data: ")
        if data != line and data.startswith(b"{"):
            out.append(orjson.loads(data))
    return out


def ui_signatures(events: list[Event]) -> list[object]:
    ends = [p for p in payloads(UIMessageEncoder(), events) if p["type"] == "reasoning-end"]
    return [end.get("providerMetadata") for end in ends]


def agui_signatures(events: list[Event]) -> list[object]:
    written = payloads(AGUIEncoder("t", "r"), events)
    return [p["encryptedValue"] for p in written if p["type"] == "REASONING_ENCRYPTED_VALUE"]


def responses_signatures(events: list[Event]) -> list[object]:
    written = payloads(ResponsesEncoder("resp_1"), events)
    done = [p["item"] for p in written if p["type"] == "response.output_item.done"]
    return [item.get("encrypted_content") for item in done if item["type"] == "reasoning"]  # type: ignore[attr-defined,index]


@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
@pytest.mark.parametrize("signatures", [[LAST], [FIRST, LAST], [FIRST, "", LAST]])
async def test_every_reader_keeps_the_last_signature_whole(
    dialect: Dialect, signatures: list[str]
) -> None:
    events = await signed_turn(signatures, dialect)
    assert reassemble_events(events).signature == LAST
    assert ui_signatures(events) == [{"essessey": {"signature": LAST}}]
    assert agui_signatures(events) == [LAST]
    assert responses_signatures(events) == [LAST]
    # Chat Completions has no field for it: nothing of it is written.
    written = b"".join(ChatCompletionsEncoder("c").encode(event) for event in events)
    assert b"sig-" not in written


async def test_unsigned_reasoning_carries_no_signature() -> None:
    events = await signed_turn([], "essessey")
    assert reassemble_events(events).signature is None
    assert ui_signatures(events) == [None]
    assert agui_signatures(events) == []
    assert responses_signatures(events) == [None]
