// An AI SDK app and its chat UI's transport, both from the real `ai` package (pinned in
// package.json), with the observer's proxy between them: tests/e2e/test_aisdk_e2e.py runs it
// with one JSON argument and reads one JSON line from stdout.
//
//   node aisdk_chat.mjs '{"proxy": "http://127.0.0.1:PORT", "route": "/api/assistant",
//                         "prompt": "Weather in Vienna?", "timeoutMs": 20000}'
//
// The app: a node:http server on 127.0.0.1 (a free port) serving POST <route> as an AI SDK app
// does: `streamText` with a server-side tool (`getWeather`, declared on the server only) and
// `stopWhen: stepCountIs(2)`, answered with `result.toUIMessageStreamResponse()` (the UI message
// stream, header `x-vercel-ai-ui-message-stream: v1`). Its model is the SDK's own test model
// (`MockLanguageModelV3` from `ai/test`): step 1 calls the tool, step 2 answers in text; nothing
// leaves this machine.
// The UI side: `DefaultChatTransport` (what `useChat` uses) with `api` set to the app's URL and a
// `fetch` through undici's ProxyAgent (plain HTTP through the proxy, no CONNECT tunnel), read with
// `readUIMessageStream`. Printed: {"port", "status", "contentType", "uiHeader", "message", "body"}
// (`message`: the final UI message; `body`: the request body the transport sent, as the app got it).
import http from "node:http";
import { DefaultChatTransport, convertToModelMessages, readUIMessageStream, stepCountIs, streamText, tool } from "ai";
import { MockLanguageModelV3, simulateReadableStream } from "ai/test";
import { ProxyAgent, fetch as undiciFetch } from "undici";
import { z } from "zod";

const cfg = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const timer = setTimeout(() => {
  out({ error: "timeout" });
  process.exit(3);
}, cfg.timeoutMs ?? 20000);

const usage = (input, output) => ({
  inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: output, text: output, reasoning: undefined },
});

// Step 1: a call of getWeather, its input streamed in two deltas; step 2: the answer.
const STEPS = [
  [
    { type: "stream-start", warnings: [] },
    { type: "response-metadata", id: "resp-1", modelId: "mock-model-1" },
    { type: "tool-input-start", id: "call_1", toolName: "getWeather" },
    { type: "tool-input-delta", id: "call_1", delta: '{"city":' },
    { type: "tool-input-delta", id: "call_1", delta: '"Vienna"}' },
    { type: "tool-input-end", id: "call_1" },
    { type: "tool-call", toolCallId: "call_1", toolName: "getWeather", input: '{"city":"Vienna"}' },
    { type: "finish", finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage: usage(12, 7) },
  ],
  [
    { type: "stream-start", warnings: [] },
    { type: "response-metadata", id: "resp-2", modelId: "mock-model-1" },
    { type: "text-start", id: "t1" },
    { type: "text-delta", id: "t1", delta: "It is 21°C " },
    { type: "text-delta", id: "t1", delta: "in Vienna." },
    { type: "text-end", id: "t1" },
    { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: usage(30, 6) },
  ],
];

function model() {
  let step = 0;
  return new MockLanguageModelV3({
    doStream: async () => ({
      stream: simulateReadableStream({ chunks: STEPS[Math.min(step++, STEPS.length - 1)], chunkDelayInMs: 5 }),
    }),
  });
}

let received = null; // the request body as the app got it

const server = http.createServer(async (req, res) => {
  if (req.method !== "POST" || req.url !== cfg.route) {
    res.writeHead(404).end();
    return;
  }
  const parts = [];
  for await (const chunk of req) parts.push(chunk);
  received = Buffer.concat(parts).toString("utf8");
  const { messages } = JSON.parse(received);
  const result = streamText({
    model: model(),
    messages: await convertToModelMessages(messages),
    tools: {
      getWeather: tool({
        description: "The weather in a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => ({ city, tempC: 21 }),
      }),
    },
    stopWhen: stepCountIs(2),
  });
  const response = result.toUIMessageStreamResponse();
  res.writeHead(response.status, Object.fromEntries(response.headers));
  for await (const chunk of response.body) res.write(chunk);
  res.end();
});

await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const port = server.address().port;

try {
  const dispatcher = new ProxyAgent({ uri: cfg.proxy, proxyTunnel: false });
  let seen = null;
  const transport = new DefaultChatTransport({
    api: `http://127.0.0.1:${port}${cfg.route}`,
    fetch: async (url, init) => {
      const r = await undiciFetch(url, { ...init, dispatcher });
      seen = r;
      return r;
    },
  });
  const stream = await transport.sendMessages({
    chatId: "chat-e2e-1",
    messages: [{ id: "u-1", role: "user", parts: [{ type: "text", text: cfg.prompt }] }],
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: undefined,
  });
  let message = null;
  for await (const m of readUIMessageStream({ stream })) message = m;
  out({
    port,
    status: seen.status,
    contentType: seen.headers.get("content-type"),
    uiHeader: seen.headers.get("x-vercel-ai-ui-message-stream"),
    message,
    body: received,
  });
} catch (err) {
  out({ error: String(err && err.stack ? err.stack : err) });
  process.exitCode = 1;
} finally {
  clearTimeout(timer);
  server.close();
  server.closeAllConnections?.();
}
