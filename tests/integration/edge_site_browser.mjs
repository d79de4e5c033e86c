// A real browser for tests/integration/test_edge_site.py: Debian's chromium, headless,
// driven by playwright-core. Every name resolves to 127.0.0.1 (--host-resolver-rules),
// so the gateway's names and the sandboxes' names reach the test's own gateway only.
//
//   node edge_site_browser.mjs '<json: gateway, email, password, legit, box, gatewayHost>'
//
// Prints one JSON line per step: signed in at /account, a legitimate consent (Allow on
// the gateway's own page), then the visit to the sandbox's public port whose page
// mounts the attack; the test judges what happened.
import { launch } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const out = (step, data) => console.log(JSON.stringify({ step, ...data }));

const browser = await launch();
try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  page.setDefaultTimeout(60000);

  // The victim signs in on the gateway's own page, as a person would.
  await page.goto(`${cfg.gateway}/account`);
  await page.fill("#email", cfg.email);
  await page.fill("#password", cfg.password);
  await Promise.all([page.waitForNavigation(), page.click("button[value=signin]")]);
  const account = await page.content();
  out("signed_in", { url: page.url(), signedIn: account.includes('value="signout"') });

  // A legitimate consent: our own forms still work in a real browser (their Origin).
  await page.goto(`${cfg.gateway}${cfg.legit}`);
  await Promise.all([page.waitForURL(/\/legit\?/), page.click("button[value=allow]")]);
  out("legit", { url: page.url() });

  // The attack: the sandbox's public page plants its cookies and auto-submits Allow.
  const posts = [];
  page.on("response", async (res) => {
    const req = res.request();
    if (req.method() === "POST" && new URL(req.url()).pathname === "/oauth/authorize") {
      const headers = await req.allHeaders();
      posts.push({ status: res.status(), location: res.headers()["location"] || null,
                   origin: headers["origin"] || null, cookie: headers["cookie"] || null });
    }
  });
  await page.goto(cfg.box);
  // The page submits itself: wait for the answer to that POST (or give up after 30 s).
  const deadline = Date.now() + 30000;
  while (posts.length === 0 && Date.now() < deadline)
    await page.waitForTimeout(200);
  await page.waitForLoadState("load").catch(() => {});
  const text = (await page.textContent("body").catch(() => "")) || "";
  const cookies = (await context.cookies(cfg.gateway)).map(
    (c) => ({ name: c.name, value: c.value, domain: c.domain, path: c.path }));
  out("attack", { url: page.url(), posts, text: text.slice(0, 600), cookies });
  out("done", {});
} finally {
  await browser.close();
}
