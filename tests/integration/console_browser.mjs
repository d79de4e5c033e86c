// The account console in a real browser, for tests/integration/test_console.py: Debian's
// chromium, headless, driven by playwright-core. Every name resolves to 127.0.0.1
// (--host-resolver-rules), so the gateway's and the sandboxes' names reach the test's
// own gateway only.
//
//   node console_browser.mjs '<json: gateway, email, password, sandboxId, key, shots>'
//
// Prints one JSON line per step; after a step that changes something it waits for a
// line on stdin (the test checked it through REST) before going on. Screenshots go to
// the shots directory.
import { launch } from "./launch.mjs";
import { createInterface } from "node:readline";

const cfg = JSON.parse(process.argv[2]);
const input = createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
const out = (step, data) => console.log(JSON.stringify({ step, ...data }));
// A step the test checks before the next one: waits for its "go on".
const check = async (step, data) => {
  out(step, data);
  const answer = await lines.next();
  if (answer.done || answer.value.trim() !== "ok") throw new Error(`test said no after ${step}`);
};
const shot = async (page, name) => {
  const path = `${cfg.shots}/${name}.png`;
  await page.screenshot({ path, fullPage: true });
  out("screenshot", { name, path });
};

const browser = await launch();
try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true,
                                             viewport: { width: 1280, height: 900 } });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: cfg.gateway });
  const page = await context.newPage();
  page.setDefaultTimeout(60000);
  const errors = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.accept(); });
  const row = `tr.sandbox[data-id="${cfg.sandboxId}"]`;
  const submit = async (selector) =>
    Promise.all([page.waitForNavigation(), page.click(selector)]);

  // A wrong password: the form again, the email kept.
  await page.goto(`${cfg.gateway}/account`);
  await page.fill("#email", cfg.email);
  await page.fill("#password", "not the password");
  await submit("button[value=signin]");
  out("wrong", { email: await page.inputValue("#email"),
                 alert: await page.textContent("[role=alert]") });
  await shot(page, "1-wrong-password");

  // The right one: the console, with the sandbox running.
  await page.fill("#password", cfg.password);
  await submit("button[value=signin]");
  const sandbox = async () => ({
    state: await page.getAttribute(row, "data-state"),
    url: await page.textContent(`${row} a.url`),
    href: await page.getAttribute(`${row} a.url`, "href"),
    type: await page.textContent(`${row} td:nth-child(3)`),
    running: await page.getAttribute(`${row} td.running`, "data-seconds"),
    cost: await page.textContent(`${row} td.cost`),
    ports: await page.$$eval(`${row} .port`, (ps) => ps.map((p) => p.textContent)),
    sparks: await page.$$eval(`${row} .spark`, (ss) => ss.map((s) => (
      { kind: s.className, text: s.lastChild.textContent.trim() }))),
  });
  out("console", { url: page.url(), signedIn: await page.textContent("#signed-in"),
                   sandbox: await sandbox() });
  await shot(page, "2-console");

  // Stop and resume from the page; the test asks REST after each.
  await submit(`${row} button[value=stop]`);
  await check("stopped", { sandbox: await sandbox() });
  await submit(`${row} button[value=resume]`);
  await check("resumed", { sandbox: await sandbox() });

  // A new key: shown once, copied with its button, read back from the clipboard.
  await page.fill("#name", "from the console");
  await page.selectOption("#preset", "read-only");
  await submit("button[value=create]");
  const shown = (await page.textContent("#new-key")).trim();
  await page.click("button[data-copy=new-key]");
  await page.waitForFunction(() =>
    document.querySelector("button[data-copy=new-key]").textContent === "Copied");
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  await shot(page, "3-new-key");
  await check("key", { shown, copied });

  // The charts and the Connect snippets, on a fresh load (the key is not shown again).
  await page.goto(`${cfg.gateway}/account`);
  const bars = (id) => page.$$eval(`#${id} rect.bar`, (rs) => rs.map((r) => ({
    day: r.dataset.day, seconds: Number(r.dataset.seconds),
    height: Number(r.getAttribute("height")) })));
  const snippets = await page.$$eval("#connect pre", (ps) =>
    Object.fromEntries(ps.map((p) => [p.id, p.textContent])));
  out("page", { chart14: await bars("chart-14"), chart30: await bars("chart-30"),
                tables: await page.$$eval(".chart table tr", (rs) => rs.length),
                newKeyAgain: await page.$("#new-key") !== null, snippets,
                keys: await page.$$eval("tr.key", (rs) => rs.map((r) => r.textContent)) });
  await page.locator("#usage").scrollIntoViewIfNeeded();
  await shot(page, "4-console-after");

  // The sandbox's URL: its owner's page through the console's link, without the
  // session cookie going to the sandbox's host.
  const href = await page.getAttribute(`${row} a.url`, "href");
  const boxCookies = [];
  page.on("request", async (req) => {
    if (new URL(req.url()).hostname !== new URL(cfg.gateway).hostname)
      boxCookies.push((await req.allHeaders())["cookie"] || null);
  });
  const ownerRes = await page.goto(href);
  out("owner", { href, status: ownerRes.status(), text: await page.textContent("body"),
                 ports: await page.$$eval("tr.port", (rs) => rs.map((r) => r.textContent)),
                 cookies: boxCookies });
  await shot(page, "5-box-owner");

  // Anyone else: a page saying what this is, nothing of the sandbox.
  const plain = href.split("?")[0];
  const guest = await browser.newContext({ ignoreHTTPSErrors: true });
  const other = await guest.newPage();
  const anonRes = await other.goto(plain);
  out("anonymous", { status: anonRes.status(), text: await other.textContent("body") });
  await shot(other, "6-box-anonymous");
  const stale = await other.goto(href.replace(/sbx_owner=[^&]*/, "sbx_owner=acc_x.1.forged"));
  out("forged", { status: stale.status(), text: await other.textContent("body") });
  // With the owner's API key, as private ports take it.
  const keyed = await browser.newContext({ ignoreHTTPSErrors: true,
    extraHTTPHeaders: { Authorization: `Bearer ${cfg.key}` } });
  const byKey = await keyed.newPage();
  const keyRes = await byKey.goto(plain);
  out("bykey", { status: keyRes.status(), text: await byKey.textContent("body") });

  // Delete, from the console (it asks first: accepted), then the row is gone.
  await page.goto(`${cfg.gateway}/account`);
  await submit(`${row} button[value=delete]`);
  await check("deleted", { row: await page.$(row) !== null, dialogs });
  out("done", { errors });
} catch (e) {
  out("failed", { error: String(e.stack || e) });
  process.exitCode = 1;
} finally {
  await browser.close();
  input.close(); // stdin no longer keeps the process up
}
