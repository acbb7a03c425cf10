"""Publish a LangGraph run as the protocol: every LLM call of the graph a round.

``graph.astream(input, config, stream_mode=["messages", "updates"])`` streams a compiled
graph's run as the chat models' message chunks, the messages the nodes return, and each
node's update. :func:`stream_run` publishes that stream into one message of a
:class:`~essessey.adapters.RoundStream` (:func:`graph_stream` starts it with the modes it
reads):

============================================  =========================================
LangGraph stream part                         published as
============================================  =========================================
``messages``: an ``AIMessageChunk``           the round of its LLM call (the chunks of
                                              one message id): its text (``content`` as
                                              a string, or its ``content_blocks``' text
                                              and refusal blocks) in a text block, its
                                              ``reasoning`` blocks (a provider's
                                              thinking, ``reasoning_content``,
                                              Mistral's thinking parts) in a thinking
                                              block with their signature; Anthropic's
                                              ``redacted_thinking``, a block of its own
``tool_call_chunks`` of those chunks          a tool_use block per ``index`` (and id),
                                              its id and name from the first fragment,
                                              the arguments streamed as they come
                                              (parallel calls too, interleaved or not)
their ``server_tool_call`` blocks (whole, or  a ``server_tool_use`` block once its input
``server_tool_call_chunk`` pieces) and        is whole, and its result block (the
``server_tool_result`` blocks (a tool the     provider's type, else
provider ran itself)                          ``<name>_tool_result``), where they came
other content blocks                          not published: a WARNING per type a run
``messages``: a whole ``AIMessage``           a round of its own, whole (a node that
                                              wrote the message itself, a subgraph's
                                              messages when ``subgraphs`` is off)
``messages``: a ``ToolMessage``               the ``tool_result`` of the call its
                                              ``tool_call_id`` names, ``is_error`` for
                                              ``status="error"`` (``ToolNode``'s error
                                              message for a tool that raised)
``updates``: ``__interrupt__``                what the message asks once the run
                                              stopped: each ``Interrupt`` a question
                                              (``rounds.ask``; a tool's, the question
                                              of its call), or the approval of a call
                                              (:func:`request_approval`)
``usage_metadata``, ``response_metadata``     the epilogue's usage (every call's summed),
                                              the model name (``model_name``), the stop
                                              reason (``finish_reason``/``stop_reason``,
                                              a Responses API ``incomplete`` status) and
                                              ``stop_details`` of the last call
============================================  =========================================

Only the LLM calls LangGraph streams in ``messages`` mode are published: a model bound with
the ``nostream`` tag (``model.with_config(tags=["nostream"])``, LangGraph's own way to keep
an internal call out of the stream) is not, and ``nodes`` limits the rounds to the LLM calls
of the nodes it names. A subgraph's LLM calls stream only with ``subgraphs=True`` (given to
``astream``); without it, the messages a subgraph node returns are published whole, when
the node ends. Human and system messages a node writes are not published.

Two LLM calls that stream at the same time (parallel branches) are published one after
the other: the chunks of the second are held until the first's output is whole. A call's
output is whole once the run goes on past its chunk at ``chunk_position="last"``: a
stream of several provider messages (ChatAnthropic marks each one's end last) is one
round. A call cut short (``max_tokens``, a refusal) made no calls to run: the message ends
with that stop reason, its calls without results.

A run that stops at ``interrupt()`` (LangGraph's human in the loop) ends its message
asking: an interrupt's value that is a string is the question, a mapping with a string
``"question"`` asks that (its ``"schema"``, else the interrupt's ``response_schema``, is the
answer's JSON schema), any other value is asked as its JSON text; the request's id is the
interrupt's own id. The value :func:`request_approval` interrupts with names a call of the
round that has no result: it becomes the approval of that call. The answer, in any
dialect, resumes the graph with ``Command(resume={interrupt id: value})``
(:class:`AgentTurns`); the graph's own state is its checkpointer's (a checkpointer every
replica shares, for replicas), and :class:`~essessey.adapters.RunStates` keeps only the
thread's config and the request ids. Calls a round made that the graph did not run (tools
the client runs, as AG-UI's frontend tools) end the message waiting for their outputs,
which go back as ``ToolMessage`` s. A ``ToolNode`` that runs a round's calls in one task
discards the others' results when one call interrupts (LangGraph runs them again when it
resumes): those calls stay without a result in the asking message, which the protocol
reads as the client's; one task per call (a ``Send`` each, as ``create_react_agent``
does) keeps their results (docs/langgraph.md).

An error the run raises ends the message with an ``error`` event and propagates; a run
whose turn is cancelled is cancelled too (its node tasks, the model's stream, a running
tool), and nothing of it keeps running. Logs carry types, counts and lengths, never text
or arguments.

The package's modules: ``_run`` reads the stream parts into the message, ``_round`` one
LLM call's chunks into a round, ``_approval`` the approval a graph asks for, ``_turns``
:class:`AgentTurns`.
"""

from essessey._public import missing_extra, set_public_module

try:
    from essessey.adapters.langgraph._approval import APPROVAL, Approval, request_approval
    from essessey.adapters.langgraph._run import (
        STREAM_MODES,
        Graph,
        PublishedRun,
        graph_stream,
        publish_run,
        stream_run,
    )
    from essessey.adapters.langgraph._turns import AgentTurns, graph_input
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(__name__, exc, extra="langgraph") from None

__all__ = [
    "APPROVAL",
    "STREAM_MODES",
    "AgentTurns",
    "Approval",
    "Graph",
    "PublishedRun",
    "graph_input",
    "graph_stream",
    "publish_run",
    "request_approval",
    "stream_run",
]

set_public_module(__name__, globals(), __all__)
