// Drives the AI SDK's OpenAI provider (@ai-sdk/openai, what an AI SDK app points at an
// OpenAI-compatible server) against essessey's Responses or Chat Completions routes, and
// prints what streamText gives the app as JSON on stdout.
//
//   node openai_provider.mjs BASE responses|chat MODEL
import { createOpenAI } from '@ai-sdk/openai';
import { streamText } from 'ai';

const [base, api, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'test' });
const errors = [];
const result = streamText({
  model: api === 'responses' ? openai.responses(model) : openai.chat(model),
  prompt: 'Go.',
  maxRetries: 0,
  onError: ({ error }) => errors.push(String(error)),
});
const parts = [];
for await (const part of result.fullStream) {
  if (part.type === 'error') errors.push(String(part.error));
  parts.push(part.type);
}
console.log(JSON.stringify({
  errors,
  parts: [...new Set(parts)],
  text: await result.text,
  reasoning: (await result.reasoningText) ?? '',
  toolCalls: (await result.toolCalls).map(c => ({ id: c.toolCallId, name: c.toolName, input: c.input })),
  finishReason: await result.finishReason,
}));
