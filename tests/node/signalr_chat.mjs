// The official @microsoft/signalr client (JSON or @microsoft/signalr-protocol-msgpack) streaming
// `chat` from a ChatHub through an HTTP proxy: tests/e2e/test_websocket_e2e.py runs it with one
// JSON argument and reads one JSON line per turn from stdout, then {"closed": ...}.
//
//   node signalr_chat.mjs '{"url": "wss://127.0.0.1:PORT/sydney/ChatHub", "protocol": "json",
//                           "proxy": "http://127.0.0.1:PORT", "prompts": ["hi", "again"],
//                           "stopAfterUpdates": 0, "timeoutMs": 15000}'
//
// Node 20 has no global WebSocket and signalr's own Node transports (node-fetch for negotiate,
// the `ws` package for the socket) take no proxy. The client's own options do: `httpClient` (an
// HttpClient on undici's fetch with a ProxyAgent dispatcher: the negotiate POST) and `WebSocket`
// (undici's WebSocket with the same dispatcher: CONNECT through the proxy, then the upgrade).
// The proxy's CA comes from NODE_EXTRA_CA_CERTS (docs/ca-install.md, Node.js).
// `stopAfterUpdates: N` calls connection.stop() once N bot updates of the turn have arrived;
// `cancelAfterUpdates: N` disposes of the first turn's stream instead (the client sends a
// CancelInvocation and keeps the socket for the next prompt).
import * as signalR from "@microsoft/signalr";
import { MessagePackHubProtocol } from "@microsoft/signalr-protocol-msgpack";
import { ProxyAgent, WebSocket as UndiciWebSocket, fetch } from "undici";

const cfg = JSON.parse(process.argv[2]);
const dispatcher = new ProxyAgent(cfg.proxy);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const timer = setTimeout(() => {
  out({ error: "timeout" });
  process.exit(3);
}, cfg.timeoutMs ?? 15000);

class ProxiedHttpClient extends signalR.HttpClient {
  async send(request) {
    const r = await fetch(request.url, {
      method: request.method,
      headers: request.headers,
      body: request.content,
      dispatcher,
    });
    const body = request.responseType === "arraybuffer" ? await r.arrayBuffer() : await r.text();
    if (r.status < 200 || r.status > 299) throw new signalR.HttpError(r.statusText, r.status);
    return new signalR.HttpResponse(r.status, r.statusText, body);
  }
}

class ProxiedWebSocket extends UndiciWebSocket {
  constructor(url, protocols, options) {
    super(url, { protocols, dispatcher, headers: options?.headers });
  }
}

const builder = new signalR.HubConnectionBuilder()
  .withUrl(cfg.url, {
    httpClient: new ProxiedHttpClient(),
    WebSocket: ProxiedWebSocket,
    transport: signalR.HttpTransportType.WebSockets,
  })
  .configureLogging(signalR.LogLevel.Warning);
if (cfg.protocol === "messagepack") builder.withHubProtocol(new MessagePackHubProtocol());
const connection = builder.build();

let current = null; // the turn being streamed: {prompt, updates, item, error}
connection.on("update", (arg) => {
  const msgs = arg?.messages ?? [];
  const last = msgs[msgs.length - 1];
  if (current && last && last.author === "bot" && !last.messageType) current.updates.push(last.text);
});
let closed = null;
connection.onclose((err) => {
  closed = err ? String(err.message ?? err) : "ok";
});

function chat(prompt, index) {
  current = { prompt, updates: [], item: null, error: null, cancelled: false };
  const turn = current;
  let onUpdate = null;
  return new Promise((resolve) => {
    let stopping = false;
    let subscription = null;
    onUpdate = () => {
      if (stopping) return;
      if (cfg.stopAfterUpdates && turn.updates.length >= cfg.stopAfterUpdates) {
        stopping = true;
        connection.stop().then(() => resolve(turn));
      } else if (index === 0 && cfg.cancelAfterUpdates && turn.updates.length >= cfg.cancelAfterUpdates) {
        stopping = true;
        turn.cancelled = true;
        subscription.dispose(); // sends CancelInvocation; no more callbacks for this stream
        setTimeout(() => resolve(turn), 300);
      }
    };
    connection.on("update", onUpdate);
    subscription = connection
      .stream("chat", { message: { author: "user", text: prompt, messageType: "Chat" }, tone: cfg.tone ?? "Creative" })
      .subscribe({
        next: (item) => {
          turn.item = item;
        },
        complete: () => resolve(turn),
        error: (err) => {
          turn.error = String(err?.message ?? err);
          resolve(turn);
        },
      });
  }).finally(() => connection.off("update", onUpdate));
}

try {
  await connection.start();
  for (const [index, prompt] of cfg.prompts.entries()) {
    const turn = await chat(prompt, index);
    out(turn);
    if (connection.state !== signalR.HubConnectionState.Connected) break;
  }
  await connection.stop();
  out({ closed });
  clearTimeout(timer);
  await dispatcher.close();
} catch (err) {
  out({ error: String(err?.stack ?? err) });
  process.exitCode = 2;
  clearTimeout(timer);
}
