"""Turns that ask: the protocol's requests, what a stream waits for, and the hub's answer
path (exactly once, refusals), on the in-memory store. The shared stores and the
dialects have tests of their own (test_asking_replicas.py, the dialect tests)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from essessey import (
    AnswerConflict,
    Answered,
    AnswerExpired,
    ApprovalRequest,
    ClientToolCall,
    InMemoryEventStore,
    InMemorySink,
    InvalidAnswer,
    NotWaiting,
    ProtocolError,
    Publisher,
    Question,
    QuestionAnswer,
    StopReason,
    StreamHub,
    StreamNotFound,
    ToolApproval,
    ToolOutput,
    check,
    continue_turn,
    reassemble_events,
    stream_turn,
)
from essessey.adapters import continue_rounds, stream_rounds
from essessey.adapters.rounds import ToolCallRequest

pytestmark = pytest.mark.anyio


async def ask_approval_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
        await (await turn.text()).write("I will send it.")
        tools = await turn.tools()
        await tools.start_call("call_1", "send_email", '{"to":"a@b.c"}')
        await turn.ask_approval("call_1", reason="sends mail", request_id="apr_1")


async def ask_everything_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_1", "send_email", '{"to":"a@b.c"}')
        await turn.ask_approval("call_1", request_id="apr_1")
        await turn.call_client_tool("get_location", {}, tool_use_id="call_2")
        await turn.ask("Which unit?", schema={"enum": ["C", "F"]}, request_id="q_1")


async def go_on(publisher: Publisher, answered: Answered) -> None:
    async with continue_turn(publisher, answered) as turn:
        for request, approval in answered.approvals():
            if approval.approved:
                await turn.tool_result(request.tool_use_id, {"sent": True})
        await (await turn.text()).write("Done.")


async def test_a_turn_that_asks_ends_waiting_and_reassembles_to_its_requests() -> None:
    sink = InMemorySink()
    await ask_everything_turn(Publisher(sink))
    events = sink.events
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.stop_reason == StopReason.TOOL_USE
    approval, call, question = parsed.pending
    assert approval == ApprovalRequest(
        "apr_1",
        "call_1",
        "send_email",
        {"to": "a@b.c"},
        '{"to":"a@b.c"}',
        None,
        approval.expires_at,
    )
    assert approval.expires_at is not None
    assert approval.expires_at > time.time() + 3000
    assert call == ClientToolCall("call_2", "get_location", {}, "{}")
    assert question == Question("q_1", "Which unit?", {"enum": ["C", "F"]}, question.expires_at)
    # The approved call is not the client's to run: it gets no error result either.
    assert parsed.tool_results == ()


async def test_a_tool_streamer_does_not_answer_a_deferred_call() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_1", "f", "{}")
        await tools.start_call("call_2", "g", "{}")
        tools.defer("call_2")
        await tools.write_result("call_1", "ok")
        with pytest.raises(ProtocolError, match="deferred"):
            await tools.write_result("call_2", "no")
        turn.stop_reason = StopReason.TOOL_USE
    parsed = reassemble_events(sink.events)
    assert [r.tool_use_id for r in parsed.tool_results] == ["call_1"]
    assert [r.id for r in parsed.pending] == ["call_2"]


async def test_the_checker_refuses_an_asking_message_that_does_not_wait() -> None:
    async def asks_and_ends(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await turn.ask("Why?")
            turn.stop_reason = StopReason.END_TURN

    with pytest.raises(ProtocolError, match="asking-stop-reason"):
        await asks_and_ends(Publisher(InMemorySink()))


async def test_an_approval_needs_a_call_of_its_message() -> None:
    publisher = Publisher(InMemorySink())
    with pytest.raises(ProtocolError, match="approval-unknown-call"):
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await turn.ask_approval("call_nope")


async def ask_by_a_call_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_1", "book", '{"table":8}')
        await turn.ask("Which day?", request_id="q_1", tool_use_id="call_1", expires_in=None)


async def go_on_with_the_call(publisher: Publisher, answered: Answered) -> None:
    async with continue_turn(publisher, answered) as turn:
        for question, answer in answered.questions():
            assert question.tool_use_id is not None
            await turn.tool_result(question.tool_use_id, f"booked on {answer.value}")
        await (await turn.text()).write("Booked.")


async def test_a_call_s_question_gates_it_and_its_result_follows_the_answer() -> None:
    # A call that asks before it can end (a tool asking its user): the question names it,
    # so the call is not the client's to run; its result comes after the answer.
    async with StreamHub(on_answer=go_on_with_the_call) as hub:
        await _hub_waiting(hub, ask_by_a_call_turn)
        asked = await hub.waiting("s")
        assert asked is not None
        assert asked.requests == (Question("q_1", "Which day?", tool_use_id="call_1"),)
        done = await hub.answer("s", [QuestionAnswer("q_1", "Friday")])
        assert done.started
        await hub.wait("s")
        events = await _events(hub)
    assert check(events) == []
    parsed = reassemble_events(events)
    [execution] = parsed.executions
    assert (execution.call.name, execution.result) == ("book", "booked on Friday")
    assert parsed.messages[-1].text == "Booked."


async def test_a_question_can_name_only_a_call_of_its_message_without_a_result() -> None:
    publisher = Publisher(InMemorySink())
    with pytest.raises(ProtocolError, match="approval-unknown-call"):
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await turn.ask("Which day?", tool_use_id="call_nope")


async def test_rounds_ask_between_rounds() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    async with stream_rounds(publisher, message_id="m1", stream_id="s", model="m") as rounds:
        await rounds.round_start()
        await rounds.tool_call_start(0, ToolCallRequest("call_1", "pay", '{"usd":5}'))
        await rounds.round_end(answer_missing=False)
        await rounds.ask_approval("call_1", request_id="apr_1", expires_in=None)
    parsed = reassemble_events(sink.events)
    assert check(sink.events) == []
    [request] = parsed.pending
    assert request == ApprovalRequest("apr_1", "call_1", "pay", {"usd": 5}, '{"usd":5}')


async def _hub_waiting(hub: StreamHub, producer: Any = ask_approval_turn) -> None:
    await hub.start("s", producer)
    await hub.wait("s")


async def _events(hub: StreamHub) -> list[Any]:
    events, _ = await hub.store.since("s", None)
    return events


async def test_an_approval_continues_the_turn_once_in_the_same_stream() -> None:
    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub)
        asked = await hub.waiting("s")
        assert asked is not None
        assert [r.id for r in asked.requests] == ["apr_1"]
        done = await hub.answer("s", [ToolApproval("apr_1", True)])
        assert done.started
        assert done.after == asked.last_event_id
        await hub.wait("s")
        again = await hub.answer("s", [ToolApproval("apr_1", True)])
        assert not again.started
        assert again.after == done.after
        events = await _events(hub)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert len(parsed.messages) == 2
    assert parsed.pending == ()
    assert parsed.waiting is not None
    assert parsed.waiting.answered == {"apr_1": ToolApproval("apr_1", True)}
    [execution] = parsed.executions
    assert execution.call.name == "send_email"
    assert execution.result == '{"sent":true}'
    assert parsed.messages[1].text == "Done."
    assert parsed.stop_reason == StopReason.END_TURN


async def test_two_answers_at_once_continue_the_turn_once() -> None:
    runs: list[str] = []

    async def counted(publisher: Publisher, answered: Answered) -> None:
        runs.append(answered.message_id)
        await go_on(publisher, answered)

    async with StreamHub(on_answer=counted) as hub:
        await _hub_waiting(hub)
        results: list[Any] = []

        async def answer() -> None:
            results.append(await hub.answer("s", [ToolApproval("apr_1", True)]))

        async with anyio.create_task_group() as tasks:
            for _ in range(5):
                tasks.start_soon(answer)
        await hub.wait("s")
        events = await _events(hub)
    assert len(runs) == 1
    assert sorted(r.started for r in results) == [False, False, False, False, True]
    assert len({r.after for r in results}) == 1
    assert len(reassemble_events(events).messages) == 2


async def test_a_different_second_answer_is_refused() -> None:
    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub)
        await hub.answer("s", [ToolApproval("apr_1", True)])
        with pytest.raises(AnswerConflict):
            await hub.answer("s", [ToolApproval("apr_1", False, "no")])
        await hub.wait("s")
        with pytest.raises(AnswerConflict) as refused:
            await hub.answer("s", [ToolApproval("apr_1", False)])
    assert refused.value.status == 409
    assert refused.value.code == "already_answered"


async def ask_a_question_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
        await turn.ask("How many?", request_id="q_1", expires_in=None)


async def say_the_answer(publisher: Publisher, answered: Answered) -> None:
    async with continue_turn(publisher, answered) as turn:
        [(_, answer)] = answered.questions()
        await (await turn.text()).write(repr(answer.value))


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (1, True, False),
        (0, False, False),
        ({"a": 1}, {"a": True}, False),
        ([1, [0]], [1, [False]], False),
        (None, False, False),
        ("1", 1, False),
        ({"a": 1, "b": [True]}, {"b": [True], "a": 1}, True),  # key order is not JSON's
        (1, 1.0, True),  # one JSON number
        ([], {}, False),
    ],
)
async def test_a_second_answer_to_a_question_is_compared_as_json(
    first: Any, second: Any, same: bool
) -> None:
    # Python's == takes true for 1 and false for 0: a different answer taken for a retry.
    async with StreamHub(on_answer=say_the_answer) as hub:
        await _hub_waiting(hub, ask_a_question_turn)
        assert (await hub.answer("s", [QuestionAnswer("q_1", first)])).started
        await hub.wait("s")
        if same:
            again = await hub.answer("s", [QuestionAnswer("q_1", second)])
            assert not again.started
        else:
            with pytest.raises(AnswerConflict):
                await hub.answer("s", [QuestionAnswer("q_1", second)])


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ([], "unanswered"),
        ([ToolApproval("apr_2", True)], "does not wait"),
        ([ToolOutput("apr_1", "x")], "ToolApproval answers it"),
        ([ToolApproval("apr_1", True), ToolApproval("apr_1", True)], "twice"),
    ],
)
async def test_a_bad_answer_is_a_400_and_writes_nothing(answers: Any, message: str) -> None:
    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub)
        before = await _events(hub)
        with pytest.raises(InvalidAnswer, match=message) as refused:
            await hub.answer("s", answers)
        assert refused.value.status == 400
        assert await _events(hub) == before


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "answer",
    [
        ToolApproval("apr_1", False, "no \ud800"),  # a lone surrogate
        ToolOutput("call_2", {"n": 2**64}),  # past 64 bits
        ToolOutput("call_2", {1, 2}),  # not JSON
        QuestionAnswer("q_1", _nested(300)),  # deeper than orjson writes
    ],
    ids=["surrogate", "big-int", "set", "nested"],
)
async def test_an_answer_that_cannot_be_recorded_is_refused_and_the_stream_still_waits(
    answer: Any,
) -> None:
    # Taken, its record failed to write: the continuation ended with an error event and
    # the stream's question was lost.
    good: dict[str, Any] = {
        "apr_1": ToolApproval("apr_1", True),
        "call_2": ToolOutput("call_2", "here"),
        "q_1": QuestionAnswer("q_1", "C"),
    }
    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub, ask_everything_turn)
        before = await _events(hub)
        with pytest.raises(InvalidAnswer, match="cannot be written as JSON"):
            await hub.answer("s", [*(a for k, a in good.items() if k != answer.request_id), answer])
        assert await _events(hub) == before
        continued = await hub.answer("s", list(good.values()))
        assert continued.started


async def test_a_stream_that_asks_nothing_or_is_unknown_is_refused() -> None:
    async def plain(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await (await turn.text()).write("hi")

    async with StreamHub(on_answer=go_on) as hub:
        with pytest.raises(StreamNotFound):
            await hub.answer("s", [ToolApproval("apr_1", True)])
        await _hub_waiting(hub, plain)
        with pytest.raises(NotWaiting):
            await hub.answer("s", [ToolApproval("apr_1", True)])


async def test_an_answer_to_a_running_turn_is_refused_after_a_bounded_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import essessey.hub

    monkeypatch.setattr(essessey.hub, "ANSWER_WAIT", 0.2)
    release = anyio.Event()

    async def asks_then_runs_on(publisher: Publisher) -> None:
        await ask_approval_turn(publisher)
        async with stream_turn(publisher, message_id="m2", stream_id="s", model="m") as turn:
            await (await turn.text()).write("still going")
            await release.wait()

    async with StreamHub(on_answer=go_on) as hub:
        await hub.start("s", asks_then_runs_on)
        await anyio.sleep(0.05)
        with pytest.raises(NotWaiting, match="running"):
            await hub.answer("s", [ToolApproval("apr_1", True)])
        release.set()
        await hub.wait("s")
        # The stream went on past the question without an answer.
        with pytest.raises(NotWaiting, match="without an answer"):
            await hub.answer("s", [ToolApproval("apr_1", True)])


async def _answered_once_released(hub: StreamHub, release: anyio.Event) -> list[bool]:
    """Answer apr_1 of stream "s" while its turn still runs: the answer waits (nothing
    for 0.2 s), ``release`` lets the turn end, then each answer's ``started``."""
    outcome: list[Any] = []
    async with anyio.create_task_group() as tasks:

        async def answer() -> None:
            outcome.append(await hub.answer("s", [ToolApproval("apr_1", True)]))

        tasks.start_soon(answer)
        await anyio.sleep(0.2)
        assert outcome == []  # still waiting for the asking turn to end
        release.set()
    await hub.wait("s")
    return [continued.started for continued in outcome]


async def test_an_answer_while_the_asking_turn_ends_goes_on_once_it_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client answers as soon as it reads the question, while the asking turn is still
    # finishing (here, held open after its message): the answer waits for the turn's end
    # and then starts the continuation, instead of waiting for a record nobody writes.
    import essessey.hub

    monkeypatch.setattr(essessey.hub, "ANSWER_WAIT", 5.0)
    asked, release = anyio.Event(), anyio.Event()

    async def asks_then_lingers(publisher: Publisher) -> None:
        await ask_approval_turn(publisher)
        asked.set()
        await release.wait()

    async with StreamHub(on_answer=go_on) as hub:
        await hub.start("s", asks_then_lingers)
        with anyio.fail_after(5):
            await asked.wait()
        assert await hub.waiting("s") is not None
        assert hub.running("s")
        assert await _answered_once_released(hub, release) == [True]


async def test_an_answer_read_before_the_asking_message_ends_waits_for_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client answers as soon as it reads the approval request, while the turn still
    # writes its message (the request is out, the message's end is not): the stream asks
    # nothing yet, and the answer waits for the message and the turn to end instead of a
    # 409 at once.
    import essessey.hub

    monkeypatch.setattr(essessey.hub, "ANSWER_WAIT", 5.0)
    asked, release = anyio.Event(), anyio.Event()

    async def asks_mid_message(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            tools = await turn.tools()
            await tools.start_call("call_1", "send_email", '{"to":"a@b.c"}')
            await turn.ask_approval("call_1", request_id="apr_1")
            asked.set()
            await release.wait()  # the producer's work before the message ends

    async with StreamHub(on_answer=go_on) as hub:
        await hub.start("s", asks_mid_message)
        with anyio.fail_after(5):
            await asked.wait()
        assert await hub.waiting("s") is None  # the asking message has not ended
        assert await _answered_once_released(hub, release) == [True]


async def test_an_answer_to_a_running_turn_that_never_asks_is_refused_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import essessey.hub

    monkeypatch.setattr(essessey.hub, "ANSWER_WAIT", 0.2)
    release = anyio.Event()

    async def talks(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await (await turn.text()).write("thinking it over")
            await release.wait()

    async with StreamHub(on_answer=go_on) as hub:
        await hub.start("s", talks)
        await anyio.sleep(0.05)
        with pytest.raises(NotWaiting, match="asks nothing"):
            await hub.answer("s", [ToolApproval("apr_1", True)])
        release.set()


async def test_an_expired_request_takes_no_answer() -> None:
    async def short(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await turn.ask("Now?", expires_in=0.05, request_id="q_1")

    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub, short)
        waiting = await hub.waiting("s")
        assert waiting is not None
        request = waiting.request("q_1")
        assert request is not None
        assert request.expires_at is not None
        # Answers are refused once the clock is past expires_at (whole seconds): wait for it.
        await anyio.sleep(max(request.expires_at - time.time() + 0.05, 0))
        with pytest.raises(AnswerExpired):
            await hub.answer("s", [QuestionAnswer("q_1", "yes")])


async def test_every_kind_of_answer_is_recorded_and_given_typed() -> None:
    seen: list[Answered] = []

    async def record(publisher: Publisher, answered: Answered) -> None:
        seen.append(answered)
        async with continue_rounds(publisher, answered) as rounds:
            await rounds.earlier_result("call_1", "denied, not sent", is_error=True)

    answers = [
        ToolApproval("apr_1", False, "not now"),
        ToolOutput("call_2", {"lat": 1.5}),
        QuestionAnswer("q_1", "C"),
    ]
    async with StreamHub(on_answer=record) as hub:
        await _hub_waiting(hub, ask_everything_turn)
        await hub.answer("s", answers)
        await hub.wait("s")
        assert not (await hub.answer("s", list(reversed(answers)))).started
        events = await _events(hub)
    [answered] = seen
    assert answered.next_index == 3
    assert [(r.id, a) for r, a in answered.approvals()] == [("apr_1", answers[0])]
    assert [(r.name, a.output) for r, a in answered.tool_outputs()] == [
        ("get_location", {"lat": 1.5})
    ]
    assert [(r.question, a.value) for r, a in answered.questions()] == [("Which unit?", "C")]
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.waiting is not None
    assert parsed.waiting.answered == {
        "apr_1": answers[0],
        "call_2": ToolOutput("call_2", '{"lat":1.5}'),
        "q_1": answers[2],
    }


async def test_a_request_finds_its_stream() -> None:
    async with StreamHub(on_answer=go_on) as hub:
        await _hub_waiting(hub)
        assert await hub.asking_stream("apr_1") == "s"
        assert await hub.asking_stream("apr_nope") is None


async def test_an_answer_that_finds_another_continuation_half_written_waits_for_its_record() -> (
    None
):
    # Two hubs on one store, as two replicas: the stream was continued by hub A, whose
    # records are not all written yet when hub B takes the same answers. B waits for the
    # whole record, then sees its own answers there: the same continuation, not a refusal.
    from essessey import ApprovalRequest as Request
    from essessey import InMemoryEventStore

    store = InMemoryEventStore()
    halfway = anyio.Event()
    go = anyio.Event()

    async def asks(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            tools = await turn.tools()
            await tools.start_call("call_1", "f", "{}")
            await tools.start_call("call_2", "g", "{}")
            await turn.ask_approval("call_1", request_id="apr_1")
            await turn.ask_approval("call_2", request_id="apr_2")

    async def slow_continuation(publisher: Publisher) -> None:
        assert publisher.checker is not None
        publisher.checker.expect_answers(
            [Request("apr_1", "call_1", "f", {}), Request("apr_2", "call_2", "g", {})]
        )
        await publisher.send_stream_preamble("m2", "s", "m")
        await publisher.send_approval_response(0, "apr_1", True)
        halfway.set()
        await go.wait()
        await publisher.send_approval_response(1, "apr_2", False)
        await publisher.send_stream_epilogue("end_turn", 0)

    answers = [ToolApproval("apr_1", True), ToolApproval("apr_2", False)]
    async with StreamHub(store) as a, StreamHub(store, on_answer=go_on) as b:
        await a.start("s", asks)
        await a.wait("s")
        await a.start("s", slow_continuation)
        await halfway.wait()
        results: list[Any] = []

        async def answer() -> None:
            results.append(await b.answer("s", answers))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer)
            await anyio.sleep(0.2)  # B has read the half-written record by now
            assert results == []
            go.set()
        await a.wait("s")
        events, _ = await store.since("s", None)
    [done] = results
    assert done.started is False
    assert len(reassemble_events(events).messages) == 2


async def test_a_replica_s_half_written_tool_output_record_is_waited_for_not_compared() -> None:
    # Two hubs on one store (two replicas): A's continuation has written its record of a
    # client call's output up to the result block's start, its text still to come, when
    # the same answer reaches B. B must wait for the whole record and find it the same,
    # not compare the empty text read so far and refuse the answer as a different one.
    store = InMemoryEventStore()
    halfway, go = anyio.Event(), anyio.Event()

    async def asks(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            await turn.call_client_tool("get_location", {}, tool_use_id="call_1")

    async def a_s_continuation(publisher: Publisher) -> None:
        # What hub.answer writes for ToolOutput("call_1", "Oslo"), held between the
        # record's two appends.
        assert publisher.checker is not None
        publisher.checker.expect_answers([ClientToolCall("call_1", "get_location", {}, "{}")])
        await publisher.send_stream_preamble("m2", "s", "m")
        await publisher.send_tool_result_start(0, "call_1")
        halfway.set()
        await go.wait()
        await publisher.send_tool_result_delta(0, "Oslo")
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", 0)

    outcome: list[Any] = []
    async with StreamHub(store) as a, StreamHub(store, on_answer=go_on) as b:
        await a.start("s", asks)
        await a.wait("s")
        await a.start("s", a_s_continuation)
        await halfway.wait()

        async def answer_on_b() -> None:
            outcome.append(await b.answer("s", [ToolOutput("call_1", "Oslo")]))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer_on_b)
            await anyio.sleep(0.2)
            assert outcome == []  # waiting for the record
            go.set()
        await a.wait("s")
        with pytest.raises(AnswerConflict):  # a different output is still refused
            await b.answer("s", [ToolOutput("call_1", "Bergen")])
    [continued] = outcome
    assert not continued.started
