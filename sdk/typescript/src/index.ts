// sbx-sdk: Linux microVM sandboxes from TypeScript (Node 20 or later, no dependencies).
//
//   import { Sandbox } from "sbx-sdk";
//   await using sb = await Sandbox.create({ name: "demo" });
//   console.log((await sb.commands.run("python3 -c 'print(2**100)'")).stdout);
//
// Reads SBX_URL, SBX_API_KEY and SBX_CA_CERT unless given them. Every call is one or a
// few REST requests (docs/rest.md); failures throw SbxError with the service's code.
import { readFileSync } from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import type { Output, Port, Process, Sandbox as SandboxInfo, SandboxMetrics, Snapshot, Template as TemplateInfo,
              TemplateBuild, Usage } from "./types.js";
import { ERROR_CODES, type ErrorCode } from "./types.js";
import { pack, unpack } from "./tar.js";

export type { Output, Port, Process, SandboxInfo, SandboxMetrics, Snapshot, TemplateInfo, TemplateBuild, Usage, ErrorCode };

/** Egress rules: CIDRs, addresses and domain names (a domain matches its subdomains too).
 * deny is checked first; a non-empty allow list means only those (and DNS) are reachable;
 * host, private and special-purpose addresses never are. A list left out is empty. */
export interface Egress {
  allow?: string[];
  deny?: string[];
}
export { ERROR_CODES };

/** A failure the service (or the way to it) reported. */
export class SbxError extends Error {
  constructor(
    message: string,
    readonly code: ErrorCode | "method_not_allowed" | string = "internal",
    readonly status: number = ERROR_CODES[code as ErrorCode] ?? 500,
  ) {
    super(`${message} (${code})`);
    this.name = "SbxError";
  }
}

export interface ConnectionOptions {
  /** The service's URL (https://sbx.example.com); else SBX_URL. */
  url?: string;
  /** An API key (sbx_…); else SBX_API_KEY. */
  apiKey?: string;
  /** A PEM file of the CA to trust for the service; else SBX_CA_CERT. */
  caCert?: string;
  /** Seconds to wait for an answer (default 60). */
  timeout?: number;
}

const RETRIES = 3; // attempts for an answer of `unavailable`; nothing else is retried

interface Answer {
  status: number;
  type: string;
  body: Buffer;
}

/** The one place the SDK speaks HTTP. */
class Client {
  readonly url: string;
  private readonly key: string;
  private readonly ca?: Buffer;
  private readonly timeout: number;

  constructor(o: ConnectionOptions = {}) {
    let url = o.url ?? process.env.SBX_URL;
    const key = o.apiKey ?? process.env.SBX_API_KEY;
    const ca = o.caCert ?? process.env.SBX_CA_CERT;
    if (!url) throw new SbxError("no service URL: pass url or set SBX_URL", "invalid_argument");
    if (!key) throw new SbxError("no API key: pass apiKey or set SBX_API_KEY", "invalid_argument");
    url = url.replace(/\/+$/, "").replace(/\/mcp$/, "");
    this.url = url;
    this.key = key;
    this.ca = ca ? readFileSync(ca) : undefined;
    this.timeout = (o.timeout ?? 60) * 1000;
  }

  private send(method: string, path: string, body: Buffer | null, type: string, accept: string,
               timeoutMs: number, onData?: (chunk: Buffer) => void): Promise<Answer> {
    const target = new URL(this.url + path);
    const mod = target.protocol === "https:" ? https : http;
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { Authorization: `Bearer ${this.key}`, Accept: accept };
      if (body) {
        headers["Content-Type"] = type;
        headers["Content-Length"] = String(body.length);
      }
      const req = mod.request(target, { method, headers, ca: this.ca, timeout: timeoutMs }, (res) => {
        const chunks: Buffer[] = [];
        const streaming = onData && (res.headers["content-type"] ?? "").startsWith("text/event-stream");
        res.on("data", (c: Buffer) => (streaming ? onData!(c) : chunks.push(c)));
        res.on("end", () => resolve({ status: res.statusCode ?? 0,
                                      type: res.headers["content-type"] ?? "", body: Buffer.concat(chunks) }));
        res.on("error", reject);
      });
      req.on("timeout", () => req.destroy(new SbxError(`no answer from ${target} in ${timeoutMs / 1000} s`, "timeout")));
      req.on("error", (e) => reject(e instanceof SbxError ? e : new SbxError(`cannot reach ${target}: ${e.message}`, "unavailable")));
      req.end(body ?? undefined);
    });
  }

  async request(method: string, path: string, o: { query?: Record<string, unknown>; body?: unknown;
                raw?: Buffer; accept?: string; timeout?: number; onData?: (c: Buffer) => void } = {}): Promise<Answer> {
    if (o.query) {
      const q = Object.entries(o.query).filter(([, v]) => v !== undefined && v !== null)
        .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
      if (q.length) path += "?" + q.join("&");
    }
    const body = o.raw ?? (o.body === undefined ? null : Buffer.from(JSON.stringify(o.body)));
    const type = o.raw ? "application/octet-stream" : "application/json";
    let delay = 500;
    for (let attempt = 1; ; attempt++) {
      let answer: Answer;
      try {
        answer = await this.send(method, path, body, type, o.accept ?? "application/json",
                                 o.timeout ? o.timeout * 1000 : this.timeout, o.onData);
      } catch (e) {
        if (!(e instanceof SbxError) || e.code !== "unavailable" || attempt >= RETRIES) throw e;
        await new Promise((r) => setTimeout(r, (delay *= 2) / 2));
        continue;
      }
      if (answer.status < 300) return answer;
      let error = new SbxError(`HTTP ${answer.status}`, "internal", answer.status);
      try {
        const e = JSON.parse(answer.body.toString()).error;
        error = new SbxError(e.message, e.code, answer.status);
      } catch { /* not the service's JSON */ }
      if (error.code !== "unavailable" || attempt >= RETRIES) throw error;
      await new Promise((r) => setTimeout(r, (delay *= 2) / 2));
    }
  }

  async json<T>(method: string, path: string, o: Parameters<Client["request"]>[2] = {}): Promise<T> {
    const a = await this.request(method, path, o);
    return (a.body.length ? JSON.parse(a.body.toString()) : null) as T;
  }
}

/** A finished command. */
export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  pid: number;
  timedOut: boolean;
}

export interface RunOptions {
  /** Return a CommandHandle at once instead of waiting. */
  background?: boolean;
  /** Seconds before a waited command is killed (default 120, at most 600). */
  timeout?: number;
  cwd?: string;
  envs?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Each piece of output as it comes (the answer then streams). */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
}

/** A command started in the background. */
export class CommandHandle {
  stdout = "";
  stderr = "";
  private out = 0;
  private err = 0;
  constructor(private readonly sandbox: Sandbox, readonly pid: number) {}

  /** New output since the last poll (added to stdout/stderr); null while it runs. */
  async poll(): Promise<CommandResult | null> {
    const st = await this.sandbox.client.json<Output & { running: boolean }>(
      "GET", `/v1/sandboxes/${this.sandbox.id}/processes/${this.pid}`,
      { query: { stdoutOffset: this.out, stderrOffset: this.err } });
    this.stdout += st.stdout;
    this.stderr += st.stderr;
    this.out = st.stdoutNextOffset;
    this.err = st.stderrNextOffset;
    if (st.running) return null;
    if (st.stdoutTruncated || st.stderrTruncated) return this.poll();
    return { exitCode: st.exitCode ?? -1, stdout: this.stdout, stderr: this.stderr, pid: this.pid,
             timedOut: st.timedOut };
  }

  /** Polls until it ends. */
  async wait(o: { timeout?: number; interval?: number } = {}): Promise<CommandResult> {
    const deadline = o.timeout ? Date.now() + o.timeout * 1000 : Infinity;
    for (;;) {
      const r = await this.poll();
      if (r) return r;
      if (Date.now() > deadline) throw new SbxError(`process ${this.pid} still runs`, "timeout");
      await new Promise((res) => setTimeout(res, (o.interval ?? 1) * 1000));
    }
  }

  kill(signal = "SIGKILL") {
    return this.sandbox.commands.kill(this.pid, signal);
  }
}

class Commands {
  constructor(private readonly sandbox: Sandbox) {}

  run(cmd: string, o: RunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string, o?: RunOptions): Promise<CommandResult>;
  async run(cmd: string, o: RunOptions = {}): Promise<CommandResult | CommandHandle> {
    const timeout = o.timeout ?? 120;
    const body: Record<string, unknown> = { command: cmd, timeout };
    if (o.background) body.detached = true;
    if (o.cwd) body.cwd = o.cwd;
    if (o.envs) body.env = o.envs;
    if (o.stdin !== undefined) {
      body.stdin = Buffer.from(o.stdin).toString("base64");
      body.stdinEncoding = "base64";
    }
    const path = `/v1/sandboxes/${this.sandbox.id}/exec`;
    const client = this.sandbox.client;
    if (o.background)
      return new CommandHandle(this.sandbox, (await client.json<Output>("POST", path, { body })).processId);
    if (!o.onStdout && !o.onStderr) {
      const out = await client.json<Output>("POST", path, { body, timeout: timeout + 60 });
      return { exitCode: out.exitCode ?? -1, stdout: out.stdout, stderr: out.stderr,
               pid: out.processId, timedOut: out.timedOut };
    }
    // Server-Sent Events: start, stdout, stderr, exit (docs/rest.md).
    const stdout: string[] = [], stderr: string[] = [];
    let end: Output | null = null, failure: SbxError | null = null, pid = 0, pending = "";
    const onEvent = (event: string, data: string) => {
      const d = JSON.parse(data);
      if (event === "start") pid = d.processId;
      else if (event === "stdout") { stdout.push(d.text); o.onStdout?.(d.text); }
      else if (event === "stderr") { stderr.push(d.text); o.onStderr?.(d.text); }
      else if (event === "exit") end = d;
      else if (event === "error") failure = new SbxError(d.error.message, d.error.code);
    };
    const a = await client.request("POST", path, {
      body, accept: "text/event-stream", timeout: timeout + 60,
      onData: (chunk) => {
        pending += chunk.toString();
        let cut;
        while ((cut = pending.indexOf("\n\n")) >= 0) {
          const block = pending.slice(0, cut);
          pending = pending.slice(cut + 2);
          let event = "message";
          const data: string[] = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (data.length) onEvent(event, data.join("\n"));
        }
      },
    });
    if (!a.type.startsWith("text/event-stream")) end = JSON.parse(a.body.toString()) as Output;
    if (failure) throw failure;
    const done = end as Output | null;
    if (!done) throw new SbxError("the output stream ended before the command did", "unavailable");
    return { exitCode: done.exitCode ?? -1, stdout: stdout.join("") + done.stdout,
             stderr: stderr.join("") + done.stderr, pid: done.processId || pid, timedOut: done.timedOut };
  }

  /** The processes exec started that the guest keeps. */
  async list(): Promise<Process[]> {
    return (await this.sandbox.client.json<{ processes: Process[] }>(
      "GET", `/v1/sandboxes/${this.sandbox.id}/processes`)).processes;
  }

  kill(pid: number, signal = "SIGKILL") {
    return this.sandbox.client.json("POST", `/v1/sandboxes/${this.sandbox.id}/processes/${pid}/kill`,
                                    { body: { signal } });
  }
}

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

class Files {
  constructor(private readonly sandbox: Sandbox) {}

  /** The file's contents as text, or its bytes with { format: "bytes" }. */
  read(path: string): Promise<string>;
  read(path: string, o: { format: "bytes" }): Promise<Uint8Array>;
  async read(path: string, o: { format?: "text" | "bytes" } = {}): Promise<string | Uint8Array> {
    const a = await this.sandbox.client.request("GET", `/v1/sandboxes/${this.sandbox.id}/files`,
                                                { query: { path }, accept: "application/octet-stream" });
    return o.format === "bytes" ? new Uint8Array(a.body) : a.body.toString();
  }

  /** Writes text or bytes (at most 16 MiB); mode: permission bits, e.g. 0o755. */
  write(path: string, data: string | Uint8Array, o: { mode?: number } = {}) {
    return this.sandbox.client.json<{ path: string; size: number }>(
      "PUT", `/v1/sandboxes/${this.sandbox.id}/files`,
      { query: { path, mode: o.mode?.toString(8) }, raw: Buffer.from(data) });
  }

  /** Copies a local directory (files, links, modes) to path in the sandbox, as one tar
   *  archive (16 MiB at most). */
  async uploadDir(local: string, path: string): Promise<void> {
    const archive = pack(local);
    if (archive.length > 16 * 1024 * 1024)
      throw new SbxError(`${local} is ${archive.length} bytes as an archive; at most 16 MiB`, "too_large");
    const tmp = `/tmp/.sbx-up-${process.pid}-${Date.now()}.tar`;
    await this.write(tmp, archive, { mode: 0o600 });
    const r = await this.sandbox.commands.run(
      `mkdir -p ${quote(path)} && tar -xf ${tmp} -C ${quote(path)} --no-same-owner; rc=$?; rm -f ${tmp}; exit $rc`);
    if (r.exitCode) throw new SbxError(`unpacking in the sandbox failed: ${r.stderr.trim()}`, "internal");
  }

  /** Copies a directory of the sandbox to local (made if missing); nothing in the archive
   *  is trusted (absolute names, "..", devices, writes through links are refused). */
  async downloadDir(path: string, local: string): Promise<number> {
    const tmp = `/tmp/.sbx-down-${process.pid}-${Date.now()}.tar`;
    const r = await this.sandbox.commands.run(`tar --format=ustar -cf ${tmp} -C ${quote(path)} .`);
    if (r.exitCode) throw new SbxError(r.stderr.trim() || `${path}: not a directory`, "not_found");
    try {
      return unpack(Buffer.from(await this.read(tmp, { format: "bytes" })), local);
    } finally {
      await this.sandbox.commands.run(`rm -f ${tmp}`);
    }
  }

  /** A directory's entries. */
  async list(path: string): Promise<Array<{ name: string; path: string; type: string; size: number; mode: number }>> {
    const r = await this.sandbox.commands.run(
      `find ${quote(path)} -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%m\\t%p\\n'`);
    if (r.exitCode) throw new SbxError(r.stderr.trim() || `${path}: not a directory`, "not_found");
    const kinds: Record<string, string> = { f: "file", d: "dir", l: "link" };
    return r.stdout.split("\n").filter(Boolean).map((line) => {
      const [kind, size, mode, full] = line.split("\t");
      return { name: full.slice(full.lastIndexOf("/") + 1), path: full, type: kinds[kind] ?? "other",
               size: Number(size), mode: parseInt(mode, 8) };
    }).sort((a, b) => a.name.localeCompare(b.name));
  }
}

class Ports {
  constructor(private readonly sandbox: Sandbox) {}

  /** Publishes the guest's port at https://LABEL-PORT.BOX_DOMAIN: its URL. */
  async expose(port: number, o: { public?: boolean } = {}): Promise<string> {
    return (await this.sandbox.client.json<Port>("POST", `/v1/sandboxes/${this.sandbox.id}/ports`,
                                                 { body: { port, public: !!o.public } })).url;
  }

  unexpose(port: number) {
    return this.sandbox.client.json<Port>("DELETE", `/v1/sandboxes/${this.sandbox.id}/ports/${port}`);
  }
}

export interface CreateOptions extends ConnectionOptions {
  name?: string;
  type?: "small" | "medium" | "large";
  /** Seconds before it stops by itself (the plan's default when absent). */
  ttl?: number;
  network?: boolean;
  /** A request to one of its port URLs resumes it when stopped (default true). */
  autoResume?: boolean;
  labels?: Record<string, string>;
  snapshotId?: string;
  /** A template's name (Template.list(); not with snapshotId): its files and start command, restored. */
  template?: string;
  /** Its egress rules (none beyond the fixed policy when absent). */
  egress?: Egress;
}

/** One sandbox. `await using sb = await Sandbox.create()` deletes it at the end. */
/** One page of Sandbox.listPage: its sandboxes, and the next page's cursor while there may be more. */
export interface SandboxPage {
  sandboxes: Sandbox[];
  nextCursor?: string;
}

export class Sandbox {
  readonly commands = new Commands(this);
  readonly files = new Files(this);
  readonly ports = new Ports(this);

  private constructor(readonly client: Client, public info: SandboxInfo) {}

  get id() { return this.info.id; }
  get url() { return this.info.url; }
  get state() { return this.info.state; }

  /** A new sandbox, ready. */
  static async create(o: CreateOptions = {}): Promise<Sandbox> {
    const client = new Client(o);
    const body: Record<string, unknown> = { network: o.network ?? true, autoResume: o.autoResume ?? true };
    if (o.name) body.name = o.name;
    if (o.type) body.type = o.type;
    if (o.ttl) body.ttlSeconds = o.ttl;
    if (o.labels) body.labels = o.labels;
    if (o.snapshotId) body.snapshotId = o.snapshotId;
    if (o.template) body.template = o.template;
    if (o.egress) body.egress = { allow: o.egress.allow ?? [], deny: o.egress.deny ?? [] };
    return new Sandbox(client, await client.json<SandboxInfo>("POST", "/v1/sandboxes", { body, timeout: 300 }));
  }

  static async connect(id: string, o: ConnectionOptions = {}): Promise<Sandbox> {
    const client = new Client(o);
    return new Sandbox(client, await client.json<SandboxInfo>("GET", `/v1/sandboxes/${id}`));
  }

  /** The account's sandboxes, newest first: every page of them (pageSize a request, 1 to 1000). */
  static async list(o: ConnectionOptions & { pageSize?: number } = {}): Promise<Sandbox[]> {
    const found: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const page = await Sandbox.listPage({ ...o, limit: o.pageSize ?? 100, cursor });
      found.push(...page.sandboxes);
      cursor = page.nextCursor;
    } while (cursor);
    return found;
  }

  /**
   * One page of the account's sandboxes, newest first: at most limit (1 to 1000, default 100),
   * and nextCursor, while there may be more, to pass as cursor for the page after (absent at
   * the end). No page repeats or skips a sandbox that was there throughout, whatever is created
   * or deleted between pages. A cursor this service did not give fails invalid_argument.
   */
  static async listPage(o: ConnectionOptions & { limit?: number; cursor?: string } = {}): Promise<SandboxPage> {
    const client = new Client(o);
    const query: Record<string, unknown> = { limit: o.limit ?? 100 };
    if (o.cursor) query.cursor = o.cursor;
    const page = await client.json<{ sandboxes: SandboxInfo[]; nextCursor?: string }>("GET", "/v1/sandboxes", { query });
    const sandboxes = page.sandboxes.map((info) => new Sandbox(client, info));
    return page.nextCursor ? { sandboxes, nextCursor: page.nextCursor } : { sandboxes };
  }

  async refresh() { this.info = await this.client.json<SandboxInfo>("GET", `/v1/sandboxes/${this.id}`); return this; }
  /** Stops it with its memory kept (no running time billed until resume). */
  async stop() { this.info = await this.client.json<SandboxInfo>("POST", `/v1/sandboxes/${this.id}/stop`, { timeout: 300 }); return this; }
  async resume() { this.info = await this.client.json<SandboxInfo>("POST", `/v1/sandboxes/${this.id}/resume`, { timeout: 300 }); return this; }
  /** It now stops ttl seconds from now. */
  async extend(ttl: number) {
    this.info = await this.client.json<SandboxInfo>("POST", `/v1/sandboxes/${this.id}/extend`, { body: { ttlSeconds: ttl } });
    return this;
  }
  /** Switches autoResume: whether a request to one of its port URLs resumes it. */
  async setAutoResume(on: boolean) {
    this.info = await this.client.json<SandboxInfo>("PATCH", `/v1/sandboxes/${this.id}`, { body: { autoResume: on } });
    return this;
  }
  /** Replaces its egress rules (both lists; `setEgress({})` clears them). A ready sandbox's
   * firewall changes before the answer; a stopped one's when it resumes. */
  async setEgress(rules: Egress) {
    const body = { egress: { allow: rules.allow ?? [], deny: rules.deny ?? [] } };
    this.info = await this.client.json<SandboxInfo>("PATCH", `/v1/sandboxes/${this.id}`, { body });
    return this;
  }
  /** CPU, memory, disk and network: the latest figures and its host's samples (oldest
   * first); sinceMs: only samples after it (a sample's timeMs), limit: the newest that many. */
  metrics(o: { sinceMs?: number; limit?: number } = {}) {
    return this.client.json<SandboxMetrics>("GET", `/v1/sandboxes/${this.id}/metrics`,
                                            { query: { sinceMs: o.sinceMs, limit: o.limit } });
  }
  /** count (1 to 10) running copies of it with its memory, each a Sandbox of its own (own id,
   * hostname, MAC address and random state, billed on its own), ready: its processes run on
   * in each, its files are there. It is paused for a moment and runs on. All or nothing. */
  async fork(count = 1): Promise<Sandbox[]> {
    const answer = await this.client.json<{ sandboxes: SandboxInfo[] }>(
      "POST", `/v1/sandboxes/${this.id}/fork`, { body: { count }, timeout: 300 });
    return answer.sandboxes.map((info) => new Sandbox(this.client, info));
  }
  /** Deletes it: its disk, memory and automatic snapshots go. */
  async kill() {
    try {
      this.info = await this.client.json<SandboxInfo>("DELETE", `/v1/sandboxes/${this.id}`, { timeout: 300 });
    } catch (e) {
      if (!(e instanceof SbxError) || e.code !== "not_found") throw e;
    }
  }
  /** Saves its disk and memory (new sandboxes: create({ snapshotId })). */
  snapshot(o: { name?: string; labels?: Record<string, string> } = {}) {
    return this.client.json<Snapshot>("POST", `/v1/sandboxes/${this.id}/snapshots`, { body: o, timeout: 600 });
  }
  async snapshots(): Promise<Snapshot[]> {
    return (await this.client.json<{ snapshots: Snapshot[] }>("GET", "/v1/snapshots", { query: { sandboxId: this.id } })).snapshots;
  }
  deleteSnapshot(id: string) { return this.client.json<Snapshot>("DELETE", `/v1/snapshots/${id}`); }

  async [Symbol.asyncDispose]() { await this.kill(); }
}

/** Templates (docs/templates.md): the ones this account can use, and builds in the service. */
export class Template {
  /** Its own templates (the newest of each name), then the operator's published ones it has none of. */
  static async list(o: ConnectionOptions = {}): Promise<TemplateInfo[]> {
    return (await new Client(o).json<{ templates: TemplateInfo[] }>("GET", "/v1/templates")).templates;
  }

  /**
   * Builds template name in the service from the context directory (sent as a tar archive, 16 MiB
   * at most) and its Dockerfile (dockerfile: a path inside it, default Dockerfile). onLog gets the
   * log as it grows. Resolves with the ended build: state "succeeded" or "failed", exitCode (0
   * built, 1 a step failed, 2 refused), snapshotId.
   */
  static async build(name: string, context: string, o: ConnectionOptions & { dockerfile?: string;
                     noCache?: boolean; public?: boolean; onLog?: (text: string) => void } = {}): Promise<TemplateBuild> {
    const client = new Client(o);
    const query = { name, dockerfile: o.dockerfile, noCache: o.noCache ? "true" : undefined,
                    public: o.public ? "true" : undefined };
    let build = await client.json<TemplateBuild>("POST", "/v1/templates", { query, raw: pack(context) });
    let logOffset = 0;
    for (;;) {
      build = await client.json<TemplateBuild>("GET", `/v1/templates/builds/${build.id}`, { query: { logOffset } });
      if (build.log && o.onLog) o.onLog(build.log);
      logOffset = build.logOffset;
      if (build.state !== "running") return build;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}
