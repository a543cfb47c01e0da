// The nodepool dashboard: the records of the buckets and the process's
// overview (capacity, quota, the last hour), grouped for an operator. It
// starts from a snapshot loaded as a script (snapshot.js), so that the
// page's load event comes once the first data is shown, then follows the
// status port's event stream (/dashboard/events), opened after the load.
"use strict";

const kinds = ["nodes", "requests", "components", "images", "builds", "uploads", "providers"];
const state = Object.fromEntries(kinds.map((k) => [k, new Map()]));
let overview = null;
let skew = 0; // server clock minus ours, in ms
let loaded = false;
let pending = false; // a render is scheduled

// What is drawn at most: a fleet of any size stays a page of bounded size.
const nodesPerPage = 100;
const requestsPerPage = 50;
const attentionPerKind = 20;

const nodeStates = ["init", "building", "ready", "in-use", "used", "hold", "deleting", "failed", "aborted"];
const requestStates = ["requested", "pending", "fulfilled", "failed"];

// The page's own figures, for tests and the curious: how long the first
// render took after the navigation began, and the renders since.
window.nodepoolStats = { firstRender: null, renders: 0, lastRenderMs: 0, maxRenderMs: 0 };

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function fmt(n) {
  return Number(n).toLocaleString("en");
}

function plural(n, one, many) {
  return `${fmt(n)} ${n === 1 ? one : many || one + "s"}`;
}

// ---- Times, in words ----

function serverNow() {
  return Date.now() + skew;
}

// span says a duration in words: 45s, 3m 12s, 1h 58m, 2d 3h.
function span(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m}m ${s % 60}s` : `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return m % 60 ? `${h}h ${m % 60}m` : `${h}h`;
  const d = Math.floor(h / 24);
  return h % 24 ? `${d}d ${h % 24}h` : `${d}d`;
}

// exact is a time as its tooltip says it: to the second, in UTC.
function exact(t) {
  const d = new Date(t);
  return isNaN(d) ? "" : d.toISOString().replace(/\.\d+Z$/, "Z").replace("T", " ");
}

// ago says how long ago a time was: "just now", "3m ago".
function ago(t) {
  if (!t) return "";
  const ms = serverNow() - Date.parse(t);
  if (ms < 5000) return `<time datetime="${esc(t)}" title="${esc(exact(t))}">just now</time>`;
  return `<time datetime="${esc(t)}" title="${esc(exact(t))}">${span(ms)} ago</time>`;
}

// since says how long something has lasted: "3m 12s".
function since(t) {
  if (!t) return "";
  return `<time datetime="${esc(t)}" title="since ${esc(exact(t))}">${span(serverNow() - Date.parse(t))}</time>`;
}

// expiry says when a time comes: "expires in 1h 58m", "expired 3m ago".
function expiry(t) {
  if (!t) return "no expiry";
  const ms = Date.parse(t) - serverNow();
  const text = ms >= 0 ? `expires in ${span(ms)}` : `expired ${span(-ms)} ago`;
  return `<time datetime="${esc(t)}" title="${esc(exact(t))}">${text}</time>`;
}

// seconds says a latency: 850ms, 12.5s, 3m 4s.
function seconds(s) {
  if (!s) return "–";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
  return span(s * 1000);
}

// ---- Small pieces ----

function badge(st, text) {
  return `<span class="badge state-${esc(st)}">${esc(text ?? st)}</span>`;
}

function counts(items, key) {
  const out = new Map();
  for (const x of items) out.set(x[key], (out.get(x[key]) || 0) + 1);
  return out;
}

function stateOrder(list) {
  return (a, b) => {
    const i = list.indexOf(a), j = list.indexOf(b);
    return (i < 0 ? 99 : i) - (j < 0 ? 99 : j) || String(a).localeCompare(String(b));
  };
}

// countBadges shows counts by state, in the states' order; each is a link
// that filters by that state (and by what scope names: a provider, a
// label).
function countBadges(m, order = nodeStates, scope = {}) {
  return [...m.entries()].filter(([, n]) => n > 0).sort(([a], [b]) => stateOrder(order)(a, b))
    .map(([st, n]) => `<a href="${link({ ...scope, state: st })}" class="badge state-${esc(st)}" data-count-state="${esc(st)}">${fmt(n)} ${esc(st)}</a>`).join(" ");
}

function byCreated(a, b) {
  return (a.created || "").localeCompare(b.created || "") || String(a.id).localeCompare(String(b.id));
}

function alive(id) {
  return state.components.has(id);
}

// id shows an id on one line; one too long for its column ends in an
// ellipsis, whole in its tooltip and when copied.
function id(s, cls = "") {
  return `<span class="id${cls ? " " + cls : ""}" title="${esc(s)}">${esc(s)}</span>`;
}

function labelsOf(x) {
  return (x.labels || []).join(", ");
}

// ---- Filters (kept in the address's fragment) ----

const filters = { provider: "", label: "", state: "", q: "" };
const pages = { nodes: 0, requests: 0 };

function readFilters() {
  const p = new URLSearchParams(location.hash.slice(1));
  for (const k of Object.keys(filters)) filters[k] = p.get(k) || "";
  pages.nodes = Math.max(0, (parseInt(p.get("page"), 10) || 1) - 1);
  pages.requests = Math.max(0, (parseInt(p.get("rpage"), 10) || 1) - 1);
  const form = document.getElementById("filters");
  for (const k of Object.keys(filters)) if (form.elements[k] && form.elements[k].value !== filters[k]) ensureOption(form.elements[k], filters[k]);
}

function ensureOption(el, value) {
  if (el.tagName === "SELECT" && value && ![...el.options].some((o) => o.value === value)) {
    el.add(new Option(value, value));
  }
  el.value = value;
}

function writeFilters(extra = {}) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v) p.set(k, v);
  for (const [k, v] of Object.entries(extra)) if (v) p.set(k, v);
  const hash = p.toString();
  history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
}

// link is the address of the page with the filters changed.
function link(changes) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries({ ...filters, ...changes })) if (v) p.set(k, v);
  return esc("#" + p.toString());
}

function filtering() {
  return Object.values(filters).some((v) => v);
}

function nodeMatches(n) {
  return (!filters.provider || n.provider === filters.provider) &&
    (!filters.label || (n.labels || []).includes(filters.label)) &&
    (!filters.state || n.state === filters.state) &&
    (!filters.q || [n.id, n.external_id, n.allocated_to, n.interface_ip].some((s) => s && String(s).includes(filters.q)));
}

function requestMatches(r) {
  return (!filters.provider || r.provider === filters.provider) &&
    (!filters.label || (r.labels || []).includes(filters.label)) &&
    (!filters.state || r.state === filters.state) &&
    (!filters.q || [r.id, ...(r.nodes || [])].some((s) => s && String(s).includes(filters.q)));
}

// fillSelect keeps a select's options the given values (plus the one
// chosen), touching it only when they change.
function fillSelect(name, values) {
  const el = document.getElementById("filters").elements[name];
  const want = [...new Set([...values, filters[name]].filter(Boolean))];
  const key = want.join("\n");
  if (el.dataset.options === key) return;
  el.dataset.options = key;
  el.replaceChildren(new Option("all", ""), ...want.map((v) => new Option(v, v)));
  el.value = filters[name];
}

// ---- Sections ----

function renderSummary(nodes, reqs) {
  document.getElementById("summary").innerHTML =
    `${plural(nodes.length, "node")} ${countBadges(counts(nodes, "state"))} · ${plural(reqs.length, "request")} ${countBadges(counts(reqs, "state"), requestStates)}`;
}

function poolsWaitingForQuota() {
  return (overview?.pools || []).filter((p) => p.waiting_for_quota);
}

function failingProviders() {
  return (overview?.providers || []).filter((p) => p.failing);
}

function attentionRow(attrs, what, st, where, when, why, cls = "") {
  return `<tr class="attention ${cls}" ${attrs}><td class="id">${what}</td><td>${st}</td><td>${where}</td><td>${when}</td><td class="reason">${why}</td></tr>`;
}

function moreRow(n, what, st) {
  return `<tr class="more"><td colspan="5">and ${plural(n, "more " + what, "more " + what + "s")} — <a href="${link({ state: st, provider: "", label: "", q: "" })}">show them all below</a></td></tr>`;
}

// served says what the live launchers' configurations hold: the
// providers they name, the pools they announce and each pool's labels.
// A node of anything else belongs to something removed: it is drained.
function served() {
  const providers = new Set(), pools = new Map();
  for (const c of state.components.values()) {
    const roles = c.roles || [];
    if (roles.length && !roles.includes("launcher")) continue; // a builder
    for (const p of c.providers || []) providers.add(p);
    for (const p of c.pools || []) {
      providers.add(p.provider);
      pools.set(p.provider + "/" + p.pool, new Set(p.labels || []));
    }
  }
  return { providers, pools };
}

// removal says what of a node's configuration is gone ("" if nothing).
function removal(n, sv) {
  if (!sv.providers.has(n.provider)) return "provider";
  const labels = sv.pools.get(n.provider + "/" + n.pool);
  if (!labels) return "pool";
  if ((n.labels || []).length && !(n.labels || []).some((l) => labels.has(l))) return "label";
  return "";
}

// drainingProviders lists the removed providers being drained, with what
// is left of them, and why a drain cannot go on.
function drainingProviders(rows) {
  const sv = served();
  for (const p of [...state.providers.values()].sort((a, b) => a.name.localeCompare(b.name))) {
    if (!p.draining_since || sv.providers.has(p.name)) continue;
    const left = [...state.nodes.values()].filter((n) => n.provider === p.name);
    const uploads = [...state.uploads.values()].filter((u) => u.provider === p.name).length;
    const what = `${plural(left.length, "node")} ${countBadges(counts(left, "state"))}, ${plural(uploads, "upload")} left`;
    const why = p.problem
      ? `its drain cannot go on: ${esc(p.problem)} (for ${since(p.problem_since)}; <code>nodepool erase ${esc(p.name)}</code> gives it up)`
      : "removed from the configuration: its nodes, instances and uploads are being deleted";
    rows.push(`<tr class="attention${p.problem ? "" : " hold"}" data-draining-provider="${esc(p.name)}" data-stuck="${p.problem ? "true" : "false"}">` +
      `<td class="id">provider ${esc(p.name)}</td><td>${badge(p.problem ? "stuck" : "draining")}</td>` +
      `<td>${what}</td><td>${since(p.draining_since)}</td><td class="reason">${why}</td></tr>`);
  }
  // Nodes of removed providers that no remembered section covers.
  const remembered = new Set([...state.providers.values()].map((p) => p.name));
  const orphans = new Map();
  for (const n of state.nodes.values()) {
    if (removal(n, sv) !== "provider" || remembered.has(n.provider)) continue;
    if (!orphans.has(n.provider)) orphans.set(n.provider, []);
    orphans.get(n.provider).push(n);
  }
  for (const [provider, nodes] of [...orphans.entries()].sort(([a], [b]) => a.localeCompare(b))) {
    rows.push(`<tr class="attention" data-draining-provider="${esc(provider)}" data-stuck="true"><td class="id">provider ${esc(provider)}</td>` +
      `<td>${badge("stuck")}</td><td>${plural(nodes.length, "node")} ${countBadges(counts(nodes, "state"))}</td><td></td>` +
      `<td class="reason">no live process has it in its configuration, and none remembers it</td></tr>`);
  }
}

function renderAttention(nodes, reqs) {
  const rows = [];
  // Providers that keep failing, first.
  for (const p of failingProviders()) {
    rows.push(attentionRow(`data-failing-provider="${esc(p.name)}"`, `provider ${esc(p.name)}`, badge("failing"),
      `${plural(p.hour.launches, "launch", "launches")} ok, ${plural(p.hour.attempts_failed, "attempt")} failed`,
      p.last_failure_time ? ago(p.last_failure_time) : "",
      `${esc(p.failing)}; the last: ${esc(p.last_failure || "no reason given")}`));
  }
  drainingProviders(rows);
  for (const p of poolsWaitingForQuota()) {
    const waiting = p.waiting ? `${plural(p.waiting, "request")} waiting` : "";
    rows.push(attentionRow(`data-quota-pool="${esc(p.provider + "/" + p.pool)}"`, `pool ${esc(p.provider)}/${esc(p.pool)}`,
      badge("quota", "waiting for quota"), `${capacityText(p)}${waiting ? "; " + waiting : ""}`, "",
      p.wait_reason ? `waits ${esc(p.wait_reason)}` : "waits for nodes to be deleted before it launches more", "hold"));
  }
  const held = [], failed = [], orphaned = [];
  for (const n of nodes) {
    if (n.state === "hold") held.push(n);
    else if (n.state === "failed" || n.state === "aborted") failed.push(n);
    else if ((n.state === "building" || n.state === "deleting") && n.launcher && !alive(n.launcher)) orphaned.push(n);
  }
  const where = (n) => `${esc(n.provider)}/${esc(n.pool)} ${esc(labelsOf(n))}`;
  for (const n of held.slice(0, attentionPerKind)) {
    rows.push(attentionRow(`data-node-id="${esc(n.id)}"`, `node ${esc(n.id)}`, badge(n.state), where(n), since(n.state_time),
      `held${n.hold_job ? " for " + esc(n.hold_job) : ""}: ${esc(n.comment || "no reason given")}, ${expiry(n.hold_expiration)}`, "hold"));
  }
  if (held.length > attentionPerKind) rows.push(moreRow(held.length - attentionPerKind, "held node", "hold"));
  for (const n of failed.slice(0, attentionPerKind)) {
    rows.push(attentionRow(`data-node-id="${esc(n.id)}"`, `node ${esc(n.id)}`, badge(n.state), where(n), ago(n.state_time), esc(n.reason || n.comment)));
  }
  if (failed.length > attentionPerKind) rows.push(moreRow(failed.length - attentionPerKind, "failed node", "failed"));
  for (const n of orphaned.slice(0, attentionPerKind)) {
    rows.push(attentionRow(`data-node-id="${esc(n.id)}"`, `node ${esc(n.id)}`, badge(n.state), where(n), since(n.state_time),
      `its launcher <span class="gone">${esc(n.launcher)}</span> is gone; cleanup hands it to another`));
  }
  if (orphaned.length > attentionPerKind) rows.push(moreRow(orphaned.length - attentionPerKind, "node of a gone launcher", "building"));
  const failedReqs = reqs.filter((r) => r.state === "failed");
  for (const r of failedReqs.slice(0, attentionPerKind)) {
    rows.push(attentionRow(`data-request-id="${esc(r.id)}"`, `request ${esc(r.id)}`, badge(r.state), esc(labelsOf(r)), ago(r.state_time), esc(r.reason)));
  }
  if (failedReqs.length > attentionPerKind) rows.push(moreRow(failedReqs.length - attentionPerKind, "failed request", "failed"));
  for (const b of state.builds.values()) {
    if (b.state === "failed") {
      rows.push(attentionRow("", `build ${esc(b.image)}-${esc(b.id)}`, badge(b.state), esc(b.builder), ago(b.state_time), esc(b.reason)));
    }
  }
  for (const u of state.uploads.values()) {
    if (u.state === "failed") {
      rows.push(attentionRow("", `upload ${esc(u.image)}-${esc(u.build_id)} to ${esc(u.provider)}`, badge(u.state),
        `attempt ${esc(u.attempt)}`, ago(u.state_time), esc(u.reason)));
    }
  }
  document.getElementById("attention").innerHTML = rows.length
    ? `<div class="scroll"><table><tbody>${rows.join("")}</tbody></table></div>`
    : `<p class="empty">Nothing failing, held or waiting for quota.</p>`;
}

// chart draws per-minute bars as inline SVG: series are stacked, each
// {key, cls, name}; value(m, key) reads a minute's value.
function chart(id, title, minutes, series, summary, opts = {}) {
  const w = 360, h = 64, n = minutes.length, bw = w / Math.max(n, 1);
  const value = opts.value || ((m, k) => m[k] || 0);
  const stacked = opts.overlay ? minutes.map((m) => Math.max(...series.map((s) => value(m, s.key)))) :
    minutes.map((m) => series.reduce((a, s) => a + value(m, s.key), 0));
  const top = Math.max(...stacked, opts.min || 1);
  const parts = [];
  minutes.forEach((m, i) => {
    const x = (i * bw).toFixed(1);
    let y = h;
    const tip = [`${exact(m.start).slice(11, 16)} UTC`];
    for (const s of series) {
      const v = value(m, s.key);
      tip.push(`${opts.format ? opts.format(v) : fmt(v)} ${s.name}`);
      if (!v) continue;
      const bh = Math.max(1, (v / top) * (h - 2));
      const by = opts.overlay ? h - bh : y - bh;
      parts.push(`<rect class="${s.cls}" x="${x}" y="${by.toFixed(1)}" width="${Math.max(bw - 1, 1).toFixed(1)}" height="${bh.toFixed(1)}"><title>${esc(tip.join(", "))}</title></rect>`);
      if (!opts.overlay) y -= bh;
    }
  });
  const legend = series.map((s) => `<span class="key ${s.cls}"></span>${esc(s.name)}`).join(" ");
  return `<figure class="chart" id="${id}"><figcaption><b>${esc(title)}</b> <span class="muted">${summary}</span></figcaption>` +
    `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(title)}">` +
    `<line class="axis" x1="0" y1="${h - 0.5}" x2="${w}" y2="${h - 0.5}"/>${parts.join("")}</svg>` +
    `<div class="scale"><span>60m ago</span><span>${Math.max(...stacked) > 0 ? `top: ${opts.format ? opts.format(top) : fmt(top)}${opts.unit || ""}` : "none"}</span><span>now</span></div>` +
    `<div class="legend">${legend}</div></figure>`;
}

function renderActivity() {
  const hist = overview?.history;
  if (!hist) return;
  const m = hist.minutes || [], hr = hist.hour || {};
  const html = [
    chart("chart-launches", "Launches", m, [{ key: "launches", cls: "ok", name: "ready" }, { key: "launch_failures", cls: "bad", name: "failed" }],
      `${fmt(hr.launches || 0)} ready, ${fmt(hr.launch_failures || 0)} failed`, { unit: "/min" }),
    chart("chart-failures", "Failures", m, [{ key: "attempts_failed", cls: "bad", name: "launch attempts" }, { key: "requests_failed", cls: "worse", name: "requests" }],
      `${plural(hr.attempts_failed || 0, "launch attempt")}, ${plural(hr.requests_failed || 0, "request")} failed`, { unit: "/min" }),
    chart("chart-latency", "Request latency", m, [{ key: "latency_p95", cls: "light", name: "95th percentile" }, { key: "latency_p50", cls: "ok", name: "median" }],
      hr.requests_fulfilled ? `median ${seconds(hist.latency_p50)}, 95% within ${seconds(hist.latency_p95)}, longest ${seconds(hist.latency_max)} (${plural(hr.requests_fulfilled, "request")} fulfilled)` : "no request fulfilled",
      { overlay: true, format: seconds, min: 0.001 }),
  ];
  document.getElementById("activity").innerHTML = html.join("");
}

// meter draws used against a limit (no limit: just the number).
function meter(used, limit, what) {
  if (what === "servers" && (limit ?? used) === 1) what = "server";
  if (limit === undefined || limit === null) return `<span class="meter-text">${fmt(used)} ${esc(what)} <span class="muted">(no limit)</span></span>`;
  const share = limit > 0 ? Math.min(1, used / limit) : 1;
  const cls = used >= limit ? "full" : share >= 0.8 ? "high" : "";
  return `<span class="meter ${cls}" title="${fmt(used)} of ${fmt(limit)} ${esc(what)}"><span style="width:${(share * 100).toFixed(1)}%"></span></span>` +
    `<span class="meter-text">${fmt(used)} / ${fmt(limit)} ${esc(what)}</span>`;
}

function capacityText(p) {
  return p.max_servers !== undefined ? `${fmt(p.used.instances)} / ${plural(p.max_servers, "server")}` : plural(p.used.instances, "server");
}

function quotaCell(pv) {
  const q = pv.cloud_quota;
  if (!q) return `<span class="muted">not known</span>`;
  const parts = [];
  for (const [k, what, used] of [["instances", "instances", pv.used.instances], ["cores", "cores", pv.used.cores], ["ram", "MB RAM", pv.used.ram]]) {
    if (q.limits[k] === undefined) continue;
    const others = (q.others || {})[k] || 0;
    parts.push(`<div>${meter(used + others, q.limits[k], what)}${others ? ` <span class="muted">(${fmt(others)} not nodepool's)</span>` : ""}</div>`);
  }
  return (parts.length ? parts.join("") : `no limit`) + ` <span class="muted">(read ${ago(q.read)})</span>`;
}

function renderCapacity() {
  const pools = (overview?.pools || []).filter((p) => (!filters.provider || p.provider === filters.provider) &&
    (!filters.label || (p.labels || []).includes(filters.label)));
  if (!pools.length) {
    document.getElementById("capacity").innerHTML = `<p class="empty">${overview?.pools?.length ? "No pool matches the filters." : "No pools."}</p>`;
    return;
  }
  const providers = new Map((overview.providers || []).map((p) => [p.name, p]));
  const sv = served();
  const rows = [];
  let last = null;
  for (const p of pools) {
    if (p.provider !== last) {
      last = p.provider;
      const pv = providers.get(p.provider) || { name: p.provider, used: { instances: 0, cores: 0, ram: 0 }, hour: {} };
      const hour = pv.hour || {};
      const drained = !sv.providers.has(pv.name);
      rows.push(`<tr class="provider${pv.failing ? " failing" : ""}" data-capacity-provider="${esc(pv.name)}" data-draining="${drained}"><th colspan="2">${esc(pv.name)}` +
        `${pv.failing ? " " + badge("failing") : ""}${drained ? " " + badge("draining") : ""}</th>` +
        `<td colspan="2">cloud quota: ${quotaCell(pv)}</td>` +
        `<td colspan="2" class="muted">last hour: ${plural(hour.launches || 0, "launch", "launches")}, ${fmt(hour.launch_failures || 0)} failed, ` +
        `${plural(hour.requests_failed || 0, "request")} failed${pv.failing ? ` — <span class="gone">${esc(pv.failing)}</span>` : ""}</td></tr>`);
    }
    const extra = [];
    if (p.max_cores !== undefined) extra.push(meter(p.used.cores, p.max_cores, "cores"));
    if (p.max_ram !== undefined) extra.push(meter(p.used.ram, p.max_ram, "MB RAM"));
    const drained = sv.providers.has(p.provider) && !sv.pools.has(p.provider + "/" + p.pool);
    const status = p.waiting_for_quota ? badge("quota", "waiting for quota") : drained ? badge("draining") :
      p.waiting ? badge("pending", `${fmt(p.waiting)} waiting`) : "";
    rows.push(`<tr class="pool${p.waiting_for_quota ? " at-quota" : ""}" data-pool="${esc(p.provider + "/" + p.pool)}" data-waiting-for-quota="${p.waiting_for_quota}">` +
      `<td>${id(p.pool)}</td><td>${status}</td>` +
      `<td>${p.configured ? meter(p.used.instances, p.max_servers, "servers") : `${plural(p.used.instances, "server")} <span class="muted">(not in this process's configuration)</span>`}` +
      `${extra.map((e) => `<div>${e}</div>`).join("")}</td>` +
      `<td>${countBadges(new Map(Object.entries(p.states || {})), nodeStates, { provider: p.provider })}</td>` +
      `<td>${(p.labels || []).map((l) => `<a href="${link({ label: l })}" class="tag">${esc(l)}</a>`).join(" ")}</td>` +
      `<td class="reason">${p.waiting ? `${plural(p.waiting, "request")} waiting${p.wait_reason ? ": " + esc(p.wait_reason) : ""}` : ""}` +
      `${p.launchers.length ? "" : ` <span class="gone">no live launcher serves it</span>`}</td></tr>`);
  }
  document.getElementById("capacity").innerHTML =
    `<div class="scroll"><table class="capacity"><thead><tr><th>Pool</th><th></th><th>In use</th><th>Nodes</th><th>Labels</th><th>Waiting</th></tr></thead><tbody>${rows.join("")}</tbody></table></div>`;
}

function renderLabels(nodes) {
  const by = new Map();
  for (const n of nodes) {
    if (filters.provider && n.provider !== filters.provider) continue;
    for (const l of (n.labels && n.labels.length ? n.labels : [""])) {
      if (!by.has(l)) by.set(l, new Map());
      const m = by.get(l);
      m.set(n.state, (m.get(n.state) || 0) + 1);
    }
  }
  for (const p of overview?.pools || []) {
    if (filters.provider && p.provider !== filters.provider) continue;
    for (const l of p.labels || []) if (!by.has(l)) by.set(l, new Map());
  }
  const labels = [...by.keys()].filter((l) => !filters.label || l === filters.label).sort();
  if (!labels.length) {
    document.getElementById("labels").innerHTML = `<p class="empty">No labels.</p>`;
    return;
  }
  const rows = labels.map((l) => {
    const m = by.get(l);
    const total = [...m.values()].reduce((a, b) => a + b, 0);
    return `<tr data-label="${esc(l)}"><td class="id"><a href="${link({ label: l })}">${esc(l || "(none)")}</a></td><td>${fmt(total)}</td><td>${countBadges(m, nodeStates, { label: l })}</td></tr>`;
  });
  document.getElementById("labels").innerHTML =
    `<div class="scroll"><table><thead><tr><th>Label</th><th>Nodes</th><th>By state</th></tr></thead><tbody>${rows.join("")}</tbody></table></div>`;
}

// pager says which rows are shown and moves between pages.
function pager(kind, total, all, page, per) {
  const pagesN = Math.max(1, Math.ceil(total / per));
  const first = total ? page * per + 1 : 0, lastRow = Math.min(total, (page + 1) * per);
  const of = total === all ? `${fmt(total)}` : `${fmt(total)} matching (of ${fmt(all)})`;
  const btn = (p, text) => `<button type="button" data-page-of="${kind}" data-page="${p}"${p < 0 || p >= pagesN || p === page ? " disabled" : ""}>${text}</button>`;
  return `<div class="pager" data-pager="${kind}"><span>${fmt(first)}–${fmt(lastRow)} of ${of}</span>` +
    (pagesN > 1 ? ` ${btn(0, "first")}${btn(page - 1, "‹ previous")}<span class="muted">page ${page + 1} of ${fmt(pagesN)}</span>${btn(page + 1, "next ›")}${btn(pagesN - 1, "last")}` : "") + `</div>`;
}

function requestOrder(a, b) {
  return stateOrder(requestStates)(a.state, b.state) || (a.priority - b.priority) || (a.relative_priority - b.relative_priority) || byCreated(a, b);
}

function renderRequests(reqs) {
  const shown = reqs.filter(requestMatches).sort(requestOrder);
  if (!shown.length) {
    document.getElementById("requests").innerHTML = `<p class="empty">${reqs.length ? "No request matches the filters." : "No requests."}</p>`;
    return;
  }
  const pagesN = Math.ceil(shown.length / requestsPerPage);
  pages.requests = Math.min(pages.requests, pagesN - 1);
  const rows = shown.slice(pages.requests * requestsPerPage, (pages.requests + 1) * requestsPerPage).map((r) => {
    // Who declined a request matters only while it waits or once it failed.
    const why = r.state === "fulfilled" ? "" : esc(r.reason);
    const declined = r.state !== "fulfilled" && r.declined_by && r.declined_by.length ? `${why ? "; " : ""}declined by ${esc(r.declined_by.join(", "))}` : "";
    return `<tr data-request-id="${esc(r.id)}" data-state="${esc(r.state)}"><td>${id(r.id)}</td><td>${badge(r.state)}</td>` +
      `<td>${esc(labelsOf(r))}</td><td>${r.provider ? id(r.provider + "/" + r.pool) : ""}</td>` +
      `<td>${esc(r.requestor)}</td><td>${esc(r.priority)}/${esc(r.relative_priority)}</td><td>${ago(r.created)}</td>` +
      `<td class="ids">${(r.nodes || []).map((n) => id(n)).join(" ")}</td><td class="reason">${why}${declined}</td></tr>`;
  });
  document.getElementById("requests").innerHTML = pager("requests", shown.length, reqs.length, pages.requests, requestsPerPage) +
    `<div class="scroll"><table><thead><tr><th>ID</th><th>State</th><th>Labels</th><th>Pool</th><th>Requestor</th><th>Priority</th>` +
    `<th>Submitted</th><th>Nodes</th><th>Why</th></tr></thead><tbody>${rows.join("")}</tbody></table></div>`;
}

// nodeDetail says what matters of a node in its state.
function nodeDetail(n) {
  switch (n.state) {
    case "building":
    case "init": {
      const attempt = n.attempt ? `attempt ${fmt(n.attempt)}` : "";
      const err = n.reason ? `last error: ${esc(n.reason)}` : "";
      return [attempt, err].filter(Boolean).join(" — ");
    }
    case "hold":
      return `held${n.hold_job ? " for " + esc(n.hold_job) : ""}: ${esc(n.comment || "no reason given")}, ${expiry(n.hold_expiration)}`;
    case "failed":
    case "aborted":
      return esc(n.reason || n.comment);
    default:
      return esc(n.comment || n.reason);
  }
}

function renderNodes(nodes) {
  const shown = nodes.filter(nodeMatches).sort(byCreated);
  if (!shown.length) {
    document.getElementById("nodes").innerHTML = `<p class="empty">${nodes.length ? "No node matches the filters." : "No nodes."}</p>`;
    return;
  }
  const pagesN = Math.ceil(shown.length / nodesPerPage);
  pages.nodes = Math.min(pages.nodes, pagesN - 1);
  const sv = served();
  const rows = shown.slice(pages.nodes * nodesPerPage, (pages.nodes + 1) * nodesPerPage).map((n) => {
    // A node of a provider, pool or label removed from the configuration
    // is being drained.
    const gone = removal(n, sv);
    const owner = n.holder ? `held by ${esc(n.holder)}` : n.allocated_to ? `for ${id(n.allocated_to)}` : "";
    const launcher = n.launcher ? id(n.launcher, alive(n.launcher) ? "" : "gone") : "";
    const label = labelsOf(n);
    return `<tr data-node-id="${esc(n.id)}" data-state="${esc(n.state)}" data-provider="${esc(n.provider)}" data-pool="${esc(n.provider + "/" + n.pool)}" data-label="${esc(label)}" data-draining="${gone !== ""}">` +
      `<td>${id(n.id)}</td><td>${badge(n.state)} <span class="muted">${since(n.state_time)}</span>` +
      `${gone ? ` <span title="its ${gone} was removed from the configuration">${badge("draining")}</span>` : ""}</td>` +
      `<td>${esc(label)}</td><td>${id(n.provider + "/" + n.pool)}</td><td>${ago(n.created)}</td>` +
      `<td>${owner}</td><td>${launcher}</td><td class="reason">${nodeDetail(n)}</td></tr>`;
  });
  document.getElementById("nodes").innerHTML = pager("nodes", shown.length, nodes.length, pages.nodes, nodesPerPage) +
    `<div class="scroll"><table><thead><tr><th>ID</th><th>State</th><th>Label</th><th>Pool</th><th>Created</th><th>Owner</th><th>Launcher</th><th>Detail</th></tr></thead>` +
    `<tbody>${rows.join("")}</tbody></table></div>`;
}

function renderImages() {
  const byName = new Map([...state.images.values()].map((i) => [i.name, i]));
  const names = new Set([...byName.keys()]);
  for (const b of state.builds.values()) names.add(b.image);
  if (!names.size) {
    document.getElementById("images").innerHTML = `<p class="empty">No images.</p>`;
    return;
  }
  const html = [...names].sort().map((name) => {
    const img = byName.get(name);
    const paused = img && img.paused ? ` ${badge("paused")} by ${esc(img.paused_by)}` : "";
    const builds = [...state.builds.values()].filter((b) => b.image === name).sort((a, b) => b.id.localeCompare(a.id));
    const rows = builds.map((b) => {
      const ups = [...state.uploads.values()].filter((u) => u.image === name && u.build_id === b.id)
        .sort((x, y) => (x.provider + x.id).localeCompare(y.provider + y.id))
        .map((u) => `${esc(u.provider)} ${badge(u.state)} ${id(u.external_id)}`).join("<br>");
      return `<tr><td>${id(name + "-" + b.id)}</td><td>${badge(b.state)}</td><td>${ago(b.state_time)}</td>` +
        `<td>${esc(b.builder)}</td><td>${esc((b.formats || []).join(","))}</td><td>${ups}</td><td class="reason">${esc(b.reason)}</td></tr>`;
    }).join("");
    return `<div class="group" data-image="${esc(name)}"><h3>${esc(name)}${paused}</h3>` +
      (rows ? `<div class="scroll"><table><thead><tr><th>Build</th><th>State</th><th>Changed</th><th>Builder</th><th>Formats</th><th>Uploads</th><th>Why</th></tr></thead><tbody>${rows}</tbody></table></div>`
        : `<p class="empty">No builds yet.</p>`) + `</div>`;
  }).join("");
  document.getElementById("images").innerHTML = html;
}

function renderComponents() {
  const comps = [...state.components.values()].sort((a, b) => a.id.localeCompare(b.id));
  if (!comps.length) {
    document.getElementById("components").innerHTML = `<p class="empty">None alive.</p>`;
    return;
  }
  const rows = comps.map((c) => `<tr data-component-id="${esc(c.id)}"><td>${id(c.id)}</td><td>${esc((c.roles || []).join(", "))}</td><td>${esc(c.hostname)}</td>` +
    `<td>${esc(c.version)}</td><td>${since(c.started)}</td><td>${ago(c.heartbeat)}</td>` +
    `<td>${(c.pools || []).map((p) => id(p.provider + "/" + p.pool) + (p.paused ? " " + badge("quota", "waiting for quota") : "")).join(", ")}</td></tr>`);
  document.getElementById("components").innerHTML =
    `<div class="scroll"><table><thead><tr><th>ID</th><th>Roles</th><th>Host</th><th>Version</th><th>Up</th><th>Heartbeat</th><th>Pools</th></tr></thead><tbody>${rows.join("")}</tbody></table></div>`;
}

function renderFilters(nodes, reqs) {
  const providers = new Set((overview?.pools || []).map((p) => p.provider));
  const labels = new Set();
  for (const p of overview?.pools || []) for (const l of p.labels || []) labels.add(l);
  for (const n of nodes) {
    providers.add(n.provider);
    for (const l of n.labels || []) labels.add(l);
  }
  for (const r of reqs) for (const l of r.labels || []) labels.add(l);
  fillSelect("provider", [...providers].filter(Boolean).sort());
  fillSelect("label", [...labels].sort());
  fillSelect("state", [...new Set([...nodeStates, ...requestStates])]);
  document.getElementById("filtered").textContent = filtering() ? "filtering the capacity, labels, requests and nodes" : "";
}

function render() {
  pending = false;
  const t0 = performance.now();
  const nodes = [...state.nodes.values()];
  const reqs = [...state.requests.values()];
  renderFilters(nodes, reqs);
  renderSummary(nodes, reqs);
  renderAttention(nodes.sort(byCreated), reqs.sort(byCreated));
  renderActivity();
  renderCapacity();
  renderLabels(nodes);
  renderRequests(reqs);
  renderNodes(nodes);
  renderImages();
  renderComponents();
  // Lay the page out now, so that the time measured includes it (the
  // browser would before painting anyway).
  void document.body.offsetHeight;
  const took = performance.now() - t0;
  const st = window.nodepoolStats;
  st.renders++;
  st.lastRenderMs = took;
  st.maxRenderMs = Math.max(st.maxRenderMs, took);
  if (!loaded) {
    loaded = true;
    st.firstRender = performance.now();
    performance.mark("nodepool-first-render");
    document.getElementById("loading").hidden = true;
    document.body.dataset.loaded = "true";
  }
}

function scheduleRender() {
  if (!pending) {
    pending = true;
    setTimeout(render, 150);
  }
}

function apply(msg) {
  if (msg.server_time) skew = Date.parse(msg.server_time) - Date.now();
  if (msg.reset) for (const k of kinds) state[k].clear();
  for (const k of kinds) {
    for (const [key, value] of Object.entries(msg[k] || {})) {
      if (value === null) state[k].delete(key);
      else state[k].set(key, value);
    }
  }
  if (msg.overview) overview = msg.overview;
}

// nodepoolSnapshot is called by snapshot.js with every record: the first
// render happens before the page's load event.
window.nodepoolSnapshot = (msg) => {
  apply(msg);
  render();
};

function loadSnapshot() {
  const s = document.createElement("script");
  s.src = "snapshot.js";
  s.onerror = () => {
    document.getElementById("loading").textContent = "Could not load the records; waiting for the event stream…";
  };
  document.head.appendChild(s);
}

function connect() {
  const conn = document.getElementById("conn");
  const events = new EventSource("events");
  events.onopen = () => { conn.dataset.state = "live"; conn.textContent = "live"; };
  events.onerror = () => { conn.dataset.state = "reconnecting"; conn.textContent = "reconnecting"; };
  events.onmessage = (e) => {
    apply(JSON.parse(e.data));
    if (loaded) scheduleRender();
    else render();
  };
}

function setup() {
  readFilters();
  const form = document.getElementById("filters");
  form.addEventListener("input", (e) => {
    if (!(e.target.name in filters)) return;
    filters[e.target.name] = e.target.value.trim();
    pages.nodes = pages.requests = 0;
    writeFilters();
    if (loaded) render();
  });
  form.addEventListener("reset", () => {
    for (const k of Object.keys(filters)) filters[k] = "";
    pages.nodes = pages.requests = 0;
    writeFilters();
    setTimeout(() => { if (loaded) render(); }, 0);
  });
  form.addEventListener("submit", (e) => e.preventDefault());
  // Links in the page (counts, labels) set a filter through the fragment.
  addEventListener("hashchange", () => {
    readFilters();
    if (loaded) render();
  });
  document.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-page-of]");
    if (!b) return;
    pages[b.dataset.pageOf] = parseInt(b.dataset.page, 10);
    writeFilters({ page: pages.nodes ? String(pages.nodes + 1) : "", rpage: pages.requests ? String(pages.requests + 1) : "" });
    render();
  });
}

setup();
loadSnapshot();
// The event stream never ends: opened after the load event, it does not
// keep the page loading.
addEventListener("load", () => setTimeout(connect, 0));
setInterval(() => { if (loaded && !pending) render(); }, 5000);
