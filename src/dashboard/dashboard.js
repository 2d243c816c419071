// tollgate's admin dashboard: polls /dashboard.json and /bans and draws
// them. No framework, no build step; every value reaches the page as text,
// never HTML.
"use strict";

const POLL_MS = 2000;
const BANS_SHOWN = 50;
const COLORS = ["#1570ef", "#e04f16", "#079455", "#7a5af8", "#dd2590", "#ca8504", "#0e9384", "#475467"];
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// The token: from the fragment once (#token=..., never sent to a server),
// then from this tab's session storage.
function takeToken() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    sessionStorage.setItem("tollgate-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("tollgate-token");
}

function authHeaders() {
  const token = takeToken();
  return token ? { Authorization: "Bearer " + token } : {};
}

let timer = null;

async function poll() {
  const token = takeToken();
  const headers = authHeaders();
  let resp, bans;
  try {
    resp = await fetch("/dashboard.json", { headers, cache: "no-store" });
    bans = resp.ok ? await fetch("/bans?limit=" + BANS_SHOWN, { headers, cache: "no-store" }) : null;
  } catch (e) {
    setStatus("unreachable", false);
    return schedule();
  }
  if (resp.status === 401) {
    sessionStorage.removeItem("tollgate-token");
    setStatus(token ? "wrong token" : "token needed", false);
    $("main").hidden = true;
    $("login").hidden = false;
    $("token").focus();
    return; // resumes when the form is submitted
  }
  if (!resp.ok) {
    setStatus("HTTP " + resp.status, false);
    return schedule();
  }
  render(await resp.json(), bans && bans.ok ? await bans.json() : null);
  schedule();
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(poll, POLL_MS);
}

function setStatus(text, ok) {
  const s = $("status");
  s.textContent = text;
  s.className = "pill " + (ok ? "ok" : "bad");
}

function render(d, bans) {
  $("login").hidden = true;
  $("main").hidden = false;
  const down = d.upstreams.some((u) => u.servers.some((s) => s.state !== "up"));
  const flagged = d.certificates.filter((c) => c.attention);
  const nodeDown = (d.store.nodes || []).some((n) => !n.healthy);
  const crowdsecDown = d.crowdsec && !d.crowdsec.up;
  const trouble = !d.store.healthy ? "store failing" : nodeDown ? "store node down" : down ? "upstream down"
    : d.last_reload_error ? "reload rejected" : flagged.length ? "certificate needs attention"
    : crowdsecDown ? "crowdsec down (fail-open)" : null;
  setStatus(trouble || "serving", !trouble);
  $("version").textContent = d.version;
  $("uptime").textContent = duration(d.uptime_seconds);
  const store = $("store");
  const nodes = d.store.nodes || [];
  const nodesUp = nodes.filter((n) => n.healthy).length;
  const topology = nodes.length ? " · " + d.store.topology + " " + nodesUp + "/" + nodes.length + " nodes up" : "";
  store.textContent = d.store.backend + (d.store.healthy ? " · healthy" : " · failing") + topology;
  store.title = nodes.map((n) => n.role + " " + n.addr + (n.healthy ? " up" : " down")).join("\n");
  store.className = "value" + (d.store.healthy && nodesUp === nodes.length ? "" : " bad");
  const breaker = $("breaker");
  breaker.textContent = d.store.breaker || "none (" + d.store.backend + ")";
  breaker.className = "value" + (d.store.breaker === "open" ? " bad" : "");
  $("tracked").textContent = d.store.tracked_keys;
  $("banned").textContent = bans ? bans.total : "–";
  $("banned").className = "value" + (bans && bans.total > 0 ? " bad" : "");
  const reload = $("reload");
  reload.textContent = d.last_reload ? (d.last_reload.result === "ok" ? "applied " : "rejected ") + clock(d.last_reload.at) : "none yet";
  reload.className = "value" + (d.last_reload && d.last_reload.result !== "ok" ? " bad" : "");
  $("reload-error").hidden = !d.last_reload_error;
  $("reload-error-at").textContent = d.last_reload ? " at " + clock(d.last_reload.at) : "";
  $("reload-error-text").textContent = d.last_reload_error || "";
  reputation(d);
  chart(d);
  routes(d);
  upstreams(d);
  certificates(d);
  banList(bans);
  limited(d);
}

function chart(d) {
  const svg = $("chart");
  const W = 800, H = 240, left = 44, right = 8, top = 10, bottom = 22;
  svg.replaceChildren();
  const routes = d.routes;
  let max = 1;
  for (const r of routes) for (const v of r.requests_per_second.concat(r.rejections_per_second)) max = Math.max(max, v);
  max = niceCeil(max);
  const n = d.times.length;
  const span = Math.max(n - 1, 1);
  const x = (i) => left + (W - left - right) * (n <= 1 ? 1 : i / span);
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  for (const f of [0, 0.5, 1]) {
    el(svg, "line", { class: "grid", x1: left, x2: W - right, y1: y(max * f), y2: y(max * f) });
    el(svg, "text", { x: 4, y: y(max * f) + 4 }).textContent = fmt(max * f) + "/s";
  }
  if (n > 0) {
    const secs = Math.round((d.times[n - 1] - d.times[0]) / 1000);
    el(svg, "text", { x: left, y: H - 6 }).textContent = secs > 0 ? "−" + duration(secs) : "";
    el(svg, "text", { x: W - right - 24, y: H - 6 }).textContent = "now";
  }
  const legend = $("legend");
  legend.replaceChildren();
  routes.forEach((r, k) => {
    const color = COLORS[k % COLORS.length];
    for (const [series, cls] of [[r.requests_per_second, "requests"], [r.rejections_per_second, "rejections"]]) {
      const points = series.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      const line = el(svg, "polyline", { class: cls, points, stroke: color });
      line.dataset.route = r.name;
    }
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color;
    item.append(swatch, r.name + ": " + fmt(last(r.requests_per_second)) + " req/s, " + fmt(last(r.rejections_per_second)) + " rejected/s");
    legend.append(item);
  });
}

// Per route: latency percentiles since start, 5xx share over the chart's span.
function routes(d) {
  const body = $("routes").tBodies[0];
  body.replaceChildren();
  for (const r of d.routes) {
    const share = r.server_error_share;
    row(body, "route-health", [
      [r.name],
      [fmt(last(r.requests_per_second)), "num"],
      [fmt(last(r.rejections_per_second)), "num"],
      [fmt(last(r.challenges_per_second || [])), "num"],
      [siteAnswers(r.site_answers)],
      [share === null ? "–" : pct(share), "num" + (share > 0 ? " bad" : "")],
      [ms(r.p50_ms), "num"],
      [ms(r.p99_ms), "num"],
      [r.cache && r.cache.hit_ratio !== null ? pct(r.cache.hit_ratio) : "–", "num"],
      [r.cache ? String(r.cache.renders_saved) : "–", "num"],
    ]);
  }
}

// Answers the route's site rules made since start, e.g. "12 redirect · 3 denied".
function siteAnswers(counts) {
  const parts = Object.entries(counts || {}).filter(([, n]) => n > 0).map(([kind, n]) => n + " " + kind);
  return parts.length ? parts.join(" · ") : "–";
}

function upstreams(d) {
  const body = $("upstreams").tBodies[0];
  body.replaceChildren();
  for (const u of d.upstreams) {
    for (const s of u.servers) {
      const tr = row(body, "upstream-server", [
        [u.name],
        [s.url],
        [s.state, "state " + (s.state === "up" ? "ok" : "bad")],
        [s.in_flight, "num"],
        [s.fails, "num" + (s.fails > 0 ? " bad" : "")],
        [s.health_check || "off"],
        [u.queue.waiting + " / " + u.queue.size, "num"],
      ]);
      tr.dataset.state = s.state;
    }
  }
  $("upstreams").hidden = d.upstreams.length === 0;
  $("no-upstreams").hidden = d.upstreams.length > 0;
}

const ATTENTION = { renewal_failing: "renewal failing", expiring: "expires soon" };

function certificates(d) {
  const body = $("certificates").tBodies[0];
  body.replaceChildren();
  for (const c of d.certificates) {
    const tr = row(body, "certificate", [
      [c.domain],
      [c.not_after ? new Date(c.not_after).toLocaleString() : "none yet"],
      [c.days_left === null ? "–" : c.days_left, "num"],
      [c.attention ? ATTENTION[c.attention] : "ok", "state " + (c.attention ? "bad" : "ok")],
      [c.last_error || ""],
    ]);
    tr.dataset.attention = c.attention || "";
  }
  $("certificates-section").hidden = d.certificates.length === 0;
}

// Bans with a countdown; the lift button asks first, then sends DELETE /bans/{key}.
let banDeadlines = [];

function banList(bans) {
  const body = $("bans").tBodies[0];
  body.replaceChildren();
  banDeadlines = [];
  const list = bans ? bans.bans : [];
  for (const b of list) {
    const tr = row(body, "ban", [[b.key], [b.limiter], ["", "num left"], [clock(b.until)], [""]]);
    const left = tr.cells[2];
    banDeadlines.push([left, Date.now() + b.seconds_left * 1000]);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "lift";
    button.textContent = "Lift";
    button.addEventListener("click", () => lift(b.key));
    tr.cells[4].append(button);
  }
  tick();
  $("bans").hidden = list.length === 0;
  $("none-banned").hidden = list.length > 0;
  $("none-banned").textContent = bans ? "Nobody is banned." : "Bans could not be read.";
  $("bans-more").hidden = !bans || bans.total <= list.length;
  $("bans-more").textContent = bans ? "Showing " + list.length + " of " + bans.total + " (GET /bans pages through all)." : "";
}

function tick() {
  for (const [cell, deadline] of banDeadlines) {
    cell.textContent = duration(Math.max(0, Math.ceil((deadline - Date.now()) / 1000)));
  }
}

async function lift(key) {
  if (!confirm("Lift the ban on " + key + "? Its requests are admitted again (its limiter still counts them).")) return;
  try {
    const r = await fetch("/bans/" + encodeURIComponent(key), { method: "DELETE", headers: authHeaders() });
    if (!r.ok && r.status !== 404) alert("Lifting failed: HTTP " + r.status);
  } catch (e) {
    alert("Lifting failed: the admin listener is unreachable.");
  }
  poll();
}

// CrowdSec's health and decisions, PROXY-protocol refusals, the busiest networks.
function reputation(d) {
  const cs = $("crowdsec");
  $("crowdsec-fact").hidden = !d.crowdsec;
  if (d.crowdsec) {
    cs.textContent = (d.crowdsec.up ? "up" : "down · fail-open") + " · " + d.crowdsec.held + " decisions"
      + (d.crowdsec.waiting ? " · " + d.crowdsec.waiting + " bans to push" : "");
    cs.title = d.crowdsec.last_pull ? "last pull " + d.crowdsec.last_pull : "no pull yet";
    cs.className = "value" + (d.crowdsec.up ? "" : " bad");
  }
  $("proxy-refused").textContent = d.proxy_protocol_refused;
  const body = $("networks").tBodies[0];
  body.replaceChildren();
  for (const n of d.networks || []) {
    row(body, "network", [[n.asn === null ? "no entry" : "AS" + n.asn], [n.requests, "num"]]);
  }
  $("networks-section").hidden = !d.networks;
}

function limited(d) {
  const body = $("limited").tBodies[0];
  body.replaceChildren();
  for (const k of d.limited) {
    row(body, "limited-key", [[k.key], [k.limiter], [k.route], [k.rejections, "num"], [clock(k.since)], [clock(k.last)]]);
  }
  $("limited").hidden = d.limited.length === 0;
  $("none-limited").hidden = d.limited.length > 0;
}

// One table row of [text, class] cells.
function row(body, cls, cells) {
  const tr = body.insertRow();
  tr.className = cls;
  for (const [text, tdClass] of cells) {
    const td = tr.insertCell();
    td.textContent = text;
    if (tdClass) td.className = tdClass;
  }
  return tr;
}

function el(parent, name, attrs) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  parent.append(e);
  return e;
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function last(a) {
  return a.length ? a[a.length - 1] : 0;
}

function fmt(v) {
  return v >= 10 ? Math.round(v).toString() : (Math.round(v * 10) / 10).toString();
}

function pct(share) {
  return (Math.round(share * 1000) / 10).toString() + "%";
}

function ms(v) {
  return v === null ? "–" : v >= 10 ? Math.round(v) + " ms" : (Math.round(v * 10) / 10) + " ms";
}

function duration(s) {
  if (s < 120) return s + "s";
  if (s < 7200) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

function clock(unix) {
  return new Date(unix * 1000).toLocaleTimeString();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("tollgate-token", $("token").value);
    $("token").value = "";
    poll();
  });
  setInterval(tick, 1000);
  poll();
});
