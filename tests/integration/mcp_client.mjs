// A real MCP client (the official TypeScript SDK) against sbx's /mcp, run by test_mcp.py.
// usage: node mcp_client.mjs URL KEY [TOOL ARGS_JSON]...   (NODE_EXTRA_CA_CERTS for TLS)
// Prints one JSON line per step: {"step":"connect",...}, {"step":"list",...}, {"step":"call",...}
// (each call asks for progress; "progress" lists the notifications received).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, key, ...calls] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: "sbx-test", version: "0" });
const say = (obj) => console.log(JSON.stringify(obj));
try {
  await client.connect(transport);
  say({ step: "connect", server: client.getServerVersion(), sessionId: transport.sessionId,
        protocolVersion: transport.protocolVersion ?? null });
  const { tools } = await client.listTools();
  say({ step: "list", tools: tools.map((t) => ({ name: t.name, annotations: t.annotations })) });
  for (let i = 0; i + 1 < calls.length; i += 2) {
    // onprogress makes the SDK send a progressToken: the gateway answers over SSE.
    const progress = [];
    const result = await client.callTool({ name: calls[i], arguments: JSON.parse(calls[i + 1]) },
                                         undefined, { timeout: 600000, resetTimeoutOnProgress: true,
                                                      onprogress: (p) => progress.push(p) });
    say({ step: "call", tool: calls[i], result, progress });
  }
  await transport.terminateSession();
  await client.close();
  say({ step: "done" });
} catch (err) {
  say({ step: "error", message: String(err && err.stack || err) });
  process.exit(1);
}
