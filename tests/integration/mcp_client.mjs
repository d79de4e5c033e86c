// A real MCP client (the official TypeScript SDK) against sbx's /mcp, run by test_mcp.py
// and test_edge_balance.py (sbxtest.run_sdk).
// usage: node mcp_client.mjs URL KEY [TOOL ARGS_JSON]...   (NODE_EXTRA_CA_CERTS for TLS;
// SBX_TEST_MCP_SDK picks the SDK and the protocol era, see below)
// Prints one JSON line per step: {"step":"connect",...}, {"step":"list",...}, {"step":"call",...}
// (each call asks for progress; "progress" lists the notifications received).
// Steps may chain, so a whole reference scenario runs through the SDK alone:
//   "$SB" and "$PID" in ARGS_JSON become the last sandbox id and process id a result gave;
//   tool "@poll" {"max":N} calls command_status for $PID once a second until it has exited;
//   tool "@abort" {"ms":N,"tool":T,"arguments":{...},"progress":bool} calls T and gives up
//   after N ms through the SDK's AbortSignal (how each SDK and era cancels: SDK v1 and the
//   2025 era send notifications/cancelled, 2026-07-28 closes the request's stream), and
//   prints {"step":"abort","error"}; "progress" asks for progress (an SSE answer);
//   tool "@fetch" {} GETs the last URL a result gave, through the gateway (by SNI), and
//   prints {"step":"fetch","status",...,"body","via"} (via: the address it connected to).
// SBX_TEST_FRESH_CONNECTIONS=1: one TCP and TLS connection per request instead of Node
// fetch's kept-alive ones, which would pin the client to one gateway behind a balancer
// in TCP mode (test_edge_balance.py). Off by default.
import https from "node:https";
import { Readable } from "node:stream";

const [url, key, ...calls] = process.argv.slice(2);
const fresh = process.env.SBX_TEST_FRESH_CONNECTIONS === "1";
// SBX_TEST_MCP_SDK: "v1" (@modelcontextprotocol/sdk, the 2025 era; the default), or the
// SDK v2 client (@modelcontextprotocol/client) in "v2-legacy", "v2-auto" (server/discover
// first, initialize if the server is of the 2025 era) or "v2-2026" (pinned to 2026-07-28).
// "v1-sse": SDK v1 over the legacy HTTP+SSE transport (2024-11-05): GET /sse, POST
// /messages.
const sdk = process.env.SBX_TEST_MCP_SDK || "v1";
const v2 = sdk.startsWith("v2");
const sse = sdk === "v1-sse";
const { Client } = v2 ? await import("@modelcontextprotocol/client")
                      : await import("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } =
  v2 ? await import("@modelcontextprotocol/client")
     : await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
const negotiation = { "v2-legacy": "legacy", "v2-auto": "auto",
                      "v2-2026": { pin: "2026-07-28" } }[sdk];

// A WHATWG fetch on node:https with agent: false: a connection of its own for each
// request, closed after it. The body streams as it arrives (an SSE answer's progress
// must reach the SDK before the result), and the AbortSignal ends the request.
const abortError = (signal) =>
  signal.reason ?? new DOMException("This operation was aborted", "AbortError");
const freshFetch = (input, init = {}) => new Promise((resolve, reject) => {
  const target = new URL(input instanceof Request ? input.url : String(input));
  const { signal } = init;
  if (signal?.aborted) {
    reject(abortError(signal));
    return;
  }
  const headers = {};
  new Headers(init.headers).forEach((value, name) => { headers[name] = value; });
  let body = init.body ?? null;
  if (body !== null && typeof body !== "string" && !(body instanceof Uint8Array)) {
    if (body instanceof ArrayBuffer) body = new Uint8Array(body);
    else throw new TypeError("freshFetch: only string and byte bodies are supported");
  }
  if (body !== null) headers["content-length"] = String(Buffer.byteLength(body));
  const method = (init.method || "GET").toUpperCase();
  const req = https.request(target, { method, headers, agent: false }, (res) => {
    const answer = new Headers();
    for (let i = 0; i + 1 < res.rawHeaders.length; i += 2)
      answer.append(res.rawHeaders[i], res.rawHeaders[i + 1]);
    const noBody = method === "HEAD" || [204, 205, 304].includes(res.statusCode);
    if (noBody) res.resume();
    const response = new Response(noBody ? null : Readable.toWeb(res),
                                  { status: res.statusCode, statusText: res.statusMessage,
                                    headers: answer });
    Object.defineProperty(response, "url", { value: target.href });
    res.on("close", () => signal?.removeEventListener("abort", onAbort));
    resolve(response);
  });
  // Before the answer, the promise rejects; after it, the body's stream errors.
  const onAbort = () => req.destroy(abortError(signal));
  signal?.addEventListener("abort", onAbort, { once: true });
  req.on("error", (err) => {
    signal?.removeEventListener("abort", onAbort);
    reject(err);
  });
  req.end(body ?? undefined);
});

const { SSEClientTransport } = sse ? await import("@modelcontextprotocol/sdk/client/sse.js")
                                   : {};
const transport = sse
  ? new SSEClientTransport(new URL(url.replace(/\/mcp$/, "/sse")), {
      requestInit: { headers: { Authorization: `Bearer ${key}` } } })
  : new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { Authorization: `Bearer ${key}` } },
      ...(fresh ? { fetch: freshFetch } : {}),
    });
const client = v2 ? new Client({ name: "sbx-test", version: "0" },
                               { versionNegotiation: { mode: negotiation } })
                  : new Client({ name: "sbx-test", version: "0" });
const say = (obj) => console.log(JSON.stringify(obj));
// callTool's request options: SDK v1 takes (params, resultSchema, options), SDK v2
// (params, options). Given in the wrong place they are dropped without a word: the
// 60 s default timeout applies, and neither progress nor an AbortSignal is used.
const callTool = (params, options) =>
  v2 ? client.callTool(params, options) : client.callTool(params, undefined, options);
const last = { sb: "", pid: 0, url: "" };

const call = async (name, args) => {
  // onprogress makes the SDK send a progressToken: the gateway answers over SSE.
  const progress = [];
  const result = await callTool({ name, arguments: args },
                                { timeout: 600000, resetTimeoutOnProgress: true,
                                  onprogress: (p) => progress.push(p) });
  const sc = result.structuredContent || {};
  if (name === "create_sandbox" && sc.id) last.sb = sc.id;
  if (sc.processId !== undefined) last.pid = sc.processId;
  if (sc.url) last.url = sc.url;
  return { result, progress };
};

// GET through the gateway's port proxy: connect to the gateway's address, name the
// sandbox's host by SNI and Host (its *.box name need not resolve here).
const fetchVia = (target) => new Promise((resolve, reject) => {
  // The URL's port is the public origin's (public_url: the balancer's, when there is one).
  const u = new URL(target), gw = new URL(url);
  const host = gw.hostname === "localhost" ? "127.0.0.1" : gw.hostname, port = u.port || 443;
  const req = https.request({ host, port, path: u.pathname, servername: u.hostname,
                              headers: { Host: u.host }, ...(fresh ? { agent: false } : {}) },
                            (res) => {
    let body = "";
    res.setEncoding("utf8");
    res.on("data", (c) => { body += c; });
    res.on("end", () => resolve({ status: res.statusCode, body, via: `${host}:${port}` }));
  });
  req.on("error", reject);
  req.end();
});

try {
  await client.connect(transport);
  say({ step: "connect", sdk, server: client.getServerVersion() ?? null,
        sessionId: transport.sessionId ?? null,
        protocolVersion: (v2 ? client.getNegotiatedProtocolVersion?.() : null) ??
                         transport.protocolVersion ?? null,
        era: v2 ? client.getProtocolEra?.() ?? null : "legacy", transport: sse ? "sse" : "http" });
  const { tools } = await client.listTools();
  say({ step: "list", tools: tools.map((t) => ({ name: t.name, annotations: t.annotations })) });
  for (let i = 0; i + 1 < calls.length; i += 2) {
    const args = JSON.parse(calls[i + 1].replaceAll("$SB", last.sb)
                                        .replaceAll('"$PID"', String(last.pid)));
    if (calls[i] === "@fetch") {
      const { status, body, via } = await fetchVia(last.url);
      say({ step: "fetch", url: last.url, status, body: body.slice(0, 2000), via });
    } else if (calls[i] === "@abort") {
      try {
        const result = await callTool(
          { name: args.tool, arguments: args.arguments },
          { signal: AbortSignal.timeout(args.ms), timeout: 600000,
            ...(args.progress ? { onprogress: () => {} } : {}) });
        say({ step: "abort", result }); // not aborted: the test says so
      } catch (err) {
        say({ step: "abort", error: String(err) });
      }
      // SDK v1 sends its notifications/cancelled without waiting: let it arrive before
      // the session's DELETE, which may otherwise overtake it on another connection.
      await new Promise((r) => setTimeout(r, 1000));
    } else if (calls[i] === "@poll") {
      let out;
      for (let n = 0; n < (args.max || 120); n++) {
        out = await call("command_status", { processId: last.pid });
        if (!out.result.structuredContent || !out.result.structuredContent.running) break;
        await new Promise((r) => setTimeout(r, 1000));
      }
      say({ step: "call", tool: "command_status", ...out });
    } else {
      say({ step: "call", tool: calls[i], ...(await call(calls[i], args)) });
    }
  }
  // A session (the 2025 era) is ended with DELETE; the stateless era has none.
  if (transport.sessionId && transport.terminateSession) await transport.terminateSession();
  await client.close();
  say({ step: "done" });
} catch (err) {
  say({ step: "error", message: String(err && err.stack || err) });
  process.exit(1);
}
