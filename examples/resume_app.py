"""A turn that survives a dropped connection and a page reload: a StreamHub behind Starlette.

Run it with ``python examples/resume_app.py [--port 8000]`` and open http://127.0.0.1:8000/.
"Start a turn" asks the server for a turn and reads it with an EventSource. Reload the page
in the middle: it picks up where it stopped, because it keeps the text so far and the last
event id in sessionStorage and reconnects with ``?last_event_id=``. A dropped connection
needs nothing from the page: the EventSource reconnects by itself and sends the
``Last-Event-ID`` header. The turn runs in the hub, not in a request, so neither stops it.

The routes:

- ``POST /streams`` starts a scripted turn and answers ``{"stream_id": ..., "token": ...}``;
- ``GET /streams/{stream_id}`` serves it as SSE, resuming after ``Last-Event-ID`` (or
  ``?last_event_id=``);
- ``POST /streams/{stream_id}/cancel`` stops the turn (it ends with stop reason
  ``cancelled``);
- ``GET /`` is the page.

A stream id is not a secret (it is in URLs, logs, the page), so every stream gets its own
token, and the ``authorize`` hook checks it on read, resume and cancel: sent as
``Authorization: Bearer <token>``, or as ``?token=`` by the EventSource, which cannot set
headers. From the command line::

    curl -s -X POST localhost:8000/streams                # {"stream_id":"turn_...","token":"..."}
    curl -N -H "Authorization: Bearer $TOKEN" localhost:8000/streams/$STREAM_ID
    curl -N -H "Authorization: Bearer $TOKEN" -H "Last-Event-ID: $ID" \\
        localhost:8000/streams/$STREAM_ID
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

import essessey
from essessey.bindings.sse import hub_routes

PAUSE = 0.15
"""Seconds between words, so there is time to reload the page in the middle of a turn."""

REPLY = (
    "Every event of this turn carries an id. When the connection drops, the browser "
    "reconnects and sends the id of the last event it received; the server replays what "
    "came after it, then follows the turn live. Reload the page now and watch it pick up "
    "exactly where it stopped: no word is lost and none is repeated, because the turn "
    "runs in the hub on the server, apart from any connection."
)

MAX_TOKENS = 10_000
"""Tokens kept, newest last: the store keeps at most this many streams too (its
``max_streams`` default), so a token outlives its stream only briefly."""

_tokens: OrderedDict[str, str] = OrderedDict()


def _request_token(request: Request) -> str:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials:
        return credentials
    # An EventSource cannot set headers. A token in the URL can end up in access logs,
    # which is why main() turns uvicorn's off; an HttpOnly cookie is the other way.
    return request.query_params.get("token", "")


def authorize(request: Request, stream_id: str, access: essessey.Access) -> bool:
    """Whoever holds the stream's token may read, resume and cancel it. (An app with
    users would check the user here, and might let viewers read but not cancel.)"""
    expected = _tokens.get(stream_id)
    return expected is not None and secrets.compare_digest(_request_token(request), expected)


hub = essessey.StreamHub(essessey.InMemoryEventStore(max_age=600), authorize=authorize)


def scripted_turn(stream_id: str) -> essessey.TurnProducer:
    async def produce(publisher: essessey.Publisher) -> None:
        async with essessey.stream_turn(
            publisher, message_id=f"msg_{stream_id}", stream_id=stream_id, model="scripted-model"
        ) as turn:
            text = await turn.text()
            words = REPLY.split(" ")
            for n, word in enumerate(words):
                await text.write(word if n == len(words) - 1 else word + " ")
                await asyncio.sleep(PAUSE)
            turn.output_tokens = len(words)

    return produce


async def start_stream(request: Request) -> JSONResponse:
    # A real app would authenticate the user here and run a model on their prompt.
    stream_id = f"turn_{secrets.token_hex(8)}"
    token = secrets.token_urlsafe(24)
    _tokens[stream_id] = token
    while len(_tokens) > MAX_TOKENS:
        _tokens.popitem(last=False)
    await hub.start(stream_id, scripted_turn(stream_id))
    return JSONResponse({"stream_id": stream_id, "token": token}, status_code=201)


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(PAGE)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # The hub lives as long as the app: turns run as its tasks. Leaving it lets the turns
    # still running finish (up to shutdown_grace, 20 s), then cancels the rest (each ends
    # with stop reason "cancelled").
    async with hub:
        yield


app = Starlette(
    routes=[
        Route("/", page),
        Route("/streams", start_stream, methods=["POST"]),
        # GET /streams/{stream_id} and POST /streams/{stream_id}/cancel; retry=1000 tells
        # the EventSource to reconnect one second after a drop.
        *hub_routes(hub, "/streams", retry=1000),
    ],
    lifespan=lifespan,
)

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>essessey: resume</title>
<link rel="icon" href="data:,">
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 42rem; margin: 2rem auto; }
  #text { white-space: pre-wrap; min-height: 6rem; border: 1px solid #ccc; padding: 1rem; }
  #status { color: #666; }
</style>
</head>
<body>
<h1>Resume a turn</h1>
<p>
  <button id="start">Start a turn</button>
  <button id="cancel" disabled>Cancel</button>
  <span id="status"></span>
</p>
<div id="text"></div>
<script>
"use strict";
const KEY = "essessey-resume";
const textBox = document.getElementById("text");
const statusLine = document.getElementById("status");
const cancelButton = document.getElementById("cancel");
let source = null;

function load() { return JSON.parse(sessionStorage.getItem(KEY) || "null"); }
function save(state) { sessionStorage.setItem(KEY, JSON.stringify(state)); }

function finish(state, why) {
  state.done = true;
  save(state);
  if (source) { source.close(); source = null; }  // or it would reconnect forever
  cancelButton.disabled = true;
  statusLine.textContent = why;
}

function follow(state) {
  textBox.textContent = state.text;
  cancelButton.disabled = false;
  statusLine.textContent = state.lastEventId ? "resuming" : "streaming";
  const params = new URLSearchParams({token: state.token});
  // After a reload: start after the last event shown. The EventSource's own reconnects
  // send the Last-Event-ID header, which the server prefers to this parameter.
  if (state.lastEventId) params.set("last_event_id", state.lastEventId);
  source = new EventSource(`/streams/${state.streamId}?${params}`);
  source.addEventListener("content_block_delta", (e) => {
    const delta = JSON.parse(e.data).delta;
    if (delta.type === "text_delta") {
      state.text += delta.text;
      textBox.textContent = state.text;
    }
    state.lastEventId = e.lastEventId;
    save(state);
  });
  for (const name of ["message_start", "content_block_start", "content_block_stop", "ping"]) {
    source.addEventListener(name, (e) => { state.lastEventId = e.lastEventId; save(state); });
  }
  source.addEventListener("message_delta", (e) => {
    state.lastEventId = e.lastEventId;
    state.stopReason = JSON.parse(e.data).delta.stop_reason;
    save(state);
  });
  source.addEventListener("message_stop", () => finish(state, `done (${state.stopReason})`));
  source.addEventListener("error", async (e) => {
    if (e.data) {  // an error event from the server: the turn failed
      finish(state, "failed: " + JSON.parse(e.data).error.message);
      return;
    }
    if (source.readyState !== EventSource.CLOSED) {
      statusLine.textContent = "reconnecting";  // the EventSource retries by itself
      return;
    }
    // Refused with an HTTP error (an EventSource does not say which): ask again to learn it.
    source = null;
    const url = `/streams/${state.streamId}?${new URLSearchParams({token: state.token})}`;
    const headers = state.lastEventId ? {"Last-Event-ID": state.lastEventId} : {};
    const response = await fetch(url, {headers});
    if (response.body) response.body.cancel();
    if (response.status === 410 && state.lastEventId) {
      // 410 resume_unavailable: the last id is no longer retained. Start over without
      // it: the server replays the turn from the oldest message it still holds whole.
      Object.assign(state, {text: "", lastEventId: ""});
      follow(state);
    } else {
      finish(state, `unavailable (HTTP ${response.status})`);
    }
  });
}

document.getElementById("start").addEventListener("click", async () => {
  if (source) { source.close(); source = null; }
  const response = await fetch("/streams", {method: "POST"});
  const created = await response.json();
  const state = {streamId: created.stream_id, token: created.token, text: "", lastEventId: ""};
  save(state);
  follow(state);
});

cancelButton.addEventListener("click", async () => {
  const state = load();
  if (!state) return;
  await fetch(`/streams/${state.streamId}/cancel`, {
    method: "POST", headers: {Authorization: `Bearer ${state.token}`},
  });
});

const saved = load();
if (saved && !saved.done) follow(saved);
else if (saved) { textBox.textContent = saved.text; statusLine.textContent = "done"; }
</script>
</body>
</html>
"""


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve resumable turns and a page to read them.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # Off because the EventSource sends its token in the URL (see _request_token).
    uvicorn.run(app, host=args.host, port=args.port, access_log=False)


if __name__ == "__main__":
    main()
