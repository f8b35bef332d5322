// Drives sluice's web dashboard in headless Chromium (playwright-core), for tests/dashboard.rs:
//   node dashboard.mjs URL TOKEN BACKEND SCREENSHOT
// Loads the page, gives it the admin token, waits for the charts to take several points under
// the load the test runs, drains BACKEND with the page's button, takes a screenshot, and prints
// what it saw as one JSON line, with the page's inline scripts (none: the CSP forbids them) and
// the CSP violations it caused.
import { chromium } from "playwright-core";

const [url, token, backend, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-dev-shm-usage"],
});
const out = { requests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  // Every request the page makes, to show that it fetches nothing from elsewhere.
  page.on("request", r => out.requests.push(r.url()));
  page.on("pageerror", e => { out.page_error = String(e); });
  // Every CSP violation from the very start of the page (an init script is not subject to the
  // CSP), where dashboard.js's own counter (window.__cspViolations) only starts once it runs.
  await page.addInitScript(() => {
    window.__cspReports = [];
    document.addEventListener("securitypolicyviolation", e => window.__cspReports.push(e.violatedDirective + " " + e.blockedURI));
  });
  await page.goto(url);
  out.title = await page.title();
  out.inline_scripts = await page.evaluate(() => [...document.scripts].filter(s => !s.src).length);
  // Without the token the API refuses, and the page says so.
  await page.waitForFunction(() => document.getElementById("message").textContent.includes("token"), null, { timeout: 20000 });
  out.without_token = await page.textContent("#message");
  await page.fill("#token", token);
  await page.click("#save-token");
  const row = `tr[data-backend="${backend}"]`;
  await page.waitForSelector(row, { timeout: 20000 });
  out.status = await page.textContent("#status");
  // Charts update: the QPS chart takes one point a second, and shows queries.
  await page.waitForFunction(() => Number(document.getElementById("qps-chart").dataset.points || 0) >= 4, null, { timeout: 30000 });
  out.qps_points = Number(await page.getAttribute("#qps-chart", "data-points"));
  await page.waitForFunction(() => Number(document.getElementById("qps").textContent) > 0, null, { timeout: 30000 });
  out.qps = Number(await page.textContent("#qps"));
  out.latency = await page.textContent("#latency");
  out.sessions_shown = await page.$$eval("#sessions tbody tr", rows => rows.length);
  // Drain from the page.
  await page.click(`${row} button.drain`);
  await page.waitForFunction(sel => document.querySelector(sel + " td.draining") !== null, row, { timeout: 20000 });
  out.after_drain = await page.textContent(`${row} td:nth-child(3)`);
  // After the drain, so that a blocked inline handler of the button would count too.
  out.csp_violations = await page.evaluate(() => window.__cspViolations || 0);
  out.csp_reports = await page.evaluate(() => window.__cspReports || []);
  await page.screenshot({ path: screenshot, fullPage: true });
} catch (e) {
  out.error = String(e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
