"""The demo's page: plain HTML and JavaScript, no build step, nothing fetched from elsewhere.

It is a Python string rather than a file beside the module so that every way of
installing the package ships it.

What it does, and the ids and attributes tests rely on:

- ``#controls`` (a form): ``#scenario``, ``#deltas``, ``#delay``, ``#transport`` (``sse`` or
  ``ws``), ``#start`` (POST /streams, then follow the turn), ``#drop`` (close the
  connection, reconnect with the last event id), ``#cancel`` (POST .../cancel);
- ``#status``, with ``data-state``: ``idle``, ``starting``, ``connecting``, ``resuming``,
  ``streaming``, ``reconnecting``, ``dropped``, ``waiting`` (the turn asks: see below),
  ``answering``, then ``done`` or ``failed`` (``data-stop-reason`` holds the stop reason);
- a turn that asks (docs/asking.md): ``.request-card`` per request with ``data-request-id``,
  ``data-kind`` (``approval``, ``question``, ``client_tool``) and ``data-state``
  (``pending``, then ``approved``, ``denied`` or ``answered``); an approval has
  ``button.approve`` and ``button.deny``, a question ``input.answer-input`` and
  ``button.send-answer``, the ``get_location`` call ``button.share-location``. Once every
  request has its answer the page posts them (``POST .../answer``) and resumes the stream
  after its last event: the continuation. A reload while waiting shows the requests
  again;
- ``#transcript``: the blocks in order: ``details.thinking`` (collapsed once its block
  ends), ``.text-block`` (the latest one also has the id ``answer``), ``.tool-card`` with
  ``data-tool-use-id``, ``data-state`` (``running``, ``done``, ``error``), ``.tool-name``,
  ``.tool-input`` and ``.tool-result`` (class ``is-error`` for a failed tool);
- ``#dialects``: a link per wire dialect (``a[data-dialect]``) to the turn served in it
  (``/streams/{id}``, ``/streams/{id}/as/{dialect}``);
- ``window.demoState``: what is shown, as kept in sessionStorage (``streamId``,
  ``lastEventId``, ``events``, ``connections``, ``blocks``, ``done``, ...).

The page keeps that state, with the id of the last event it applied, in sessionStorage
(saved at most every 100 ms, and when the page is hidden): a reload renders it and
resumes with ``?last_event_id=``, so nothing is shown twice.
"""

from __future__ import annotations

from typing import Final

from essessey.demo._scenario import DEFAULT_DELTAS

__all__ = ["FAVICON", "PAGE"]

_TEMPLATE: Final = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>essessey demo</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<style>
  :root {
    --fg: #1d2330; --muted: #687083; --line: #e2e5eb; --panel: #ffffff; --bg: #f5f6f8;
    --accent: #3b5bdb; --ok: #2b8a3e; --err: #c92a2a; --code: #f3f4f7;
  }
  * { box-sizing: border-box; }
  body { margin: 0; background: var(--bg); color: var(--fg);
         font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
  .wrap { max-width: 52rem; margin: 0 auto; padding: 1.5rem 1rem 3rem; }
  h1 { font-size: 1.35rem; margin: 0 0 .2rem; }
  .lede { color: var(--muted); margin: 0 0 1rem; }
  form { display: flex; flex-wrap: wrap; gap: .5rem .75rem; align-items: end;
         background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
         padding: .75rem; }
  label { display: flex; flex-direction: column; gap: .15rem; font-size: .75rem;
          color: var(--muted); }
  .actions { display: flex; gap: .5rem; flex-basis: 100%; }
  input, select { font: inherit; width: 7.5rem; padding: .3rem .45rem; background: #fff;
                  border: 1px solid var(--line); border-radius: 6px; color: var(--fg); }
  button { font: inherit; padding: .35rem .8rem; border-radius: 6px; cursor: pointer;
           border: 1px solid var(--line); background: #fff; color: var(--fg); }
  button#start { background: var(--accent); border-color: var(--accent); color: #fff; }
  button:disabled { opacity: .45; cursor: default; }
  .bar { display: flex; flex-wrap: wrap; gap: .25rem 1rem; align-items: center;
         margin: .9rem 0 0; font-size: .85rem; color: var(--muted); }
  #status { font-weight: 600; color: var(--fg); margin: 0; }
  #status::before { content: ""; display: inline-block; width: .55rem; height: .55rem;
                    border-radius: 50%; margin-right: .4rem; background: #adb5bd; }
  #status[data-state=streaming]::before { background: var(--accent); }
  #status[data-state=done]::before { background: var(--ok); }
  #status[data-state=failed]::before { background: var(--err); }
  #status[data-state=reconnecting]::before, #status[data-state=dropped]::before,
  #status[data-state=resuming]::before { background: #f08c00; }
  #transcript { display: flex; flex-direction: column; gap: .75rem; margin-top: 1rem; }
  .thinking { background: var(--panel); border: 1px dashed #cfd4dc; border-radius: 10px;
              padding: .5rem .8rem; color: var(--muted); }
  .thinking summary { cursor: pointer; font-weight: 600; }
  .thinking-text { white-space: pre-wrap; font-style: italic; margin-top: .35rem; }
  .text-block { white-space: pre-wrap; background: var(--panel); border: 1px solid var(--line);
                border-radius: 10px; padding: .75rem 1rem; }
  .tool-row { display: grid; grid-template-columns: repeat(auto-fit, minmax(14rem, 1fr));
              gap: .75rem; }
  .tool-card { background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
               border-left: 4px solid var(--accent); padding: .55rem .8rem .7rem; }
  .tool-card[data-state=done] { border-left-color: var(--ok); }
  .tool-card[data-state=error] { border-left-color: var(--err); }
  .tool-card header { display: flex; justify-content: space-between; gap: .5rem; }
  .tool-name { font-weight: 600; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
  .tool-state { font-size: .75rem; color: var(--muted); }
  .tool-card .caption { font-size: .7rem; text-transform: uppercase; letter-spacing: .04em;
                        color: var(--muted); margin-top: .45rem; }
  .tool-card pre { margin: .15rem 0 0; padding: .4rem .55rem; background: var(--code);
                   border-radius: 6px; white-space: pre-wrap; word-break: break-word;
                   font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; }
  .tool-result:empty::before { content: "running\2026"; color: var(--muted); font-style: italic; }
  .tool-result.is-error { background: #fff5f5; color: var(--err); }
  .other-block { font-size: .8rem; color: var(--muted); }
  .request-card { background: #fff9db; border: 1px solid #f5d565; border-radius: 10px;
                  padding: .6rem .8rem; display: flex; flex-wrap: wrap; gap: .5rem;
                  align-items: center; }
  .request-card[data-state=approved], .request-card[data-state=answered] {
    background: #ebfbee; border-color: #8ce99a; }
  .request-card[data-state=denied] { background: #fff5f5; border-color: #ffa8a8; }
  .request-card .request-text { flex: 1 1 18rem; }
  .request-card button.approve { background: var(--ok); border-color: var(--ok); color: #fff; }
  .request-card button.deny { background: var(--err); border-color: var(--err); color: #fff; }
  #status[data-state=waiting]::before { background: #f5d565; }
</style>
</head>
<body>
<div class="wrap">
<h1>essessey demo</h1>
<p class="lede">A scripted agent turn: it reasons, calls a tool twice in parallel, then
answers. The turn runs on the server, apart from this page: drop the connection or reload
the page and it picks up where it stopped.</p>
<form id="controls">
  <label>Scenario
    <select id="scenario"><option value="agent">agent</option>
      <option value="tool_error">tool_error</option>
      <option value="approval">approval</option>
      <option value="client_tool">client_tool</option></select></label>
  <label>Answer deltas
    <input id="deltas" type="number" min="1" max="100000" value="{{DEFAULT_DELTAS}}"></label>
  <label>Delay (ms) <input id="delay" type="number" min="0" max="10000" value="60"></label>
  <label>Transport
    <select id="transport"><option value="sse">SSE</option>
      <option value="ws">WebSocket</option></select></label>
  <div class="actions">
    <button id="start" type="submit">Run a turn</button>
    <button id="drop" type="button" disabled>Drop connection</button>
    <button id="cancel" type="button" disabled>Cancel</button>
  </div>
</form>
<div class="bar">
  <p id="status" data-state="idle">idle</p>
  <span>stream <code id="stream-id">-</code></span>
  <span>events <span id="event-count">0</span></span>
  <span>connections <span id="connection-count">0</span></span>
</div>
<p id="dialects">The same turn as
  <a data-dialect="sse" href="#">the protocol's SSE</a>,
  <a data-dialect="ui" href="#">the AI SDK's UI message stream</a>,
  <a data-dialect="agui" href="#">AG-UI</a>,
  <a data-dialect="chat-completions" href="#">Chat Completions</a> or
  <a data-dialect="responses" href="#">Responses</a> events.</p>
<main id="transcript"></main>
</div>
<script>
"use strict";
const KEY = "essessey-demo";
const TRANSPORT_KEY = "essessey-demo-transport";
const EVENTS = ["message_start", "ping", "content_block_start", "content_block_delta",
                "content_block_stop", "message_delta", "message_stop"];
const GIVE_UP = [4400, 4403, 4404, 1011];  // bad request, not allowed, no such stream, failed
const $ = (id) => document.getElementById(id);
const transcript = $("transcript");
const statusLine = $("status");
const dropButton = $("drop");
const cancelButton = $("cancel");
const transportSelect = $("transport");

let state = null;        // the turn shown: exactly what sessionStorage keeps
let blocks = new Map();  // block key -> block (in state.blocks)
let views = new Map();   // block key -> {node: Text, ...}
let conn = null;         // the open connection: {kind, close()}
let timer = null;        // a reconnection waiting to happen
let saveTimer = null;
let retries = 0;
window.demoState = null;

// -- keeping the state ---------------------------------------------------------------

function save() {
  if (saveTimer !== null) { clearTimeout(saveTimer); saveTimer = null; }
  // The blocks and the id of the last event applied to them, together: a reload resumes
  // right after what it shows.
  if (state) sessionStorage.setItem(KEY, JSON.stringify(state));
}
function saveSoon() {
  if (saveTimer === null) saveTimer = setTimeout(save, 100);
}
function load() {
  try { return JSON.parse(sessionStorage.getItem(KEY) || "null"); } catch { return null; }
}
window.addEventListener("pagehide", save);

function blankState(streamId, transport) {
  return {streamId, transport, lastEventId: "", events: 0, connections: 0, message: 0,
          blocks: [], model: "", stopReason: null, usage: null, error: null, done: false,
          phase: "connecting", statusText: "connecting", waiting: false, pending: [],
          decisions: {}};
}

function setStatus(phase, text) {
  statusLine.dataset.state = phase;
  statusLine.textContent = text;
  if (state) {
    state.phase = phase;
    state.statusText = text;
    if (state.stopReason) statusLine.dataset.stopReason = state.stopReason;
    else delete statusLine.dataset.stopReason;
  }
  updateControls();
}

function updateControls() {
  const live = state !== null && !state.done && !state.waiting;
  dropButton.disabled = !(live && conn !== null);
  cancelButton.disabled = !live;
  $("stream-id").textContent = state ? state.streamId : "-";
  // Each link reads the turn from the store again, in its dialect.
  for (const link of document.querySelectorAll("#dialects a")) {
    const id = state ? encodeURIComponent(state.streamId) : "";
    link.href = !state ? "#" : link.dataset.dialect === "sse"
      ? `/streams/${id}` : `/streams/${id}/as/${link.dataset.dialect}`;
  }
  $("event-count").textContent = state ? state.events : 0;
  $("connection-count").textContent = state ? state.connections : 0;
}

// -- rendering ---------------------------------------------------------------------------

function make(tag, className, text) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text) element.textContent = text;
  return element;
}

function toolCard(toolUseId, name, index) {
  const card = make("section", "tool-card");
  card.dataset.toolUseId = toolUseId;
  card.dataset.state = "running";
  if (index !== undefined) card.dataset.index = index;
  const header = make("header");
  header.append(make("span", "tool-name", name), make("span", "tool-state", "running"));
  const input = make("pre", "tool-input");
  card.append(header, make("div", "caption", "arguments"), input,
              make("div", "caption", "result"), make("pre", "tool-result"));
  // Calls of one round sit side by side: they run at the same time.
  let row = transcript.lastElementChild;
  if (!row || !row.classList.contains("tool-row")) {
    row = make("div", "tool-row");
    transcript.append(row);
  }
  row.append(card);
  return card;
}

function findCard(toolUseId) {
  for (const card of transcript.querySelectorAll(".tool-card")) {
    if (card.dataset.toolUseId === toolUseId) return card;
  }
  return null;
}

function render(block) {
  const node = document.createTextNode(block.text);
  const view = {node};
  if (block.type === "thinking") {
    const details = make("details", "thinking");
    details.dataset.index = block.index;
    details.open = true;
    view.summary = make("summary", "", "Thinking\u2026");
    const body = make("div", "thinking-text");
    body.append(node);
    details.append(view.summary, body);
    transcript.append(details);
    view.root = details;
  } else if (block.type === "text") {
    const div = make("div", "text-block");
    div.dataset.index = block.index;
    div.append(node);
    const previous = $("answer");
    if (previous) previous.removeAttribute("id");
    div.id = "answer";  // the latest text block: the final answer once the turn ends
    transcript.append(div);
    view.root = div;
  } else if (block.type === "tool_use") {
    const card = toolCard(block.id, block.name, block.index);
    card.querySelector(".tool-input").append(node);
    view.root = card;
  } else if (block.type === "tool_result") {
    const card = findCard(block.toolUseId) || toolCard(block.toolUseId, "(unknown tool)");
    const result = card.querySelector(".tool-result");
    result.textContent = "";
    result.append(node);
    result.classList.toggle("is-error", block.isError);
    card.dataset.state = block.isError ? "error" : "done";
    card.querySelector(".tool-state").textContent = block.isError ? "failed" : "done";
    view.root = card;
  } else if (block.type === "approval_request" || block.type === "question") {
    view.root = requestCard(block.requestId, block.type === "question" ? "question" : "approval",
                            requestText(block));
  } else if (block.type === "approval_response" || block.type === "answer") {
    decided(block.requestId, block.type === "answer" ? "answered"
            : block.approved ? "approved" : "denied");
    view.root = null;
  } else {
    const div = make("div", "other-block", `(a ${block.type} block)`);
    transcript.append(div);
    view.root = div;
  }
  views.set(block.key, view);
  if (block.stopped) stopped(block);
}

// -- what a turn asks ---------------------------------------------------------------------

function requestText(block) {
  if (block.type === "question") return block.question;
  const call = state.blocks.find((b) => b.type === "tool_use" && b.id === block.toolUseId);
  const args = call ? call.text : "";
  return `Allow ${call ? call.name : "the tool"}(${args})?` +
         (block.reason ? ` It ${block.reason}.` : "");
}

function findRequest(requestId) {
  for (const card of transcript.querySelectorAll(".request-card")) {
    if (card.dataset.requestId === requestId) return card;
  }
  return null;
}

function requestCard(requestId, kind, text) {
  const card = make("section", "request-card");
  card.dataset.requestId = requestId;
  card.dataset.kind = kind;
  card.dataset.state = "pending";
  card.append(make("span", "request-text", text));
  transcript.append(card);
  return card;
}

function decided(requestId, outcome) {
  const card = findRequest(requestId);
  if (card) {
    card.dataset.state = outcome;
    for (const control of card.querySelectorAll("button, input")) control.remove();
    card.append(make("span", "request-outcome", outcome));
  }
  if (outcome === "denied") {
    const request = state.blocks.find((b) => b.requestId === requestId && b.toolUseId);
    const tool = request ? findCard(request.toolUseId) : null;
    if (tool) {
      tool.dataset.state = "denied";
      tool.querySelector(".tool-state").textContent = "denied";
    }
  }
}

function pendingOf(message) {
  // What the message that just ended asks: its approval requests and questions, and its
  // calls with no result that no approval names (the client runs those).
  const mine = state.blocks.filter((b) => b.key.startsWith(`${message}:`));
  const approved = new Set(mine.filter((b) => b.type === "approval_request")
                               .map((b) => b.toolUseId));
  const answered = new Set(mine.filter((b) => b.type === "tool_result").map((b) => b.toolUseId));
  const found = [];
  for (const b of mine) {
    if (b.type === "approval_request") found.push({id: b.requestId, kind: "approval"});
    else if (b.type === "question") found.push({id: b.requestId, kind: "question"});
    else if (b.type === "tool_use" && !approved.has(b.id) && !answered.has(b.id)) {
      found.push({id: b.id, kind: "client_tool", name: b.name});
    }
  }
  return found;
}

function showControls() {
  for (const request of state.pending) {
    if (request.id in state.decisions) continue;
    if (request.kind === "client_tool") {
      let card = findRequest(request.id);
      if (!card) {
        const text = request.name === "get_location"
          ? "The agent asks for your location." : `The agent asks you to run ${request.name}.`;
        card = requestCard(request.id, "client_tool", text);
      }
      if (!card.querySelector("button")) {
        const share = make("button", "share-location", "Share my location (Tokyo)");
        share.type = "button";
        share.onclick = () => decide(request.id, {output: {city: "Tokyo"}});
        card.append(share);
      }
      continue;
    }
    const card = findRequest(request.id);
    if (!card || card.querySelector("button")) continue;
    if (request.kind === "approval") {
      const approve = make("button", "approve", "Approve");
      const deny = make("button", "deny", "Deny");
      approve.type = deny.type = "button";
      approve.onclick = () => decide(request.id, {approved: true});
      deny.onclick = () => decide(request.id, {approved: false, reason: "denied on the page"});
      card.append(approve, deny);
    } else {
      const input = make("input", "answer-input");
      const send = make("button", "send-answer", "Answer");
      send.type = "button";
      send.onclick = () => decide(request.id, {value: input.value});
      card.append(input, send);
    }
  }
}

function decide(requestId, answer) {
  state.decisions[requestId] = answer;
  const card = findRequest(requestId);
  if (card) {
    for (const control of card.querySelectorAll("button, input")) control.disabled = true;
  }
  save();
  if (state.pending.every((request) => request.id in state.decisions)) sendAnswers();
}

async function sendAnswers() {
  const answers = state.pending.map(
    (request) => ({id: request.id, ...state.decisions[request.id]}));
  setStatus("answering", "sending your answer");
  let response = null;
  let body = null;
  try {
    response = await fetch(`${streamPath()}/answer`, {method: "POST",
      body: JSON.stringify({answers}), headers: {"content-type": "application/json"}});
    body = await response.json();
  } catch { /* shown below */ }
  if (!response || !response.ok) {
    const why = body && body.error ? body.error.message
              : `HTTP ${response ? response.status : "unreachable"}`;
    state.decisions = {};
    setStatus("waiting", `the answer was refused: ${why}`);
    renderAll();
    return;
  }
  // The turn goes on in the same stream: resume after its last event.
  Object.assign(state, {waiting: false, pending: [], decisions: {}, done: false});
  save();
  connect();
}

function stopped(block) {
  const view = views.get(block.key);
  if (!view) return;
  if (block.type === "thinking") {
    view.root.open = false;  // collapsed once the reasoning is done
    view.summary.textContent = "Reasoning";
  } else if (block.type === "tool_use") {
    try { view.node.data = JSON.stringify(JSON.parse(block.text || "{}"), null, 2); }
    catch { /* shown as it came */ }
  }
}

function renderAll() {
  transcript.textContent = "";
  blocks = new Map();
  views = new Map();
  if (!state) return;
  for (const block of state.blocks) {
    blocks.set(block.key, block);
    render(block);
  }
  if (state.waiting) showControls();
  updateControls();
}

// -- the events ------------------------------------------------------------------------

const DELTA_FIELDS = {text_delta: "text", thinking_delta: "text", input_json_delta: "partial_json",
                      json_partial: "text"};

function handle(name, data, id) {
  if (id) {  // every event of the turn has one; only WebSocket keep-alive pings do not
    state.lastEventId = id;
    state.events += 1;
  }
  switch (name) {
    case "message_start":
      state.message += 1;
      state.model = data.message.model;
      break;
    case "content_block_start": {
      const start = data.content_block;
      const block = {key: `${state.message}:${data.index}`, index: data.index, type: start.type,
                     text: start.text || start.thinking || "", stopped: false};
      if (start.type === "tool_use") { block.id = start.id; block.name = start.name; }
      if (start.type === "tool_result") {
        block.toolUseId = start.tool_use_id;
        block.isError = start.is_error === true;
      }
      if (start.type === "approval_request" || start.type === "question") {
        block.requestId = start.id;
        block.toolUseId = start.tool_use_id;
        block.reason = start.reason;
        block.question = start.question;
      }
      if (start.type === "approval_response" || start.type === "answer") {
        block.requestId = start.request_id;
        block.approved = start.approved === true;
      }
      state.blocks.push(block);
      blocks.set(block.key, block);
      render(block);
      break;
    }
    case "content_block_delta": {
      const block = blocks.get(`${state.message}:${data.index}`);
      const delta = data.delta;
      const field = DELTA_FIELDS[delta.type];
      // thinking_delta: "text" in the essessey dialect, "thinking" in the anthropic one.
      const chunk = field ? (delta[field] ?? delta.thinking ?? "") : "";
      if (block && chunk) {
        block.text += chunk;
        views.get(block.key).node.appendData(chunk);
      }
      break;
    }
    case "content_block_stop": {
      const block = blocks.get(`${state.message}:${data.index}`);
      if (block) { block.stopped = true; stopped(block); }
      break;
    }
    case "message_delta":
      state.stopReason = data.delta.stop_reason;
      state.usage = data.usage;
      break;
    case "message_stop": {
      const pending = state.stopReason === "tool_use" ? pendingOf(state.message) : [];
      if (pending.length) {
        // The turn waits for its client: the stream ends here until the answer comes.
        Object.assign(state, {waiting: true, pending, decisions: {}});
        stopConnecting();
        setStatus("waiting", "waiting for your answer");
        showControls();
        save();
        return;
      }
      finish("done", `done (${state.stopReason})`);
      return;
    }
    case "error":
      state.error = data.error;
      finish("failed", `failed: ${data.error.message}`);
      return;
  }
  updateControls();
  saveSoon();
}

function finish(phase, text) {
  state.done = true;
  stopConnecting();
  setStatus(phase, text);
  save();
}

// -- the connection --------------------------------------------------------------------

function stopConnecting() {
  if (timer !== null) { clearTimeout(timer); timer = null; }
  if (conn) {
    const old = conn;
    conn = null;  // its handlers ignore anything that still comes
    old.close();
  }
}

function connect() {
  stopConnecting();
  if (!state || state.done || state.waiting) return;
  if (state.transport === "ws") openWebSocket(); else openEventSource();
  setStatus(state.lastEventId ? "resuming" : "connecting",
            state.lastEventId ? "resuming after the last event" : "connecting");
}

function retryLater(why) {
  stopConnecting();
  const delay = Math.min(500 * 2 ** retries++, 8000);
  setStatus("reconnecting", `${why}; reconnecting in ${delay} ms`);
  timer = setTimeout(() => { timer = null; connect(); }, delay);
}

function startOver() {
  // The last id is no longer retained: the server replays the turn from the start.
  Object.assign(state, {lastEventId: "", events: 0, message: 0, blocks: [], stopReason: null,
                        waiting: false, pending: [], decisions: {}});
  renderAll();
  connect();
}

function streamPath() {
  return `/streams/${encodeURIComponent(state.streamId)}`;
}

function query() {
  const params = new URLSearchParams();
  if (state.lastEventId) params.set("last_event_id", state.lastEventId);
  return params.toString();
}

function openEventSource() {
  const source = new EventSource(`${streamPath()}?${query()}`);
  const mine = {kind: "sse", close: () => source.close()};
  conn = mine;
  source.onopen = () => {
    if (conn !== mine) return;
    state.connections += 1;  // its own reconnections too (they send Last-Event-ID)
    retries = 0;
    setStatus("streaming", "streaming over SSE");
  };
  for (const name of EVENTS) {
    source.addEventListener(name, (event) => {
      if (conn === mine) handle(name, JSON.parse(event.data), event.lastEventId);
    });
  }
  source.addEventListener("error", (event) => {
    if (conn !== mine) return;
    if (event.data !== undefined) {  // the protocol's error event, from the server
      handle("error", JSON.parse(event.data), event.lastEventId);
    } else if (source.readyState === EventSource.CONNECTING) {
      setStatus("reconnecting", "connection lost; the browser reconnects");
    } else {
      refused(mine);
    }
  });
}

async function refused(mine) {
  // An EventSource does not say why it was refused: ask once more to learn the status.
  conn = null;
  mine.close();
  let status = 0;
  try {
    const headers = state.lastEventId ? {"Last-Event-ID": state.lastEventId} : {};
    const response = await fetch(streamPath(), {headers});
    status = response.status;
    if (response.body) response.body.cancel();
  } catch { /* the server is unreachable: retry */ }
  if (status === 410) startOver();
  else if ([400, 403, 404].includes(status)) finish("failed", `unavailable (HTTP ${status})`);
  else retryLater(status ? `HTTP ${status}` : "unreachable");
}

function openWebSocket() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}${streamPath()}/ws?${query()}`);
  const mine = {kind: "ws", close: () => socket.close()};
  conn = mine;
  socket.onopen = () => {
    if (conn !== mine) return;
    state.connections += 1;
    retries = 0;
    setStatus("streaming", "streaming over WebSocket");
  };
  socket.onmessage = (message) => {
    if (conn !== mine) return;
    const frame = JSON.parse(message.data);  // {"id": ..., "event": ..., "data": {...}}
    handle(frame.event, frame.data, frame.id);
  };
  socket.onclose = (close) => {
    if (conn !== mine) return;
    conn = null;
    if (state.done || state.waiting) return;
    if (close.code === 4410) startOver();
    else if (GIVE_UP.includes(close.code)) {
      finish("failed", `unavailable (close code ${close.code}: ${close.reason})`);
    } else if (close.code === 1000) finish("done", "ended");
    else retryLater(`closed with ${close.code}`);  // dropped, going away, try again later
  };
}

// -- the controls ----------------------------------------------------------------------

$("controls").addEventListener("submit", async (event) => {
  event.preventDefault();
  stopConnecting();
  const body = {scenario: $("scenario").value, deltas: Number($("deltas").value),
                delay_ms: Number($("delay").value)};
  statusLine.dataset.state = "starting";
  statusLine.textContent = "starting a turn";
  let answer = null;
  let response = null;
  try {
    response = await fetch("/streams", {method: "POST", body: JSON.stringify(body),
                                        headers: {"content-type": "application/json"}});
    answer = await response.json();
  } catch { /* shown below */ }
  if (!response || !response.ok || !answer || !answer.stream_id) {
    const why = answer && answer.error ? answer.error.message
              : `HTTP ${response ? response.status : "unreachable"}`;
    statusLine.dataset.state = "failed";
    statusLine.textContent = `refused: ${why}`;
    return;
  }
  state = blankState(answer.stream_id, transportSelect.value);
  state.options = body;  // shown again in the form after a reload
  window.demoState = state;
  retries = 0;
  renderAll();
  save();
  connect();
});

dropButton.addEventListener("click", () => {
  if (!state || state.done || !conn) return;
  stopConnecting();
  setStatus("dropped", "connection dropped; resuming shortly");
  // A short pause, so that the turn goes on without us and the resume has some catching up.
  timer = setTimeout(() => { timer = null; connect(); }, 400);
});

cancelButton.addEventListener("click", async () => {
  if (!state || state.done) return;
  try { await fetch(`${streamPath()}/cancel`, {method: "POST"}); } catch { /* ended anyway */ }
});

transportSelect.addEventListener("change", () => {
  sessionStorage.setItem(TRANSPORT_KEY, transportSelect.value);
  if (!state) return;
  state.transport = transportSelect.value;
  save();
  // Switch at once, mid-turn: the other transport resumes after the same last event id.
  if (!state.done && (conn || timer !== null)) connect();
});

transportSelect.value = sessionStorage.getItem(TRANSPORT_KEY) || "sse";
const saved = load();
if (saved && saved.streamId) {
  state = saved;
  window.demoState = state;
  transportSelect.value = state.transport;
  if (state.options) {
    $("scenario").value = state.options.scenario;
    $("deltas").value = state.options.deltas;
    $("delay").value = state.options.delay_ms;
  }
  renderAll();
  if (state.done || state.waiting) setStatus(state.phase, state.statusText);
  else connect();
}
updateControls();
</script>
</body>
</html>
"""

FAVICON: Final = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect width="16" height="16" rx="3" fill="#3b5bdb"/>'
    b'<path d="M4 5h8M4 8h8M4 11h5" stroke="#fff" stroke-width="1.6" stroke-linecap="round"/>'
    b"</svg>"
)
"""The demo's icon, an SVG (lines of a stream), served at ``/favicon.ico``: browsers ask
for that path for every page they show, the demo's JSON and event streams included."""

PAGE: Final = _TEMPLATE.replace("{{DEFAULT_DELTAS}}", str(DEFAULT_DELTAS))
"""The page as served."""
