// tessera top --web: draws /api/snapshot (pkg/top's snapshot) and asks
// again every refreshMillis. No framework, no network beyond this server.
"use strict";

const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c) e.append(c);
  return e;
};

const fmtGiB = (mib) => (mib / 1024).toFixed(mib % 1024 ? 1 : 0) + " GiB";

function figure(label, value, title) {
  return el("div", { class: "figure", title: title || "" }, el("b", { text: String(value) }), label);
}

function gpuMode(g) {
  if (!g.tenants || g.tenants.length === 0) return "free";
  if (g.tenants.some((t) => t.mode === "exclusive")) return "exclusive";
  return g.mps ? "mps" : "time-slicing";
}

function tenantTile(g, t) {
  const share = t.mode === "exclusive" ? 100 : Math.max(t.coresPercent, 1);
  const preempting = t.state === "Preempting";
  const name = `${t.namespace}/${t.pod}`;
  const tile = el("div", {
    class: `tile ${t.mode}${preempting ? " preempting" : ""}`,
    style: `flex: 0 0 ${share}%`,
    "data-pod": name,
    "data-container": t.container,
    title: `${name} (${t.claim ? "claim " + t.claim : t.container})\n${t.mode}, ${t.memoryMiB} MiB, ${t.coresPercent}% of the SMs\n` +
      `state ${t.state}, priority ${t.priority}\nheld: memory ${t.isolation.memory}, compute ${t.isolation.compute}` +
      (t.live ? `\nusing ${t.usedMiB} MiB, SM ${(100 * t.smUtilization).toFixed(0)}%` : "\nno live usage"),
  }, `${t.pod}${preempting ? " ⟲" : ""}`);
  if (t.live && t.memoryMiB > 0) {
    const used = t.usedMiB / t.memoryMiB;
    tile.append(el("div", { class: `use${used > 1 ? " over" : ""}`, style: `width: ${Math.min(100, 100 * used)}%` }));
  }
  return tile;
}

function gpuCard(g) {
  const mode = gpuMode(g);
  const card = el("div", {
    class: `gpu${g.healthy ? "" : " unhealthy"}`,
    "data-gpu": `${g.node}/${g.index}`,
    "data-uuid": g.uuid,
    "data-mode": mode,
  });
  const marks = el("span");
  if (!g.healthy) marks.append(el("span", { class: "badge bad", text: "unhealthy" }));
  if (g.cordoned) marks.append(el("span", { class: "badge", text: "cordoned" }));
  card.append(el("div", { class: "title" },
    el("span", {}, el("b", { text: `GPU ${g.index}` }), ` ${(g.model || "").replace(/^NVIDIA /, "")}`),
    el("span", {}, el("span", { class: "muted", text: mode === "free" && g.mps ? "free · MPS" : mode }), marks)));
  const bar = el("div", { class: "bar" });
  let used = 0;
  for (const t of g.tenants || []) {
    bar.append(tenantTile(g, t));
    used += t.mode === "exclusive" ? 100 : t.coresPercent;
  }
  if (used < 100) bar.append(el("div", { class: "tile free", style: `flex: 1 1 ${100 - used}%`, text: used ? "" : "free" }));
  card.append(bar);
  const granted = (g.tenants || []).reduce((s, t) => s + t.memoryMiB, 0);
  card.append(el("div", { class: "meta",
    text: `${(g.tenants || []).length}/${g.slices || "–"} slices · ${fmtGiB(granted)} of ${fmtGiB(g.memoryMiB)} granted · ${Math.min(used, 100)}% of SMs` }));
  return card;
}

function render(v) {
  const snap = v;
  const gpus = snap.gpus || [];
  document.getElementById("updated").textContent = `updated ${new Date(v.taken).toLocaleTimeString()}`;
  const err = document.getElementById("error");
  err.hidden = !v.error;
  err.textContent = v.error ? `stale: ${v.error}` : "";

  const free = gpus.filter((g) => g.healthy && (!g.tenants || g.tenants.length === 0)).length;
  const unhealthy = gpus.filter((g) => !g.healthy).length;
  const f = snap.fragmentation || { freeGPUs: 0, fragmentedGPUs: 0 };
  const summary = document.getElementById("summary");
  summary.replaceChildren(
    figure("GPUs", gpus.length),
    figure("allocated", gpus.length - free - unhealthy),
    figure("free", free),
    figure("unhealthy", unhealthy),
    figure("pending GPU pods", snap.pending || 0),
    el("div", { class: "figure", id: "fragmentation",
      title: "Of the free GPU compute, what the cluster's typical and waiting GPU pods cannot use (the FGD paper's fragmentation)" },
      el("b", { text: `${(100 * (v.fragmentationRatio || 0)).toFixed(0)}%` }),
      `fragmented: ${f.fragmentedGPUs.toFixed(2)} of ${f.freeGPUs.toFixed(2)} free GPUs`),
  );

  const byNode = new Map();
  for (const g of gpus) {
    if (!byNode.has(g.node)) byNode.set(g.node, []);
    byNode.get(g.node).push(g);
  }
  const nodes = document.getElementById("nodes");
  nodes.replaceChildren(...[...byNode].map(([name, gs]) => {
    const cordoned = gs.some((g) => g.cordoned);
    const n = el("div", { class: `node${cordoned ? " cordoned" : ""}`, "data-node": name });
    n.append(el("h2", {}, name, cordoned ? el("span", { class: "badge", text: "cordoned" }) : null));
    n.append(el("div", { class: "gpus" }, ...gs.map(gpuCard)));
    return n;
  }));

  const pending = document.getElementById("pending");
  const rows = (snap.pendingPods || []).map((p) =>
    el("tr", { "data-pending": `${p.namespace}/${p.name}` },
      el("td", { text: `${p.namespace}/${p.name}` }),
      el("td", { text: p.reason || "not yet tried" }),
      el("td", { text: p.since ? new Date(p.since).toLocaleTimeString() : "" })));
  pending.replaceChildren(el("h2", { text: `Pending GPU pods (${rows.length})` }),
    rows.length ? el("table", {}, el("tr", {}, el("th", { text: "pod" }), el("th", { text: "why it waits" }), el("th", { text: "since" })), ...rows)
      : el("p", { class: "muted", text: "none" }));

  const notes = document.getElementById("notes");
  notes.replaceChildren(...[...(snap.held || []), ...(snap.unreadable || [])].map((t) => el("p", { class: "error", text: t })));
}

async function refresh() {
  let wait = 2000;
  try {
    const r = await fetch("api/snapshot", { cache: "no-store" });
    const v = await r.json();
    wait = v.refreshMillis || wait;
    render(v);
  } catch (e) {
    const err = document.getElementById("error");
    err.hidden = false;
    err.textContent = `cannot reach tessera top --web: ${e}`;
  }
  setTimeout(refresh, wait);
}

refresh();
