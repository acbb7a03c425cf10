// @ag-ui/client's HttpAgent against essessey's agui route, for a turn that asks: a first
// run that ends on an interrupt (or a frontend tool call), then a run that answers it
// (resume entries, or a tool message). Prints each run's event types, its outcome and
// what the agent holds after it, then the agent's messages, as JSON.
// Usage: node agui_asking.mjs <url> <threadId> approval approve|deny|cancel
//        node agui_asking.mjs <url> <threadId> client answer
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, scenario, decision] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId });
agent.messages = [{ id: "u1", role: "user", content: scenario }];
const runs = [];

async function run(parameters) {
  const seen = { events: [] };
  await agent.runAgent(parameters, {
    onEvent({ event }) {
      seen.events.push(event.type);
    },
    onRunFinishedEvent(params) {
      seen.outcome = params.outcome;
      if (params.outcome === "interrupt") seen.interrupts = params.interrupts;
      if (params.outcome === "success") seen.pendingToolCallIds = params.pendingToolCallIds;
    },
  });
  seen.pendingInterrupts = agent.pendingInterrupts.map((i) => i.id);
  runs.push(seen);
  return seen;
}

const first = await run({ runId: "run-1" });
if (scenario === "approval") {
  const [interrupt] = first.interrupts;
  const entry =
    decision === "approve"
      ? { interruptId: interrupt.id, status: "resolved" }
      : decision === "deny"
        ? {
            interruptId: interrupt.id,
            status: "resolved",
            payload: { approved: false, reason: "no thanks" },
          }
        : { interruptId: interrupt.id, status: "cancelled" };
  await run({ runId: "run-2", resume: [entry] });
} else {
  const [call] = first.pendingToolCallIds;
  agent.addMessage({
    id: "t1",
    role: "tool",
    toolCallId: call,
    content: JSON.stringify({ lat: 59.9 }),
  });
  await run({ runId: "run-2" });
}
process.stdout.write(JSON.stringify({ runs, messages: agent.messages }));
