"use strict";
// Counts the Content-Security-Policy violations of the page (the browser test reads the count).
document.addEventListener("securitypolicyviolation", () => { window.__cspViolations = (window.__cspViolations || 0) + 1; });

// sluice's web dashboard (served with dashboard.html and dashboard.css, under a CSP that allows
// no inline script or style). Everything comes from this sluice's admin API: nothing is fetched
// from anywhere else. Data only ever reaches the page as text nodes and attribute values, never
// as HTML.
const POINTS = 120;
const DASH = "\u2013";
const state = { qps: [], avg: [], p99: [], last: null, token: sessionStorage.getItem("sluice-token") || "" };
const $ = id => document.getElementById(id);

$("token").value = state.token;
$("save-token").addEventListener("click", () => {
  state.token = $("token").value;
  sessionStorage.setItem("sluice-token", state.token);
  refresh();
});

async function api(path, method = "GET") {
  const init = { method, headers: {} };
  if (state.token) init.headers.Authorization = "Bearer " + state.token;
  // The API takes mutations only as JSON.
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = "{}";
  }
  const r = await fetch(path, init);
  if (r.status === 401) throw new Error("the admin API needs its token");
  const text = await r.text();
  if (!r.ok && r.status !== 503) throw new Error(path + ": " + r.status + " " + text);
  return path === "/metrics" ? text : JSON.parse(text);
}

// The sums of the series of the Prometheus text, by name; histogram buckets by bound.
function parseMetrics(text) {
  const sums = {}, buckets = {};
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const v = Number(m[3]);
    sums[m[1]] = (sums[m[1]] || 0) + v;
    if (m[1] === "sluice_backend_query_duration_seconds_bucket") {
      const le = (m[2].match(/le="([^"]+)"/) || [])[1];
      buckets[le] = (buckets[le] || 0) + v;
    }
  }
  return { sums, buckets, at: performance.now() };
}

// The bucket bound under which a share q of the queries since `before` fell (cumulative buckets).
function quantile(q, now, before) {
  const keys = Object.keys(now.buckets).sort((a, b) => Number(a) - Number(b));
  if (!keys.length) return null;
  const delta = k => now.buckets[k] - (before.buckets[k] || 0);
  const total = delta(keys[keys.length - 1]);
  if (!(total > 0)) return null;
  for (const k of keys) if (delta(k) >= q * total) return Math.min(Number(k), 10);
  return null;
}

function push(series, v) { series.push(v); if (series.length > POINTS) series.shift(); }

function draw(id, lines) {
  const c = $(id), g = c.getContext("2d");
  const w = c.width, h = c.height;
  g.clearRect(0, 0, w, h);
  const all = lines.flatMap(l => l.data.filter(v => v !== null));
  const max = Math.max(1e-9, ...all) * 1.15;
  g.strokeStyle = "#dde2e7"; g.fillStyle = "#66707a"; g.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = h - 14 - (h - 24) * i / 4;
    g.beginPath(); g.moveTo(36, y); g.lineTo(w, y); g.stroke();
    g.fillText(fmt(max * i / 4), 0, y + 4);
  }
  for (const l of lines) {
    g.strokeStyle = l.color; g.lineWidth = 2; g.beginPath();
    let started = false;
    l.data.forEach((v, i) => {
      if (v === null) return;
      const x = 36 + (w - 40) * i / (POINTS - 1), y = h - 14 - (h - 24) * v / max;
      if (started) g.lineTo(x, y); else { g.moveTo(x, y); started = true; }
    });
    g.stroke();
  }
  c.dataset.points = String(lines[0].data.length);
}
function fmt(v) { return v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(2); }

// A value as shown: a dash when missing.
function show(v) { return String(v ?? DASH); }

// A table cell holding `content` (a node, or text), with an optional class.
function cell(content, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (content instanceof Node) td.appendChild(content); else td.textContent = String(content);
  return td;
}

// A table row of cells.
function tr(cells) {
  const row = document.createElement("tr");
  row.append(...cells);
  return row;
}

// Replaces the rows of the table `id` with one row per item.
function rows(id, items, row) {
  document.querySelector("#" + id + " tbody").replaceChildren(...items.map(row));
}

async function drain(name, undo) {
  try {
    await api("/backends/" + encodeURIComponent(name) + (undo ? "/undrain" : "/drain"), "POST");
    refresh();
  } catch (e) { $("message").textContent = e.message; }
}

function backendRow(b) {
  const health = b.fenced ? "fenced" : b.draining ? "draining" : b.up ? "up" : "down";
  const button = document.createElement("button");
  button.className = "drain";
  button.textContent = b.draining ? "undrain" : "drain";
  const name = b.name, undo = !!b.draining;
  button.addEventListener("click", () => drain(name, undo));
  const row = tr([
    cell(show(b.name)),
    cell(show(b.address)),
    cell(health === "down" ? "down: " + show(b.reason) : health === "fenced" ? b.fenced.kind + ": " + show(b.fenced.reason) : health, health),
    cell(show(b.serves_as)),
    cell(String(b.sessions), "sessions"),
    cell(String(b.weight)),
    cell(String(b.pooled)),
    cell(button),
  ]);
  row.dataset.backend = show(b.name);
  return row;
}

function sessionRow(x) {
  return tr([
    cell(String(x.id)),
    cell(show(x.state.user)),
    cell(show(x.client)),
    cell(show(x.backend)),
    cell(show(x.state.schema)),
    cell(String(x.queries)),
    cell((x.pins || []).join(", ") || DASH),
    cell(show(x.move_asked)),
  ]);
}

function digestRow(d) {
  return tr([
    cell(show(d.digest)),
    cell(String(d.count)),
    cell(String(d.errors)),
    cell(fmt(d.avg_us)),
    cell(fmt(d.p99_us)),
    cell(show(d.text), "text"),
  ]);
}

async function refresh() {
  try {
    const [health, backends, sessions, metrics, digests] = await Promise.all([
      api("/health"), api("/backends"), api("/sessions"), api("/metrics"), api("/digests?top=10").catch(() => null)]);
    $("message").textContent = "";
    const st = $("status");
    st.textContent = health.status + (health.reason ? ": " + health.reason : "");
    st.className = health.status === "ready" ? "ready" : "bad";
    $("pid").textContent = "pid " + health.pid;
    const now = parseMetrics(metrics);
    if (state.last) {
      const secs = (now.at - state.last.at) / 1000;
      const d = k => (now.sums[k] || 0) - (state.last.sums[k] || 0);
      const qps = Math.max(0, d("sluice_commands_total") / secs);
      const n = d("sluice_backend_query_duration_seconds_count");
      const avg = n > 0 ? 1000 * d("sluice_backend_query_duration_seconds_sum") / n : null;
      const p99 = quantile(0.99, now, state.last);
      push(state.qps, qps); push(state.avg, avg); push(state.p99, p99 === null ? null : 1000 * p99);
      $("qps").textContent = fmt(qps);
      $("latency").textContent = avg === null ? DASH : fmt(avg) + " / " + fmt(1000 * p99);
      draw("qps-chart", [{ data: state.qps, color: "#2466b3" }]);
      draw("latency-chart", [{ data: state.avg, color: "#1f8a4c" }, { data: state.p99, color: "#c0392b" }]);
    }
    state.last = now;
    rows("backends", backends, backendRow);
    $("session-count").textContent = "(" + sessions.length + ")";
    rows("sessions", sessions.slice(0, 200), sessionRow);
    const list = digests && digests.enabled ? digests.digests : [];
    $("digests-section").hidden = !list.length;
    rows("digests", list, digestRow);
  } catch (e) {
    $("message").textContent = e.message;
  }
}
refresh();
setInterval(refresh, 1000);
