// ts_server - the gateway-throughput comparison (b): an MCP server on the official
// TypeScript SDK (Streamable HTTP, JSON responses, sessions) over node's HTTPS with the
// same certificate as the gateway, answering the same 19 tool names; get_sandbox from
// memory with the sbx answer's shape. Authorization: Bearer TOKEN is checked (a string
// compare: the cheapest possible "authenticated").
//
//   node ts_server.mjs PORT CERT KEY TOKEN
import https from "node:https";
import fs from "node:fs";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const [port, certFile, keyFile, token] = process.argv.slice(2);
const NAMES = ["create_sandbox", "list_sandboxes", "get_sandbox", "exec", "command_status",
  "kill_command", "list_commands", "read_file", "write_file", "host_port", "stop_sandbox", "resume_sandbox",
  "extend_sandbox", "rename_sandbox", "label_sandbox", "delete_sandbox", "save_snapshot",
  "list_snapshots", "delete_snapshot"];
const SANDBOX = {
  id: "sb_bench00000", name: "bench", state: "ready", type: "small",
  url: "https://quiet-brave-otter.box.localhost", labels: {},
  createdAt: "2026-01-01T00:00:00Z", deadline: "2026-01-01T01:00:00Z",
};

function newServer() {
  const server = new McpServer({ name: "ts-bench", version: "1.0.0" });
  for (const name of NAMES) {
    if (name === "get_sandbox") {
      server.registerTool(name, {
        description: "Describe one sandbox: its state, URL and deadline.",
        inputSchema: { sandboxId: z.string().optional() },
        annotations: { readOnlyHint: true },
      }, async ({ sandboxId }) => {
        const sb = { ...SANDBOX, id: sandboxId || SANDBOX.id };
        return {
          content: [{ type: "text", text: `Sandbox ${sb.id} is ready. URL: ${sb.url}.` }],
          structuredContent: sb,
        };
      });
    } else {
      server.registerTool(name, { description: `${name} (not served by the bench)`,
        inputSchema: { sandboxId: z.string().optional() } },
        async () => ({ content: [{ type: "text", text: "unavailable" }], isError: true }));
    }
  }
  return server;
}

const transports = {};
const httpsServer = https.createServer({
  cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile), keepAliveTimeout: 60000,
}, async (req, res) => {
  if (req.headers.authorization !== `Bearer ${token}`) {
    res.writeHead(401, { "Content-Type": "application/json" });
    res.end('{"jsonrpc":"2.0","error":{"code":-32001,"message":"Unauthorized"},"id":null}');
    return;
  }
  const sid = req.headers["mcp-session-id"];
  let transport = sid ? transports[sid] : undefined;
  if (!transport) {
    if (sid) {
      res.writeHead(404).end();
      return;
    }
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      enableJsonResponse: true,
      onsessioninitialized: (id) => { transports[id] = transport; },
    });
    await newServer().connect(transport);
  }
  await transport.handleRequest(req, res);
});
httpsServer.keepAliveTimeout = 60000;
httpsServer.listen(Number(port), "127.0.0.1", () => console.log("ready"));
