// Streams one chat completion with the official openai package from the
// base URL given, and prints a JSON line for each chunk as it arrives:
// its index, the milliseconds since the request began, its content and
// its usage.
//
//     node openai_stream.mjs BASE_URL
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-test", maxRetries: 0 });
const began = performance.now();
const stream = await client.chat.completions.create({
  model: "gpt-test",
  messages: [{ role: "user", content: "Say hello." }],
  max_tokens: 1000,
  stream: true,
  stream_options: { include_usage: true },
});
let index = 0;
for await (const chunk of stream) {
  console.log(JSON.stringify({
    index: index++,
    ms: performance.now() - began,
    content: chunk.choices[0]?.delta?.content ?? null,
    usage: chunk.usage ?? null,
  }));
}
