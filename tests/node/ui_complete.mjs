// Reads UI message chunks (a JSON array on stdin) into the AI SDK's UI message, as useChat
// does, then gives the question tool's call its output, as addToolOutput does. Prints
// whether lastAssistantMessageIsCompleteWithToolCalls (useChat's sendAutomaticallyWhen for
// client tools) holds before and after, and each tool part's state.
import { lastAssistantMessageIsCompleteWithToolCalls, readUIMessageStream } from 'ai';

let input = '';
for await (const part of process.stdin) input += part;
const chunks = JSON.parse(input);
const stream = new ReadableStream({
  start(controller) {
    for (const chunk of chunks) controller.enqueue(chunk);
    controller.close();
  },
});
let message;
for await (const snapshot of readUIMessageStream({ stream })) message = snapshot;
const complete = () => lastAssistantMessageIsCompleteWithToolCalls({ messages: [message] });
const before = complete();
const tools = message.parts.filter((part) => part.type.startsWith('tool-'));
for (const part of tools) {
  if (part.type === `tool-${process.argv[2]}`) {
    part.state = 'output-available';
    part.output = 'answered';
  }
}
console.log(JSON.stringify({
  before,
  after: complete(),
  parts: tools.map((part) => [part.type, part.state, part.providerExecuted ?? false]),
}));
