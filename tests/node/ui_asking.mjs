// The AI SDK's own Chat (what useChat runs, without React) against essessey's chat routes,
// for a turn that asks: the first request ends on what the turn asks, the client answers
// (addToolApprovalResponse, or addToolOutput from onToolCall), and sendAutomaticallyWhen
// sends the answer, whose stream continues the same assistant message. Prints what the app
// would see, and the requests the transport made, as JSON on stdout.
//
//   node ui_asking.mjs BASE CHAT_ID send TEXT ACTION [TRANSPORT]
//   node ui_asking.mjs BASE CHAT_ID resume MESSAGES_JSON ACTION [TRANSPORT]
//
// TRANSPORT is http (DefaultChatTransport, the default) or ws (WebSocketChatTransport at
// {BASE}/api/chat/ws; its request frames are recorded as the HTTP requests they stand for:
// a send as a POST, a resume as a GET, the status from the first answer to it: start or a
// chunk 200, no-active 204, error 400).
//
// TEXT is the user's message (it names what the test app's turn asks); ACTION is
// approve, deny (the approval requests), answer (the client tools and questions: onToolCall
// gives each its output) or none (the first stream only).
import {
  AbstractChat,
  DefaultChatTransport,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} from 'ai';

class State {
  constructor(messages) { this.messages = messages; this.status = 'ready'; this.error = undefined; }
  pushMessage = m => { this.messages = this.messages.concat(structuredClone(m)); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), structuredClone(m), ...this.messages.slice(i + 1)];
  };
  snapshot = v => structuredClone(v);
}

class NodeChat extends AbstractChat {
  constructor({ messages, ...init }) { super({ ...init, state: new State(messages) }); }
}

const [base, chatId, mode, arg, action, transportName = 'http'] = process.argv.slice(2);
const OUTPUTS = { get_location: { lat: 59.9 }, ask_user: 'C' };
const finishes = [];
const errors = [];
const requests = [];
let finished;
const expected = action === 'none' ? 1 : 2;
const allDone = new Promise(resolve => { finished = resolve; });

// A request as the test reads it: its method and, for a chat request, what its last
// message says of the tool calls.
function described(method, url, body) {
  const request = { method, url };
  if (body?.messages) {
    const last = body.messages.at(-1);
    request.trigger = body.trigger;
    request.messageId = body.messageId ?? null;
    request.last = {
      role: last.role,
      tools: last.parts
        .filter(p => p.type.startsWith('tool-'))
        .map(p => ({ toolCallId: p.toolCallId, state: p.state, approval: p.approval ?? null })),
    };
  }
  return request;
}

async function recordingFetch(url, init) {
  const body = init?.body ? JSON.parse(init.body) : null;
  const request = described(init?.method ?? 'GET', String(url).slice(base.length), body);
  const response = await fetch(url, init);
  request.status = response.status;
  requests.push(request);
  return response;
}

const STATUS = { start: 200, chunk: 200, 'no-active': 204, error: 400 };

// The browser's WebSocket, recording the request frames and the first answer to each
// (made only for the ws transport: Node before 22 has no WebSocket without a flag).
const recording = () => class RecordingWebSocket extends WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener('message', event => {
      const frame = JSON.parse(event.data);
      const request = requests.find(r => r.requestId === frame.requestId);
      if (request && request.status === null) request.status = STATUS[frame.type] ?? null;
    });
  }
  send(data) {
    const frame = JSON.parse(data);
    if (frame.type === 'send' || frame.type === 'resume') {
      const request = described(frame.type === 'send' ? 'POST' : 'GET', null, frame);
      requests.push({ ...request, requestId: frame.requestId, status: null });
    }
    super.send(data);
  }
};

const transport = transportName === 'ws'
  ? new WebSocketChatTransport({ url: `${base}/api/chat/ws`, webSocket: recording() })
  : new DefaultChatTransport({ api: `${base}/api/chat`, fetch: recordingFetch });

const chat = new NodeChat({
  id: chatId,
  messages: mode === 'resume' ? JSON.parse(arg) : [],
  transport,
  sendAutomaticallyWhen: action === 'answer'
    ? lastAssistantMessageIsCompleteWithToolCalls
    : lastAssistantMessageIsCompleteWithApprovalResponses,
  onToolCall: ({ toolCall }) => {
    if (action !== 'answer' || !(toolCall.toolName in OUTPUTS)) return;
    // Not awaited, as the AI SDK's docs have it: the output lands once the stream ends.
    chat.addToolOutput({
      tool: toolCall.toolName,
      toolCallId: toolCall.toolCallId,
      output: OUTPUTS[toolCall.toolName],
    });
  },
  onFinish: ({ isAbort, isDisconnect, isError, finishReason }) => {
    finishes.push({ isAbort, isDisconnect, isError, finishReason: finishReason ?? null });
    if (finishes.length >= expected || isError) finished();
  },
  onError: e => errors.push(e.message),
});

if (mode === 'send') await chat.sendMessage({ text: arg });
else await chat.resumeStream();
let asked = null;
if (action === 'approve' || action === 'deny') {
  // What a user's click does, once the first stream has ended: answer each approval the
  // message asks; the Chat sends the answers by itself.
  asked = structuredClone(chat.lastMessage);
  for (const part of chat.lastMessage.parts) {
    if (part.state === 'approval-requested') {
      const approved = action === 'approve';
      await chat.addToolApprovalResponse({
        id: part.approval.id,
        approved,
        ...(approved ? {} : { reason: 'too expensive' }),
      });
    }
  }
}
const timeout = setTimeout(() => finished(), 20000);
await allDone;
clearTimeout(timeout);
// Let the Chat settle: an automatic request it would send now shows up in the requests.
await new Promise(resolve => setTimeout(resolve, 200));
console.log(JSON.stringify({
  status: chat.status,
  error: chat.error?.message ?? null,
  errors,
  finishes,
  requests,
  asked,
  messages: chat.messages,
}));
transport.close?.();
