// tollgate's admin dashboard: polls /dashboard.json and draws it. No
// framework, no build step; every value reaches the page as text, never HTML.
"use strict";

const POLL_MS = 2000;
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

let timer = null;

async function poll() {
  const token = takeToken();
  const headers = token ? { Authorization: "Bearer " + token } : {};
  let resp;
  try {
    resp = await fetch("/dashboard.json", { headers, cache: "no-store" });
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
  render(await resp.json());
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

function render(d) {
  $("login").hidden = true;
  $("main").hidden = false;
  setStatus(d.store.healthy ? "serving" : "store failing", d.store.healthy);
  $("version").textContent = d.version;
  $("uptime").textContent = duration(d.uptime_seconds);
  const store = $("store");
  store.textContent = d.store.backend + (d.store.healthy ? " · healthy" : " · failing");
  store.className = "value" + (d.store.healthy ? "" : " bad");
  const breaker = $("breaker");
  breaker.textContent = d.store.breaker || "none (" + d.store.backend + ")";
  breaker.className = "value" + (d.store.breaker === "open" ? " bad" : "");
  $("tracked").textContent = d.store.tracked_keys;
  $("reload-error").hidden = !d.last_reload_error;
  $("reload-error-text").textContent = d.last_reload_error || "";
  chart(d);
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
    const last = (a) => (a.length ? a[a.length - 1] : 0);
    item.append(swatch, r.name + ": " + fmt(last(r.requests_per_second)) + " req/s, " + fmt(last(r.rejections_per_second)) + " rejected/s");
    legend.append(item);
  });
}

function limited(d) {
  const body = $("limited").tBodies[0];
  body.replaceChildren();
  for (const k of d.limited) {
    const tr = body.insertRow();
    tr.className = "limited-key";
    const cells = [k.key, k.limiter, k.route, k.rejections, clock(k.since), clock(k.last)];
    cells.forEach((v, i) => {
      const td = tr.insertCell();
      td.textContent = v;
      if (i === 3) td.className = "num";
    });
  }
  $("limited").hidden = d.limited.length === 0;
  $("none-limited").hidden = d.limited.length > 0;
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

function fmt(v) {
  return v >= 10 ? Math.round(v).toString() : (Math.round(v * 10) / 10).toString();
}

function duration(s) {
  if (s < 120) return s + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return Math.round(s / 3600) + "h";
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
  poll();
});
