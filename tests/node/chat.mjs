// Drives the AI SDK's own Chat state machine (what useChat runs, without React) against a
// server, and prints what the app would see as JSON on stdout (and the messages as
// convertToModelMessages gives them to a model on the next request).
//
//   node chat.mjs BASE send CHAT_ID BODY_JSON [ws]       POST {BASE}/api/chat, one user message
//   node chat.mjs BASE resume CHAT_ID MESSAGES_JSON [ws] GET {BASE}/api/chat/{CHAT_ID}/stream
//
// With ws, the same requests go as frames of WebSocketChatTransport, over {BASE}/api/chat/ws.
import {
  AbstractChat,
  DefaultChatTransport,
  WebSocketChatTransport,
  convertToModelMessages,
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

const [base, mode, chatId, arg, transportName] = process.argv.slice(2);
const body = mode === 'send' ? JSON.parse(arg) : {};
const transport = transportName === 'ws'
  ? new WebSocketChatTransport({ url: `${base}/api/chat/ws`, body })
  : new DefaultChatTransport({ api: `${base}/api/chat`, body });
const finishes = [];
const errors = [];
const options = {
  id: chatId,
  messages: mode === 'resume' ? JSON.parse(arg) : [],
  transport,
  onFinish: ({ isAbort, isDisconnect, isError, finishReason }) =>
    finishes.push({ isAbort, isDisconnect, isError, finishReason: finishReason ?? null }),
  onError: e => errors.push(e.message),
};
const chat = new NodeChat(options);
if (mode === 'send') await chat.sendMessage({ text: 'What is the weather in Paris and Oslo?' });
else await chat.resumeStream();
console.log(JSON.stringify({
  status: chat.status,
  error: chat.error?.message ?? null,
  errors,
  finishes,
  messages: chat.messages,
  // What the app's next request hands its model: the parts as model messages.
  modelMessages: await convertToModelMessages(chat.messages),
}));
transport.close?.();
