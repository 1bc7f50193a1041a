// Headless Debian Chromium driven by playwright-core, one JSON command per line
// on stdin, one JSON answer per line on stdout (see harness/browser.py).
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const require = createRequire(process.env.PLAYWRIGHT_FROM); // a package.json beside node_modules/playwright-core
const { chromium } = require("playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // As root on a closed network: no sandbox, and no background connections
  // (without these Chromium's own traffic to the outside is refused and stalls it).
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
context.setDefaultTimeout(Number(process.env.BROWSER_TIMEOUT_MS || 10000));
const page = await context.newPage();
const log = [], requests = [];
page.on("console", (m) => log.push(`${m.type()}: ${m.text()}`));
page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`));
page.on("requestfailed", (r) => requests.push({ method: r.method(), url: r.url(), failed: r.failure()?.errorText }));
page.on("response", (r) => requests.push({ method: r.request().method(), url: r.url(), status: r.status(),
  headers: r.headers() }));

const ops = {
  goto: ({ url }) => page.goto(url).then((r) => r && r.status()),
  fill: ({ selector, value }) => page.fill(selector, value),
  select: ({ selector, value }) => page.selectOption(selector, value).then(() => null),
  click: ({ selector }) => page.click(selector),
  text: ({ selector }) => page.textContent(selector),
  attr: ({ selector, name }) => page.getAttribute(selector, name),
  // Until the element's text contains `text` (or is non-empty when no text is given).
  wait_text: ({ selector, text, timeout }) => page.waitForFunction(([s, t]) => {
    const e = document.querySelector(s);
    return e && (t ? e.textContent.includes(t) : e.textContent.trim().length > 0);
  }, [selector, text || ""], { timeout }).then(() => page.textContent(selector)),
  wait_attr: ({ selector, name, value, timeout }) => page.waitForFunction(([s, n, v]) => {
    const e = document.querySelector(s);
    return e && e.hasAttribute(n) && (!v || e.getAttribute(n) === v);
  }, [selector, name, value || ""], { timeout }).then(() => page.getAttribute(selector, name)),
  eval: ({ expression }) => page.evaluate(expression),
  screenshot: ({ path, fullPage }) => page.screenshot({ path, fullPage: fullPage ?? true }).then(() => path),
  log: () => log.slice(),
  requests: () => requests.slice(),
};

const out = (msg) => process.stdout.write(JSON.stringify(msg) + "\n");
out({ ready: true, version: browser.version() });
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const { id, op, ...args } = JSON.parse(line);
  if (op === "close") break;
  try {
    if (!ops[op]) throw new Error(`unknown op ${op}`);
    out({ id, ok: true, value: (await ops[op](args)) ?? null });
  } catch (e) {
    out({ id, ok: false, error: String(e && e.message || e) });
  }
}
await browser.close();
out({ closed: true });
process.exit(0);
