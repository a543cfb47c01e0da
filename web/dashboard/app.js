// The nodepool dashboard: the records of the buckets, kept up to date by the
// status port's event stream (/dashboard/events), grouped for an operator.
"use strict";

const kinds = ["nodes", "requests", "components", "images", "builds", "uploads", "providers"];
const state = Object.fromEntries(kinds.map((k) => [k, new Map()]));
let skew = 0; // server clock minus ours, in ms
let dirty = false;
const chipsPerLabel = 200;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// age prints how long ago an RFC 3339 time was: 45s, 3m12s, 5h02m, 2d03h.
function age(t) {
  if (!t) return "";
  let s = Math.max(0, Math.floor((Date.now() + skew - Date.parse(t)) / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  if (s < 172800) return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + String(Math.floor(s / 3600) % 24).padStart(2, "0") + "h";
}

function badge(st) {
  return `<span class="badge state-${esc(st)}">${esc(st)}</span>`;
}

function counts(items, key) {
  const out = new Map();
  for (const x of items) out.set(x[key], (out.get(x[key]) || 0) + 1);
  return out;
}

function countBadges(m) {
  return [...m.entries()].sort().map(([st, n]) => `<span class="badge state-${esc(st)}">${n} ${esc(st)}</span>`).join(" ");
}

function byCreated(a, b) {
  return (a.created || "").localeCompare(b.created || "") || String(a.id).localeCompare(String(b.id));
}

function alive(id) {
  return state.components.has(id);
}

function renderSummary() {
  const nodes = [...state.nodes.values()];
  const reqs = [...state.requests.values()];
  document.getElementById("summary").innerHTML =
    `${nodes.length} nodes ${countBadges(counts(nodes, "state"))} · ${reqs.length} requests ${countBadges(counts(reqs, "state"))}`;
}

// failingProviders lists the providers with failingAfter or more requests
// failed in the last hour (a request fails when its node's last launch
// attempt failed), with the reason of the last one.
const failingAfter = 3;
function failingProviders(rows) {
  const recent = new Map();
  for (const r of state.requests.values()) {
    if (r.state !== "failed" || !r.provider || Date.now() + skew - Date.parse(r.state_time) > 3600 * 1000) continue;
    if (!recent.has(r.provider)) recent.set(r.provider, []);
    recent.get(r.provider).push(r);
  }
  for (const [provider, failed] of [...recent.entries()].sort(([a], [b]) => a.localeCompare(b))) {
    if (failed.length < failingAfter) continue;
    const last = failed.reduce((a, b) => ((a.state_time || "") > (b.state_time || "") ? a : b));
    rows.push(`<tr class="attention" data-failing-provider="${esc(provider)}"><td>provider ${esc(provider)}</td><td>${badge("failing")}</td>` +
      `<td>${failed.length} requests failed in the last hour</td><td>${age(last.state_time)}</td>` +
      `<td class="reason">the last: ${esc(last.reason)}</td></tr>`);
  }
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
    const what = `${left.length} nodes ${countBadges(counts(left, "state"))}, ${uploads} uploads left`;
    const why = p.problem
      ? `its drain cannot go on: ${esc(p.problem)} (since ${age(p.problem_since)}; <code>nodepool erase ${esc(p.name)}</code> gives it up)`
      : "removed from the configuration: its nodes, instances and uploads are being deleted";
    rows.push(`<tr class="attention${p.problem ? "" : " hold"}" data-draining-provider="${esc(p.name)}" data-stuck="${p.problem ? "true" : "false"}">` +
      `<td>provider ${esc(p.name)}</td><td>${badge(p.problem ? "stuck" : "draining")}</td>` +
      `<td>${what}</td><td>${age(p.draining_since)}</td><td class="reason">${why}</td></tr>`);
  }
  // Nodes of removed providers that no remembered section covers.
  const remembered = new Set([...state.providers.values()].map((p) => p.name));
  const orphans = group([...state.nodes.values()].filter((n) => removal(n, sv) === "provider" && !remembered.has(n.provider)), (n) => n.provider);
  for (const [provider, nodes] of orphans) {
    rows.push(`<tr class="attention" data-draining-provider="${esc(provider)}" data-stuck="true"><td>provider ${esc(provider)}</td>` +
      `<td>${badge("stuck")}</td><td>${nodes.length} nodes ${countBadges(counts(nodes, "state"))}</td><td></td>` +
      `<td class="reason">no live process has it in its configuration, and none remembers it</td></tr>`);
  }
}

function renderAttention() {
  const rows = [];
  failingProviders(rows);
  drainingProviders(rows);
  const nodes = [...state.nodes.values()].sort(byCreated);
  for (const n of nodes) {
    if (n.state === "hold") {
      const until = n.hold_expiration ? `until ${esc(n.hold_expiration)}` : "no expiry";
      rows.push(`<tr class="attention hold" data-node-id="${esc(n.id)}"><td>node ${esc(n.id)}</td><td>${badge(n.state)}</td>` +
        `<td>${esc(n.provider)}/${esc(n.pool)} ${esc((n.labels || []).join(","))}</td><td>${age(n.state_time)}</td>` +
        `<td class="reason">held${n.hold_job ? " for " + esc(n.hold_job) : ""}: ${esc(n.comment || "no reason given")}, ${until}</td></tr>`);
    } else if (n.state === "failed" || n.state === "aborted") {
      rows.push(`<tr class="attention" data-node-id="${esc(n.id)}"><td>node ${esc(n.id)}</td><td>${badge(n.state)}</td>` +
        `<td>${esc(n.provider)}/${esc(n.pool)} ${esc((n.labels || []).join(","))}</td><td>${age(n.state_time)}</td>` +
        `<td class="reason">${esc(n.reason || n.comment)}</td></tr>`);
    } else if ((n.state === "building" || n.state === "deleting") && n.launcher && !alive(n.launcher)) {
      rows.push(`<tr class="attention" data-node-id="${esc(n.id)}"><td>node ${esc(n.id)}</td><td>${badge(n.state)}</td>` +
        `<td>${esc(n.provider)}/${esc(n.pool)}</td><td>${age(n.state_time)}</td>` +
        `<td class="reason">its launcher <span class="gone">${esc(n.launcher)}</span> is gone; cleanup hands it to another</td></tr>`);
    }
  }
  for (const r of [...state.requests.values()].sort(byCreated)) {
    if (r.state === "failed") {
      rows.push(`<tr class="attention"><td>request ${esc(r.id)}</td><td>${badge(r.state)}</td><td>${esc((r.labels || []).join(","))}</td>` +
        `<td>${age(r.state_time)}</td><td class="reason">${esc(r.reason)}</td></tr>`);
    }
  }
  for (const b of state.builds.values()) {
    if (b.state === "failed") {
      rows.push(`<tr class="attention"><td>build ${esc(b.image)}-${esc(b.id)}</td><td>${badge(b.state)}</td><td>${esc(b.builder)}</td>` +
        `<td>${age(b.state_time)}</td><td class="reason">${esc(b.reason)}</td></tr>`);
    }
  }
  for (const u of state.uploads.values()) {
    if (u.state === "failed") {
      rows.push(`<tr class="attention"><td>upload ${esc(u.image)}-${esc(u.build_id)} to ${esc(u.provider)}</td><td>${badge(u.state)}</td>` +
        `<td>attempt ${esc(u.attempt)}</td><td>${age(u.state_time)}</td><td class="reason">${esc(u.reason)}</td></tr>`);
    }
  }
  for (const c of state.components.values()) {
    for (const p of c.pools || []) {
      if (p.paused) {
        rows.push(`<tr class="attention hold"><td>pool ${esc(p.provider)}/${esc(p.pool)}</td><td>${badge("paused")}</td>` +
          `<td>${esc(c.id)}</td><td></td><td class="reason">waiting for quota</td></tr>`);
      }
    }
  }
  document.getElementById("attention").innerHTML = rows.length
    ? `<table><tbody>${rows.join("")}</tbody></table>`
    : `<p class="empty">Nothing held or failed.</p>`;
}

function renderRequests() {
  const reqs = [...state.requests.values()].sort(byCreated);
  if (!reqs.length) {
    document.getElementById("requests").innerHTML = `<p class="empty">No requests.</p>`;
    return;
  }
  const rows = reqs.map((r) =>
    `<tr data-request-id="${esc(r.id)}" data-state="${esc(r.state)}"><td>${esc(r.id)}</td><td>${badge(r.state)}</td>` +
    `<td>${esc((r.labels || []).join(", "))}</td><td>${r.provider ? esc(r.provider + "/" + r.pool) : ""}</td>` +
    `<td>${esc(r.requestor)}</td><td>${esc(r.priority)}/${esc(r.relative_priority)}</td><td>${age(r.created)}</td>` +
    `<td>${esc((r.nodes || []).join(", "))}</td><td class="reason">${esc(r.reason)}` +
    `${r.declined_by && r.declined_by.length ? " declined by " + esc(r.declined_by.join(", ")) : ""}</td></tr>`);
  document.getElementById("requests").innerHTML =
    `<table><thead><tr><th>ID</th><th>State</th><th>Labels</th><th>Pool</th><th>Requestor</th><th>Priority</th>` +
    `<th>Age</th><th>Nodes</th><th>Why</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

function group(items, key) {
  const out = new Map();
  for (const x of items) {
    const k = key(x);
    if (!out.has(k)) out.set(k, []);
    out.get(k).push(x);
  }
  return [...out.entries()].sort(([a], [b]) => a.localeCompare(b));
}

function chip(n) {
  const owner = n.holder ? ` held by ${n.holder}` : n.allocated_to ? ` for request ${n.allocated_to}` : "";
  const launcher = n.launcher ? ` launcher ${n.launcher}${alive(n.launcher) ? "" : " (gone)"}` : "";
  const title = `${n.id} ${n.state} for ${age(n.state_time)}, ${age(n.created)} old${owner}${launcher}` +
    `${n.comment ? " — " + n.comment : ""}${n.reason ? " — " + n.reason : ""}`;
  return `<span class="chip state-${esc(n.state)}" data-node-id="${esc(n.id)}" data-state="${esc(n.state)}" title="${esc(title)}">${esc(n.id)}</span>`;
}

// drainMark is the badge of a group of nodes that is being drained (its
// provider, pool or label was removed from the configuration).
function drainMark(draining) {
  return draining ? ` ${badge("draining")}` : "";
}

function renderNodes() {
  const nodes = [...state.nodes.values()].sort(byCreated);
  if (!nodes.length) {
    document.getElementById("nodes").innerHTML = `<p class="empty">No nodes.</p>`;
    return;
  }
  const sv = served();
  const html = group(nodes, (n) => n.provider).map(([provider, pn]) => {
    const providerGone = !sv.providers.has(provider);
    const pools = group(pn, (n) => n.pool).map(([pool, nn]) => {
      const poolGone = !providerGone && !sv.pools.has(provider + "/" + pool);
      const labels = group(nn, (n) => (n.labels || []).join(",")).map(([label, ln]) => {
        const labelGone = !providerGone && !poolGone && removal(ln[0], sv) === "label";
        const shown = ln.slice(0, chipsPerLabel).map(chip).join("");
        const more = ln.length > chipsPerLabel ? `<span class="more">and ${ln.length - chipsPerLabel} more</span>` : "";
        return `<div class="label" data-label="${esc(label)}" data-draining="${labelGone}"><span class="name">${esc(label)}</span>` +
          `${drainMark(labelGone)} ${countBadges(counts(ln, "state"))}<div class="chips">${shown}${more}</div></div>`;
      }).join("");
      return `<div class="pool" data-pool="${esc(provider + "/" + pool)}" data-draining="${poolGone}"><h4>${esc(pool)}${drainMark(poolGone)} ${countBadges(counts(nn, "state"))}</h4>${labels}</div>`;
    }).join("");
    return `<div class="group" data-provider="${esc(provider)}" data-draining="${providerGone}"><h3>${esc(provider)}${drainMark(providerGone)} ${countBadges(counts(pn, "state"))}</h3>${pools}</div>`;
  }).join("");
  document.getElementById("nodes").innerHTML = html;
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
        .map((u) => `${esc(u.provider)} ${badge(u.state)} ${esc(u.external_id)}`).join("<br>");
      return `<tr><td>${esc(name)}-${esc(b.id)}</td><td>${badge(b.state)}</td><td>${age(b.state_time)}</td>` +
        `<td>${esc(b.builder)}</td><td>${esc((b.formats || []).join(","))}</td><td>${ups}</td><td class="reason">${esc(b.reason)}</td></tr>`;
    }).join("");
    return `<div class="group" data-image="${esc(name)}"><h3>${esc(name)}${paused}</h3>` +
      (rows ? `<table><thead><tr><th>Build</th><th>State</th><th>Age</th><th>Builder</th><th>Formats</th><th>Uploads</th><th>Why</th></tr></thead><tbody>${rows}</tbody></table>`
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
  const rows = comps.map((c) => `<tr><td>${esc(c.id)}</td><td>${esc((c.roles || []).join(", "))}</td><td>${esc(c.hostname)}</td>` +
    `<td>${esc(c.version)}</td><td>${age(c.started)}</td><td>${(c.pools || []).map((p) => esc(p.provider + "/" + p.pool) + (p.paused ? " " + badge("paused") : "")).join(", ")}</td></tr>`);
  document.getElementById("components").innerHTML =
    `<table><thead><tr><th>ID</th><th>Roles</th><th>Host</th><th>Version</th><th>Up</th><th>Pools</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

function render() {
  dirty = false;
  renderSummary();
  renderAttention();
  renderRequests();
  renderNodes();
  renderImages();
  renderComponents();
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
  if (!dirty) {
    dirty = true;
    setTimeout(render, 100);
  }
}

function connect() {
  const conn = document.getElementById("conn");
  const events = new EventSource("events");
  events.onopen = () => { conn.dataset.state = "live"; conn.textContent = "live"; };
  events.onerror = () => { conn.dataset.state = "reconnecting"; conn.textContent = "reconnecting"; };
  events.onmessage = (e) => apply(JSON.parse(e.data));
}

connect();
setInterval(() => { if (!dirty) render(); }, 5000);
