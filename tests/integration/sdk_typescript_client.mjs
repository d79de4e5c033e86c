// The reference prompts and the rest of the TypeScript SDK's surface, run by
// test_sdk_typescript.py with the package as `npm install ./sdk/typescript` put it in a
// project (SBX_URL, SBX_API_KEY, SBX_CA_CERT in the environment). One JSON line per step.
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, readlinkSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox, SbxError, Template } from "sbx-sdk";

const say = (step, fields = {}) => console.log(JSON.stringify({ step, ...fields }));

const sb = await Sandbox.create({ name: "sdk-ts", ttl: 1800, egress: { deny: ["198.51.100.7"] } });
say("create", { id: sb.id, state: sb.state, egress: sb.info.egress });
try {
  let r = await sb.commands.run("python3 -c 'print(2**100)'");
  say("python", { exitCode: r.exitCode, stdout: r.stdout });
  const job = await sb.commands.run("sleep 30; echo done", { background: true });
  say("detached", { pid: job.pid, first: await job.poll() });
  r = await job.wait({ timeout: 120 });
  say("waited", { exitCode: r.exitCode, stdout: r.stdout });
  // Streaming: the command goes on only once its first line has reached the callback.
  const seen = [];
  let gate = null;
  r = await sb.commands.run(
    "echo ready; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after; echo oops >&2; exit 4",
    { onStdout: (t) => { seen.push(t); if (t.startsWith("ready")) gate = sb.commands.run("touch /tmp/go"); },
      onStderr: (t) => seen.push(t) });
  await gate;
  say("streamed", { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, first: seen[0] });
  say("stdin", { stdout: (await sb.commands.run("wc -c", { stdin: new Uint8Array([0, 1, 2]) })).stdout });
  await sb.files.write("/root/hello.sh", "#!/bin/sh\necho hello\n", { mode: 0o755 });
  const listed = (await sb.files.list("/root")).filter((e) => e.name === "hello.sh")
    .map((e) => [e.name, e.type, e.mode.toString(8)]);
  say("file", { text: await sb.files.read("/root/hello.sh"),
                run: (await sb.commands.run("/root/hello.sh")).stdout, listed });
  const src = mkdtempSync(join(tmpdir(), "sdk-ts-src-"));
  mkdirSync(join(src, "sub"));
  writeFileSync(join(src, "sub", "data.bin"), Buffer.alloc(2560, 7));
  symlinkSync("sub/data.bin", join(src, "link"));
  await sb.files.uploadDir(src, "/root/proj");
  const back = mkdtempSync(join(tmpdir(), "sdk-ts-back-"));
  const files = await sb.files.downloadDir("/root/proj", back);
  say("dirs", { files, same: readFileSync(join(back, "sub", "data.bin")).equals(Buffer.alloc(2560, 7)),
                link: readlinkSync(join(back, "link")),
                guest: (await sb.commands.run("wc -c < /root/proj/link")).stdout });
  await sb.commands.run("cd /tmp && python3 -m http.server 8000", { background: true });
  await sb.commands.run("for i in $(seq 120); do curl -s -o /dev/null localhost:8000 && exit 0; sleep 0.5; done; exit 1");
  const url = await sb.ports.expose(8000, { public: true });
  const [host, port] = url.split("//")[1].split(":");
  const page = execFileSync("curl", ["-s", "--cacert", process.env.SBX_CA_CERT, "--resolve",
                                     `${host}:${port}:127.0.0.1`, url]).toString();
  say("port", { url, listing: page.includes("Directory listing") });
  say("processes", { count: (await sb.commands.list()).length });
  const m = await sb.metrics({ limit: 2 });
  say("metrics", { sandboxId: m.sandboxId, vcpus: m.vcpus, sampling: m.sampling,
                   atMost: m.samples.length <= 2,
                   newer: (await sb.metrics({ sinceMs: Date.now() + 3600e3 })).samples.length });
  try {
    await sb.commands.run("true", { timeout: 0 });
  } catch (e) {
    say("refused", { isSbx: e instanceof SbxError, code: e.code, status: e.status, message: e.message });
  }
  say("listed", { ids: (await Sandbox.list()).map((s) => s.id) });
  await sb.extend(3600);
  say("stop", { state: (await sb.stop()).state });
  // Egress rules of the stopped sandbox: both lists replaced, then cleared.
  const set = (await sb.setEgress({ allow: ["2001:DB8::1/32", "203.0.113.7"] })).info.egress;
  say("egress", { set, got: (await sb.refresh()).info.egress,
                  cleared: (await sb.setEgress({})).info.egress });
  say("resume", { state: (await sb.resume()).state,
                  still: (await sb.commands.run("cat /tmp/go && echo kept")).stdout });
  // A running copy with its memory: the file is there, its own id and hostname.
  const [copy] = await sb.fork(1);
  say("fork", { state: copy.state, other: copy.id !== sb.id,
                still: (await copy.commands.run("cat /tmp/go && echo kept")).stdout,
                hostname: (await copy.commands.run("hostname")).stdout === copy.info.label + "\n" });
  // Two sandboxes now: a page at a time, one each, the same as all at once.
  const first = await Sandbox.listPage({ limit: 1 });
  const second = await Sandbox.listPage({ limit: 1, cursor: first.nextCursor });
  let bad = null;
  try {
    await Sandbox.listPage({ cursor: "not-a-cursor" });
  } catch (e) {
    bad = { isSbx: e instanceof SbxError, code: e.code, status: e.status, message: e.message };
  }
  say("paged", { all: (await Sandbox.list()).map((s) => s.id),
                 byOne: (await Sandbox.list({ pageSize: 1 })).map((s) => s.id),
                 first: first.sandboxes.map((s) => s.id), cursor: Boolean(first.nextCursor),
                 second: second.sandboxes.map((s) => s.id), end: second.nextCursor ?? null,
                 copy: copy.id, bad });
  await copy.kill();
} finally {
  await sb[Symbol.asyncDispose]();  // what `await using` calls
}
try {
  await Sandbox.connect(sb.id);
  say("after", { found: true });
} catch (e) {
  say("after", { found: false, code: e.code });
}
// A template built in the service from a context directory, listed, and created from.
const ctx = mkdtempSync(join(tmpdir(), "sbx-ts-tpl-"));
writeFileSync(join(ctx, "Dockerfile"), "FROM sbx\nCOPY note.txt /opt/note.txt\nRUN echo built >> /opt/note.txt\n");
writeFileSync(join(ctx, "note.txt"), "from the context\n");
const logs = [];
const build = await Template.build("ts-tpl", ctx, { onLog: (t) => logs.push(t) });
const listed = (await Template.list()).map((t) => [t.name, t.own]);
const made = await Sandbox.create({ template: "ts-tpl" });
const note = (await made.commands.run("cat /opt/note.txt")).stdout;
await made.kill();
say("template", { state: build.state, exitCode: build.exitCode, snapshot: build.snapshotId.startsWith("snap_"),
                  steps: logs.join("").includes("Step 3/3"), listed, note });
say("done");
