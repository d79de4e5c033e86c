// Debian's chromium, headless, for the browser tests (driven by playwright-core). Every
// name resolves to 127.0.0.1 (--host-resolver-rules), so the gateway's and the
// sandboxes' names reach the test's own gateway only, and nothing else is ever reached.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           "--host-resolver-rules=MAP * 127.0.0.1"],
  });
}
