"""The protocol checker: every rule, at the right position; valid streams pass."""

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from essessey import Event, check
from essessey.check import ProtocolChecker, Rule, Violation


def ev(name: str, **fields: Any) -> Event:
    return Event(name, orjson.dumps({"type": name, **fields}))


def message_start(message_id: str = "msg_1") -> Event:
    return ev(
        "message_start",
        message={
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    )


def start(index: int, block_type: str, **block: Any) -> Event:
    return ev("content_block_start", index=index, content_block={"type": block_type, **block})


def text_start(index: int) -> Event:
    return start(index, "text")


def thinking_start(index: int) -> Event:
    return start(index, "thinking")


def use_start(index: int, tool_use_id: str, name: str = "f") -> Event:
    return start(index, "tool_use", id=tool_use_id, name=name, input={})


def result_start(index: int, tool_use_id: str) -> Event:
    return start(index, "tool_result", tool_use_id=tool_use_id)


def delta(index: int, delta_type: str, **fields: Any) -> Event:
    return ev("content_block_delta", index=index, delta={"type": delta_type, **fields})


def text(index: int, value: str = "hi") -> Event:
    return delta(index, "text_delta", text=value)


def thinking(index: int, value: str = "hmm") -> Event:
    return delta(index, "thinking_delta", text=value)


def args(index: int, value: str = "{}") -> Event:
    return delta(index, "input_json_delta", partial_json=value)


def result(index: int, value: str = "42") -> Event:
    return delta(index, "json_partial", text=value)


def stop(index: int) -> Event:
    return ev("content_block_stop", index=index)


def message_delta(stop_reason: str = "end_turn") -> Event:
    return ev(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage={"output_tokens": 1},
    )


def message_stop() -> Event:
    return ev("message_stop")


def ping() -> Event:
    return ev("ping")


def error() -> Event:
    return ev("error", error={"type": "overloaded_error", "message": "Overloaded"})


def text_block(index: int, value: str = "hi") -> list[Event]:
    return [text_start(index), text(index, value), stop(index)]


def use_block(index: int, tool_use_id: str) -> list[Event]:
    return [use_start(index, tool_use_id), args(index, '{"q":1}'), stop(index)]


def result_block(index: int, tool_use_id: str) -> list[Event]:
    return [result_start(index, tool_use_id), result(index), stop(index)]


def end() -> list[Event]:
    return [message_delta(), message_stop()]


def asks() -> list[Event]:
    return [message_delta("tool_use"), message_stop()]


def approval_block(index: int, request_id: str, tool_use_id: str) -> list[Event]:
    return [start(index, "approval_request", id=request_id, tool_use_id=tool_use_id), stop(index)]


def question_block(index: int, request_id: str) -> list[Event]:
    return [start(index, "question", id=request_id, question="Which city?"), stop(index)]


def response_block(index: int, request_id: str, approved: bool = True) -> list[Event]:
    return [
        start(index, "approval_response", request_id=request_id, approved=approved),
        stop(index),
    ]


# -- every rule, at the position that breaks it --------------------------------------------

# rule -> (events, position of the one violation, the event name it names)
RULE_CASES: dict[str, tuple[list[Event], int, str]] = {
    Rule.PAYLOAD: ([message_start(), Event("ping", b'{"type":"pong"}'), *end()], 1, "ping"),
    Rule.MESSAGE_START_FIRST: (
        [ping(), text(0), message_start(), *end()],
        1,
        "content_block_delta",
    ),
    Rule.AFTER_MESSAGE_STOP: (
        [message_start(), *text_block(0), *end(), message_delta(), message_start(), *end()],
        6,
        "message_delta",
    ),
    Rule.NESTED_MESSAGE: ([message_start(), message_start("msg_2"), *end()], 1, "message_start"),
    Rule.INDEX_SEQUENCE: (
        [message_start(), *text_block(0), *use_block(2, "call_1"), *end()],
        4,
        "content_block_start",
    ),
    Rule.EMPTY_BLOCK: (
        [message_start(), thinking_start(0), thinking(0, ""), stop(0), *end()],
        3,
        "content_block_stop",
    ),
    Rule.ONE_OPEN_BLOCK: (
        [message_start(), text_start(0), text(0), *use_block(1, "call_1"), *end()],
        3,
        "content_block_start",
    ),
    Rule.THINKING_BEFORE_TEXT: (
        [message_start(), thinking_start(0), thinking(0), *text_block(1), *end()],
        3,
        "content_block_start",
    ),
    Rule.TOOLS_BEFORE_RESULTS: (
        [
            message_start(),
            *use_block(0, "call_a"),
            *use_block(1, "call_b"),
            *result_block(2, "call_a"),
            *use_block(3, "call_c"),
            *result_block(4, "call_b"),
            *result_block(5, "call_c"),
            *end(),
        ],
        10,
        "content_block_start",
    ),
    Rule.BLOCK_NOT_OPEN: (
        [message_start(), text_start(0), text(0), text(1), stop(0), *end()],
        3,
        "content_block_delta",
    ),
    Rule.DELTA_TYPE: (
        [message_start(), use_start(0, "call_1"), text(0), stop(0), *end()],
        2,
        "content_block_delta",
    ),
    Rule.UNCLOSED_BLOCK: (
        [message_start(), text_start(0), text(0), message_delta(), stop(0), message_stop()],
        3,
        "message_delta",
    ),
    Rule.TOOL_RESULT_UNKNOWN_USE: (
        [message_start(), *use_block(0, "call_1"), *result_block(1, "call_2"), *end()],
        4,
        "content_block_start",
    ),
    Rule.DUPLICATE_TOOL_USE: (
        [
            message_start(),
            *use_block(0, "call_1"),
            *result_block(1, "call_1"),
            *use_block(2, "call_1"),
            *end(),
        ],
        7,
        "content_block_start",
    ),
    Rule.DUPLICATE_TOOL_RESULT: (
        [
            message_start(),
            *use_block(0, "call_1"),
            *result_block(1, "call_1"),
            *result_block(2, "call_1"),
            *end(),
        ],
        7,
        "content_block_start",
    ),
    Rule.INCOMPLETE: ([message_start(), *text_block(0), message_delta()], 5, "(end)"),
    Rule.APPROVAL_UNKNOWN_CALL: (
        [message_start(), *use_block(0, "call_1"), *approval_block(1, "apr_1", "call_2"), *asks()],
        4,
        "content_block_start",
    ),
    Rule.DUPLICATE_REQUEST: (
        [
            message_start(),
            *question_block(0, "q_1"),
            *question_block(1, "q_1"),
            *asks(),
        ],
        3,
        "content_block_start",
    ),
    Rule.ASKING_STOP_REASON: (
        [message_start(), *question_block(0, "q_1"), *end()],
        3,
        "message_delta",
    ),
    Rule.ANSWER_UNKNOWN_REQUEST: (
        [
            message_start(),
            *text_block(0),
            *end(),
            message_start("m2"),
            *response_block(0, "apr_9"),
            *end(),
        ],
        7,
        "content_block_start",
    ),
    Rule.DUPLICATE_ANSWER: (
        [
            message_start(),
            *use_block(0, "call_1"),
            *approval_block(1, "apr_1", "call_1"),
            *asks(),
            message_start("msg_2"),
            *response_block(0, "apr_1"),
            *response_block(1, "apr_1", approved=False),
            *end(),
        ],
        11,
        "content_block_start",
    ),
}


def _rule_names() -> set[str]:
    return {
        value
        for name, value in vars(Rule).items()
        if not name.startswith("_") and isinstance(value, str)
    }


def test_every_rule_has_a_case() -> None:
    assert set(RULE_CASES) == _rule_names()
    assert len(_rule_names()) == 21


@pytest.mark.parametrize(("rule", "case"), list(RULE_CASES.items()), ids=list(RULE_CASES))
def test_rule_is_reported_once_at_its_position(
    rule: str, case: tuple[list[Event], int, str]
) -> None:
    events, position, name = case
    [violation] = check(events)
    assert violation.rule == rule
    assert violation.position == position
    assert violation.event == name
    assert violation.detail


def test_violation_str_names_position_and_rule() -> None:
    violation = Violation(7, "content_block_start", Rule.INDEX_SEQUENCE, "block index 3")
    rendered = str(violation)
    assert "#7" in rendered
    assert "[index-sequence]" in rendered
    assert "content_block_start" in rendered
    [found] = check(RULE_CASES[Rule.INDEX_SEQUENCE][0])
    assert str(found).startswith("#4 content_block_start: [index-sequence]")


# -- more ways to break some rules ---------------------------------------------------------


def _in_block(bad: Event) -> list[Event]:
    return [message_start(), bad, stop(0), *end()]


def _in_message(bad: Event) -> list[Event]:
    return [message_start(), bad, *end()]


@pytest.mark.parametrize(
    ("events", "position"),
    [
        pytest.param(_in_message(Event("ping", b"{not json")), 1, id="not-json"),
        pytest.param(_in_message(Event("ping", b"[1,2]")), 1, id="not-an-object"),
        pytest.param(_in_message(Event("ping", b'{"type":"pong"}')), 1, id="type-mismatch"),
        pytest.param([ev("message_start"), *end()], 0, id="no-message-object"),
        pytest.param(_in_message(ev("content_block_start", index=0)), 1, id="start-no-block"),
        pytest.param(_in_message(start(-1, "text")), 1, id="negative-start-index"),
        pytest.param(_in_block(start(0, "tool_use", id="call_1")), 1, id="tool-use-no-name"),
        pytest.param(_in_block(start(0, "tool_result")), 1, id="tool-result-no-id"),
        pytest.param(_in_message(ev("content_block_delta", index=0)), 1, id="delta-no-delta"),
        pytest.param(_in_message(text(-1)), 1, id="negative-delta-index"),
        pytest.param(_in_message(ev("content_block_stop")), 1, id="stop-no-index"),
        pytest.param(_in_message(stop(-1)), 1, id="negative-stop-index"),
        pytest.param(_in_message(ev("content_block_stop", index="0")), 1, id="string-index"),
        pytest.param(
            [message_start(), ev("message_delta", usage={}), message_stop()],
            1,
            id="message-delta-no-delta",
        ),
        pytest.param(
            [message_start(), *end(), ev("error", error={"type": "x"})], 3, id="error-no-message"
        ),
    ],
)
def test_payload_violations(events: list[Event], position: int) -> None:
    found = check(events)
    assert [(v.rule, v.position) for v in found] == [(Rule.PAYLOAD, position)]


def test_negative_index_cannot_pose_as_no_open_block() -> None:
    # -1 is the checker's own "no block open" marker; it must not match it.
    found = check([message_start(), text(-1), stop(-1), *end()])
    assert [(v.rule, v.position) for v in found] == [(Rule.PAYLOAD, 1), (Rule.PAYLOAD, 2)]


def test_empty_text_block_without_deltas() -> None:
    [violation] = check([message_start(), text_start(0), stop(0), *end()])
    assert (violation.rule, violation.position) == (Rule.EMPTY_BLOCK, 2)


def test_stop_for_a_block_that_is_not_open() -> None:
    [violation] = check([message_start(), *text_block(0), stop(0), *end()])
    assert (violation.rule, violation.position) == (Rule.BLOCK_NOT_OPEN, 4)


def test_message_stop_with_a_block_open() -> None:
    [violation] = check([message_start(), text_start(0), text(0), message_stop()])
    assert (violation.rule, violation.position) == (Rule.UNCLOSED_BLOCK, 3)


def test_thinking_delta_in_a_text_block() -> None:
    [violation] = check([message_start(), text_start(0), thinking(0), text(0), stop(0), *end()])
    assert (violation.rule, violation.position) == (Rule.DELTA_TYPE, 2)


def test_an_event_before_message_start_and_one_after_stop_are_told_apart() -> None:
    found = check([text(0), message_start(), *text_block(0), *end(), text(0)])
    assert [(v.rule, v.position) for v in found] == [
        (Rule.MESSAGE_START_FIRST, 0),
        (Rule.AFTER_MESSAGE_STOP, 7),
    ]


def test_an_error_ends_the_message() -> None:
    found = check([message_start(), text_start(0), text(0), error(), text(0)])
    assert [(v.rule, v.position) for v in found] == [(Rule.AFTER_MESSAGE_STOP, 4)]


def test_a_new_round_of_tools_may_follow_answered_results() -> None:
    events = [
        message_start(),
        *use_block(0, "call_a"),
        *result_block(1, "call_a"),
        *use_block(2, "call_b"),
        *use_block(3, "call_c"),
        *result_block(4, "call_c"),
        *result_block(5, "call_b"),
        *end(),
    ]
    assert check(events) == []


def test_one_mistake_is_reported_once() -> None:
    events = [
        message_start(),
        text_start(0),
        text(0),
        use_start(1, "call_1"),  # text block 0 never closed
        args(1),
        stop(1),
        *text_block(2),
        *end(),
    ]
    found = check(events)
    assert [(v.rule, v.position) for v in found] == [(Rule.ONE_OPEN_BLOCK, 3)]


def test_several_violations_come_in_order() -> None:
    events = [message_start(), *text_block(1), *text_block(3), *result_block(4, "x")]
    found = check(events)
    assert [(v.rule, v.position) for v in found] == [
        (Rule.INDEX_SEQUENCE, 4),
        (Rule.TOOL_RESULT_UNKNOWN_USE, 7),
        (Rule.INCOMPLETE, 10),
    ]


# -- valid streams ---------------------------------------------------------------------------


def test_a_whole_turn_passes() -> None:
    events = [
        message_start(),
        ping(),
        thinking_start(0),
        thinking(0),
        delta(0, "signature_delta", signature="sig"),
        stop(0),
        *text_block(1),
        *use_block(2, "call_1"),
        *result_block(3, "call_1"),
        message_delta("tool_use"),
        message_stop(),
    ]
    assert check(events) == []


def test_several_messages_in_one_stream_pass() -> None:
    events = [
        message_start("msg_1"),
        *text_block(0),
        *use_block(1, "call_1"),
        message_delta("tool_use"),
        message_stop(),
        message_start("msg_2"),
        *result_block(0, "call_1"),  # the result of the previous message's call
        *text_block(1),
        *end(),
        message_start("msg_3"),
        *text_block(0),
        *end(),
    ]
    assert check(events) == []


def test_an_empty_stream_and_an_empty_message_pass() -> None:
    assert check([]) == []
    assert check([message_start(), *end()]) == []


def test_ping_anywhere() -> None:
    events = [
        ping(),
        message_start(),
        ping(),
        text_start(0),
        ping(),
        text(0),
        ping(),
        stop(0),
        ping(),
        message_delta(),
        ping(),
        message_stop(),
        ping(),
    ]
    assert check(events) == []


def test_first_block_may_start_at_any_index() -> None:
    assert check([message_start(), *text_block(5), *text_block(6), *end()]) == []


def test_unknown_events_blocks_and_deltas_pass() -> None:
    events = [
        Event("progress", b'{"type":"progress","percent":10}'),
        Event("custom", b'{"type":"custom","nested":{"index":-1}}'),
        message_start(),
        start(0, "image", source={"type": "url"}),
        delta(0, "image_delta", bytes="AAAA"),
        delta(0, "text_delta", text="a caption"),
        stop(0),
        text_start(1),
        delta(1, "citations_delta", citation={"cited_text": "x"}),
        text(1),
        stop(1),
        start(2, "server_tool_use", id="srv_1", name="web_search", input={}),
        stop(2),
        Event("progress", b'{"type":"progress","percent":90}'),
        *end(),
    ]
    assert check(events) == []


def test_error_outside_a_message_passes() -> None:
    assert check([error()]) == []
    assert check([message_start(), *text_block(0), *end(), error()]) == []


def test_seed_002_style_streams_pass() -> None:
    # Field order as a provider sends it, usage with cache counts, pings around blocks, the
    # first input_json_delta empty, and a tool_use message that ends without a result.
    def raw(name: str, data: str) -> Event:
        return Event(name, data.encode())

    text_turn = [
        raw(
            "message_start",
            '{"message":{"id":"01M3","type":"message","usage":{"input_tokens":32,'
            '"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":1},'
            '"role":"assistant","content":[],"model":"m","stop_sequence":null,'
            '"stop_reason":null},"type":"message_start"}',
        ),
        raw("ping", '{"type":"ping"}'),
        raw(
            "content_block_start",
            '{"index":0,"type":"content_block_start","content_block":{"type":"text","text":""}}',
        ),
        raw("ping", '{"type":"ping"}'),
        raw(
            "content_block_delta",
            '{"index":0,"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}',
        ),
        raw("content_block_stop", '{"index":0,"type":"content_block_stop"}'),
        raw(
            "message_delta",
            '{"type":"message_delta","usage":{"input_tokens":32,"cache_read_input_tokens":0,'
            '"cache_creation_input_tokens":0,"output_tokens":7},'
            '"delta":{"stop_sequence":null,"stop_reason":"end_turn"}}',
        ),
        raw("message_stop", '{"type":"message_stop"}'),
    ]
    tool_turn = [
        text_turn[0],
        raw("ping", '{"type":"ping"}'),
        raw(
            "content_block_start",
            '{"index":0,"type":"content_block_start","content_block":{"id":"toolu_01",'
            '"input":{},"name":"get_weather","type":"tool_use"}}',
        ),
        raw("ping", '{"type":"ping"}'),
        *[
            raw(
                "content_block_delta",
                '{"index":0,"type":"content_block_delta","delta":{"type":"input_json_delta",'
                '"partial_json":' + orjson.dumps(part).decode() + "}}",
            )
            for part in ["", '{"city": ', '"Taipe', 'i"}']
        ],
        raw("content_block_stop", '{"index":0,"type":"content_block_stop"}'),
        raw(
            "message_delta",
            '{"type":"message_delta","usage":{"input_tokens":672,"output_tokens":39},'
            '"delta":{"stop_sequence":null,"stop_reason":"tool_use"}}',
        ),
        raw("message_stop", '{"type":"message_stop"}'),
    ]
    assert check(text_turn) == []
    assert check(tool_turn) == []


def test_anthropic_thinking_with_signature_only_passes() -> None:
    events = [
        message_start(),
        start(0, "thinking", thinking=""),
        delta(0, "signature_delta", signature="sig"),
        stop(0),
        *end(),
    ]
    assert check(events) == []


# -- the incremental checker ---------------------------------------------------------------


def _payload(event: Event) -> Any:
    return orjson.loads(event.data)


def test_validate_does_not_record() -> None:
    checker = ProtocolChecker()
    start_event = message_start()
    assert checker.validate(start_event.event, _payload(start_event)) == []
    assert checker.position == 0
    assert not checker.in_message
    [violation] = checker.validate("content_block_start", _payload(text_start(0)))
    assert violation.rule == Rule.MESSAGE_START_FIRST


def test_feed_records_even_a_violation() -> None:
    checker = ProtocolChecker()
    checker.feed_event(message_start())
    checker.feed_event(text_start(0))
    [violation] = checker.feed("content_block_start", _payload(use_start(1, "call_1")))
    assert violation.rule == Rule.ONE_OPEN_BLOCK
    assert checker.open_block == (1, "tool_use")
    assert checker.position == 3


def test_accept_records_only_a_clean_event() -> None:
    checker = ProtocolChecker()
    assert checker.accept("message_start", _payload(message_start())) == []
    assert checker.in_message
    assert checker.accept("content_block_start", _payload(text_start(0))) == []
    assert checker.open_block == (0, "text")
    [violation] = checker.accept("content_block_start", _payload(text_start(1)))
    assert violation.rule == Rule.ONE_OPEN_BLOCK
    assert checker.open_block == (0, "text")
    assert checker.position == 2
    # An empty delta is accepted but gives the block no content.
    assert checker.accept("content_block_delta", _payload(text(0, ""))) == []
    [violation] = checker.accept("content_block_stop", _payload(stop(0)))
    assert violation.rule == Rule.EMPTY_BLOCK
    assert checker.accept("content_block_delta", _payload(text(0))) == []
    assert checker.accept("content_block_stop", _payload(stop(0))) == []
    assert checker.open_block is None
    assert checker.accept("message_stop", {"type": "message_stop"}) == []
    assert not checker.in_message
    assert checker.finish() == []


def test_finish_reports_an_open_message_at_the_end_position() -> None:
    checker = ProtocolChecker()
    checker.feed_event(message_start())
    checker.feed_event(ping())
    [violation] = checker.finish()
    assert (violation.rule, violation.position, violation.event) == (Rule.INCOMPLETE, 2, "(end)")


def test_bad_json_is_a_violation_and_counts_as_an_event() -> None:
    found = check([message_start(), Event("content_block_delta", b"\xff"), *end()])
    assert [(v.rule, v.position) for v in found] == [(Rule.PAYLOAD, 1)]


# -- the strict Publisher's fast paths agree with the whole check -----------------------

# An index is one of a few, or (most often) the last block started's: the deltas and
# stops a producer sends, at the open block or just beside it.
_INDEX = st.sampled_from(["open", "open", "open", -1, 0, 1, 2])
_STEPS = st.one_of(
    st.tuples(st.just("message_start"), st.just(0), st.just("")),
    st.tuples(
        st.just("block_start"),
        _INDEX,
        st.sampled_from(["text", "thinking", "tool_use", "server_tool_use"]),
    ),
    st.tuples(st.just("block_stop"), _INDEX, st.just("")),
    st.tuples(st.just("message_stop"), st.just(0), st.just("")),
    st.tuples(st.just("error"), st.just(0), st.just("")),
    st.tuples(
        st.just("delta"),
        _INDEX,
        st.sampled_from(["text_delta", "thinking_delta", "input_json_delta"]),
    ),
)
_BLOCKS: dict[str, dict[str, Any]] = {
    "text": {"text": ""},
    "thinking": {"thinking": ""},
    "tool_use": {"id": "toolu_1", "name": "f", "input": {}},
    "server_tool_use": {"id": "srvtoolu_1", "name": "web_search", "input": {}},
}
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


def _step_event(kind: str, index: int, which: str, has_content: bool) -> Event:
    if kind == "message_start":
        return message_start()
    if kind == "block_start":
        return start(index, which, **_BLOCKS[which])
    if kind == "block_stop":
        return ev("content_block_stop", index=index)
    if kind == "message_stop":
        return ev("message_stop")
    if kind == "error":
        return ev("error", error={"type": "api_error", "message": "m"})
    content = "x" if has_content else ""
    return ev(
        "content_block_delta", index=index, delta={"type": which, _DELTA_FIELDS[which]: content}
    )


def _text_block_then(*after: str) -> list[tuple[tuple[str, int | str, str], bool]]:
    """A message with a text block at 0 that has text, then ``after``'s steps, then a
    text delta to 0."""
    steps = {
        "stop": ("block_stop", "open", ""),
        "message_stop": ("message_stop", 0, ""),
        "error": ("error", 0, ""),
    }
    return [
        (("message_start", 0, ""), False),
        (("block_start", 0, "text"), False),
        (("delta", 0, "text_delta"), True),
        *[(steps[name], False) for name in after],
        (("delta", 0, "text_delta"), True),
    ]


@given(steps=st.lists(st.tuples(_STEPS, st.booleans()), max_size=30))
@example(steps=_text_block_then())
@example(steps=_text_block_then("stop"))
@example(
    steps=[
        (("message_start", 0, ""), False),
        (("block_start", 0, "thinking"), False),
        (("delta", 0, "text_delta"), True),
    ]
)
@example(steps=_text_block_then("message_stop"))
@example(steps=_text_block_then("error"))
@settings(max_examples=500, deadline=None)
def test_the_delta_fast_paths_take_exactly_what_the_whole_check_accepts(
    steps: list[tuple[tuple[str, int | str, str], bool]],
) -> None:
    # Every step goes to a checker fed whole (accept) and to one that takes each delta
    # through accept_delta / accept_text_delta first, as a strict Publisher does: a fast
    # path that says yes must be one the whole check agrees with, and whatever it says,
    # both checkers must end every step in the same state.
    whole, fast = ProtocolChecker(), ProtocolChecker()
    last_started = 0
    for (kind, choice, which), has_content in steps:
        index = last_started if choice == "open" else int(choice)
        if kind == "block_start":
            last_started = index
        event = _step_event(kind, index, which, has_content)
        payload = orjson.loads(event.data)
        expected = whole.accept(event.event, payload)
        if kind == "delta":
            taken = (
                fast.accept_text_delta(index, has_content)
                if which == "text_delta"
                else fast.accept_delta(index, which, has_content)
            )
            if taken:
                assert expected == []
            else:
                assert fast.accept(event.event, payload) == expected
        else:
            assert fast.accept(event.event, payload) == expected
        assert fast.position == whole.position
        assert fast.open_block == whole.open_block
        assert fast.in_message == whole.in_message
    assert fast.finish() == whole.finish()
