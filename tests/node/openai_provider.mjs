// Drives the AI SDK's OpenAI providers (what an AI SDK app points at an OpenAI-compatible
// server: @ai-sdk/openai's Responses and Chat Completions models, @ai-sdk/openai-compatible's
// chat model) against essessey's routes, and prints what streamText gives the app as JSON
// on stdout.
//
//   node openai_provider.mjs BASE responses|chat|compatible MODEL
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { streamText } from 'ai';

const [base, api, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'test' });
const compatible = createOpenAICompatible({ name: 'essessey', baseURL: `${base}/v1`, apiKey: 'test' });
const models = {
  responses: () => openai.responses(model),
  chat: () => openai.chat(model),
  compatible: () => compatible.chatModel(model),
};
const errors = [];
const result = streamText({
  model: models[api](),
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
