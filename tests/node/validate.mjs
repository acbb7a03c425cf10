// Checks UI message chunks against the AI SDK's own chunk schema (uiMessageChunkSchema):
// reads a JSON array of chunks on stdin, prints a JSON array of null (valid) or the
// schema's error message, one per chunk.
import { uiMessageChunkSchema } from 'ai';

let input = '';
for await (const part of process.stdin) input += part;
const schema = uiMessageChunkSchema();
const verdicts = [];
for (const chunk of JSON.parse(input)) {
  const result = await schema.validate(chunk);
  verdicts.push(result.success ? null : String(result.error?.message ?? result.error).slice(0, 200));
}
console.log(JSON.stringify(verdicts));
