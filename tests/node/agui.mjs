// @ag-ui/client's HttpAgent runs one AG-UI run against essessey's agui route and prints
// what the agent ended with: the event types in order and its messages.
// Usage: node agui.mjs <url> <threadId> <runId>
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, runId] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId });
agent.messages = [{ id: "u1", role: "user", content: "Weather?" }];
const events = [];
await agent.runAgent(
  { runId },
  {
    onEvent({ event }) {
      events.push(event.type);
    },
  },
);
process.stdout.write(JSON.stringify({ events, messages: agent.messages }));
