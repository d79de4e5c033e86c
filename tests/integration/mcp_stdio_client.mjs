// A real local MCP client (the official TypeScript SDK's StdioClientTransport) launching
// `sbx mcp`, as Claude Desktop, Claude Code and Cursor do; run by test_mcp_stdio.py.
// usage: node mcp_stdio_client.mjs CWD COMMAND [ARG]... with SBX_TEST_CALLS, a JSON list
// of [tool, arguments] pairs ("$SB" in arguments: the last sandbox id a result gave).
// The server gets SBX_URL, SBX_API_KEY and SBX_CA_CERT from this process's environment
// (each only when set), exactly as a client's "env" block would give them.
// Prints one JSON line per step: connect, list, call (result or error, and the progress
// notifications received), stderr (what the server logged), done.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [cwd, command, ...args] = process.argv.slice(2);
const calls = JSON.parse(process.env.SBX_TEST_CALLS || "[]");
// SBX_TEST_SERVER_ENV (a JSON object): a client config's "env" block as it is, instead
// (test_mcp_clients.py runs the configs of docs/clients.md). Either way the SDK adds its
// default environment (PATH, HOME...), as the apps do.
const env = JSON.parse(process.env.SBX_TEST_SERVER_ENV || "{}");
for (const name of ["SBX_URL", "SBX_API_KEY", "SBX_CA_CERT", "ASAN_OPTIONS", "UBSAN_OPTIONS"])
  if (process.env[name] !== undefined && !process.env.SBX_TEST_SERVER_ENV)
    env[name] = process.env[name];
for (const name of ["ASAN_OPTIONS", "UBSAN_OPTIONS"])
  if (process.env[name] !== undefined) env[name] = process.env[name];
const print = (o) => console.log(JSON.stringify(o));

const transport = new StdioClientTransport({ command, args, env, cwd, stderr: "pipe" });
let stderr = "";
transport.stderr.on("data", (d) => { stderr += d; });
const client = new Client({ name: "sbx-stdio-test", version: "0" });
await client.connect(transport);
print({ step: "connect", server: client.getServerVersion(),
        capabilities: client.getServerCapabilities() });
try {
  const { tools } = await client.listTools();
  print({ step: "list", names: tools.map((t) => t.name),
          handoff: tools.find((t) => t.name === "handoff_session") });
} catch (e) {
  print({ step: "list", error: String(e.message), code: e.code });
}
let sandbox = null;
for (const [tool, raw] of calls) {
  const text = JSON.stringify(raw).replaceAll("$SB", sandbox ?? "");
  try {
    // Progress asked for on every call (as mcp_client.mjs does): a long exec's answer comes
    // as an SSE stream whose notifications sbx mcp passes on.
    const progress = [];
    const result = await client.callTool({ name: tool, arguments: JSON.parse(text) }, undefined,
                                         { timeout: 600000, resetTimeoutOnProgress: true,
                                           onprogress: (p) => progress.push(p) });
    const sc = result.structuredContent;
    if (sc?.sandboxId) sandbox = sc.sandboxId;
    else if (tool === "create_sandbox" && sc?.id) sandbox = sc.id;
    print({ step: "call", tool, result, progress });
  } catch (e) {
    print({ step: "call", tool, error: String(e.message), code: e.code });
  }
}
await client.close();
print({ step: "stderr", text: stderr });
print({ step: "done" });
