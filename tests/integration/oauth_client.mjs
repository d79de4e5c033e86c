// Real OAuth clients against sbx, run by test_oauth.py (NODE_EXTRA_CA_CERTS for TLS).
// usage: node oauth_client.mjs oauth4webapi|sdk MCP_URL EMAIL PASSWORD
// The person's part (sign-in and Allow) is done headlessly by posting the HTML forms;
// everything a client does is the library's. Prints one JSON line per step, then
// {"step":"done"}.
//   oauth4webapi: 401 → resource metadata → server metadata → registration → authorize →
//                 code + PKCE → tools/list → refresh → tools/list → revoke → 401
//   sdk:          the MCP TypeScript SDK's OAuthClientProvider does all of it on connect
import * as oauth from "oauth4webapi";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [mode, mcpUrl, email, password] = process.argv.slice(2);
const REDIRECT = "http://127.0.0.1:9/callback";
const say = (obj) => console.log(JSON.stringify(obj));
const unescape = (s) =>
  s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, "<").replace(/&gt;/g, ">")
    .replace(/&amp;/g, "&");

// The person in the browser: sign in, press Allow. Returns the redirect's URL.
async function browser(authorizationUrl) {
  const jar = {};
  const go = async (url, init = {}) => {
    const headers = { ...(init.headers || {}) };
    const cookie = Object.entries(jar).map(([k, v]) => `${k}=${v}`).join("; ");
    if (cookie) headers.cookie = cookie;
    const res = await fetch(url, { ...init, headers, redirect: "manual" });
    for (const line of res.headers.getSetCookie()) {
      const pair = line.split(";")[0];
      const at = pair.indexOf("=");
      jar[pair.slice(0, at)] = pair.slice(at + 1);
    }
    return res;
  };
  const hidden = (html) => {
    const out = {};
    for (const m of html.matchAll(/<input type="hidden" name="([^"]*)" value="([^"]*)">/g))
      out[unescape(m[1])] = unescape(m[2]);
    return out;
  };
  const action = new URL("/oauth/authorize", authorizationUrl);
  let res = await go(authorizationUrl);
  let html = await res.text();
  if (res.status !== 200) throw new Error(`authorize page: ${res.status} ${html}`);
  if (html.includes('value="signin"')) {
    const form = new URLSearchParams({ ...hidden(html), email, password, action: "signin" });
    res = await go(action, { method: "POST", body: form });
    html = await res.text();
    if (!html.includes('value="allow"')) throw new Error(`sign-in failed: ${html}`);
  }
  res = await go(action, { method: "POST", body: new URLSearchParams({ ...hidden(html), action: "allow" }) });
  if (res.status !== 302) throw new Error(`consent: ${res.status} ${await res.text()}`);
  return new URL(res.headers.get("location"));
}

async function listTools(token) {
  const res = await fetch(mcpUrl, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      Authorization: `Bearer ${token}`,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
  });
  const body = await res.json();
  return { status: res.status, count: body.result ? body.result.tools.length : 0, body };
}

async function withOauth4webapi() {
  // 1. The 401 names the resource metadata.
  const first = await fetch(mcpUrl, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  const www = first.headers.get("www-authenticate");
  say({ step: "401", status: first.status, www });
  if (first.status !== 401 || !www.includes("resource_metadata=")) throw new Error("no 401 challenge");
  // 2. Resource metadata, then the authorization server's.
  const resource = new URL(mcpUrl);
  const rs = await oauth.processResourceDiscoveryResponse(resource, await oauth.resourceDiscoveryRequest(resource));
  const issuer = new URL(rs.authorization_servers[0]);
  const as = await oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, { algorithm: "oauth2" }));
  say({ step: "discover", issuer: as.issuer, resource: rs.resource });
  // 3. Dynamic registration.
  const client = await oauth.processDynamicClientRegistrationResponse(
    await oauth.dynamicClientRegistrationRequest(as, {
      client_name: "oauth4webapi test",
      redirect_uris: [REDIRECT],
      token_endpoint_auth_method: "none",
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
    }),
  );
  say({ step: "register", client_id: client.client_id });
  // 4. Authorization with PKCE, the person signs in and allows.
  const verifier = oauth.generateRandomCodeVerifier();
  const state = oauth.generateRandomState();
  const url = new URL(as.authorization_endpoint);
  url.search = new URLSearchParams({
    response_type: "code",
    client_id: client.client_id,
    redirect_uri: REDIRECT,
    code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
    code_challenge_method: "S256",
    state,
    scope: "sbx",
    resource: rs.resource,
  }).toString();
  const callback = await browser(url.href);
  const params = oauth.validateAuthResponse(as, client, callback, state);
  // 5. The code for tokens.
  const tokens = await oauth.processAuthorizationCodeResponse(
    as, client,
    await oauth.authorizationCodeGrantRequest(as, client, oauth.None(), params, REDIRECT, verifier, {
      additionalParameters: { resource: rs.resource },
    }),
  );
  say({ step: "token", token_type: tokens.token_type, expires_in: tokens.expires_in });
  // 6. MCP with the token.
  const tools = await listTools(tokens.access_token);
  say({ step: "tools", status: tools.status, count: tools.count });
  // 7. Refresh (rotated), and MCP with the new token.
  const refreshed = await oauth.processRefreshTokenResponse(
    as, client, await oauth.refreshTokenGrantRequest(as, client, oauth.None(), tokens.refresh_token),
  );
  if (refreshed.refresh_token === tokens.refresh_token) throw new Error("refresh token not rotated");
  const again = await listTools(refreshed.access_token);
  say({ step: "refreshed", tools: again.count });
  // 8. Revoke, then /mcp refuses the token (the gateway may trust it for a second).
  await oauth.processRevocationResponse(
    await oauth.revocationRequest(as, client, oauth.None(), refreshed.access_token),
  );
  let after;
  for (let i = 0; i < 30; i++) {
    after = await listTools(refreshed.access_token);
    if (after.status === 401) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  say({ step: "revoked", status: after.status });
}

async function withSdk() {
  let code = null;
  const provider = {
    get redirectUrl() { return REDIRECT; },
    get clientMetadata() {
      return {
        client_name: "MCP SDK test",
        redirect_uris: [REDIRECT],
        grant_types: ["authorization_code", "refresh_token"],
        response_types: ["code"],
        token_endpoint_auth_method: "none",
      };
    },
    state() { return "sdk-state"; },
    clientInformation() { return this._client; },
    saveClientInformation(info) { this._client = info; },
    tokens() { return this._tokens; },
    saveTokens(tokens) { this._tokens = tokens; },
    async redirectToAuthorization(url) {
      const callback = await browser(url.href);
      if (callback.searchParams.get("state") !== "sdk-state") throw new Error("state not echoed");
      code = callback.searchParams.get("code");
    },
    saveCodeVerifier(v) { this._verifier = v; },
    codeVerifier() { return this._verifier; },
  };
  const client = new Client({ name: "sbx-oauth-test", version: "0" });
  let transport = new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: provider });
  try {
    await client.connect(transport);
  } catch (e) {
    if (!(e instanceof UnauthorizedError) || !code) throw e;
    say({ step: "authorized", client_id: provider._client.client_id });
    await transport.finishAuth(code);
    transport = new StreamableHTTPClientTransport(new URL(mcpUrl), { authProvider: provider });
    await client.connect(transport);
  }
  const tools = await client.listTools();
  say({ step: "tools", count: tools.tools.length });
  await client.close();
}

try {
  if (mode === "oauth4webapi") await withOauth4webapi();
  else if (mode === "sdk") await withSdk();
  else throw new Error(`unknown mode ${mode}`);
  say({ step: "done" });
} catch (e) {
  say({ step: "error", message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
}
