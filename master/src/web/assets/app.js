// The dashboard: polls /api/snapshot once a second and draws it. No
// library: tables from template strings, charts as SVG polylines.
"use strict";
const token = new URLSearchParams(location.search).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const $ = (sel) => document.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}
function secs(s) {
  if (s == null) return "";
  if (s < 90) return s.toFixed(s < 10 ? 1 : 0) + " s";
  if (s < 5400) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
const num = (v, d = 2) => (v == null ? "" : Number(v).toFixed(d));
function bar(frac) {
  return `<div class="bar"><span style="width:${(Math.max(0, Math.min(1, frac)) * 100).toFixed(1)}%"></span></div>`;
}

function drawJobs(jobs) {
  const rows = jobs.map((j) => {
    const frac = j.tasks_total ? j.tasks_done / j.tasks_total : 0;
    const open = j.bags.filter((b) => b.done < b.total || b.running + b.waiting + b.dead > 0);
    const bags = (open.length ? open : j.bags).slice(0, 8)
      .map((b) => `${esc(b.name.split("/").slice(1).join("/") || b.name)}: ${b.done}/${b.total} done, ${b.running} running, ${b.waiting} waiting, ${b.dead} dead`)
      .join(" · ");
    const more = j.bags.length > 8 ? ` · … ${j.bags.length} bags` : "";
    return `<tr class="job state-${j.state}" data-job="${esc(j.id)}" data-state="${esc(j.state)}" data-done="${j.tasks_done}" data-total="${j.tasks_total}" data-redone="${j.tasks_redone}">
      <td class="mono" title="${esc(j.id)}">${esc(j.id.slice(0, 8))}</td><td>${esc(j.app)}</td>
      <td><span class="badge ${esc(j.state)}">${esc(j.state)}</span></td>
      <td>${bar(frac)}</td><td class="num">${j.tasks_done}/${j.tasks_total}</td>
      <td class="num redone">${j.tasks_redone}</td><td class="num">${j.tasks_aborted ?? 0}</td><td class="num">${j.tasks_dead}</td>
      <td class="num">${num(j.gflops)}</td><td class="num">${secs(j.elapsed_s)}</td><td class="num">${secs(j.left_s)}</td></tr>
      <tr class="bags"><td></td><td colspan="10">${bags}${more}${j.failure ? ` · <b>${esc(j.failure)}</b>` : ""}</td></tr>`;
  });
  $("#jobs tbody").innerHTML = rows.join("");
  $("#no-jobs").hidden = jobs.length > 0;
}

function drawSlaves(slaves) {
  $("#slaves tbody").innerHTML = slaves.map((s) => `<tr class="slave" data-slave="${esc(s.name)}">
      <td class="mono">${esc(s.name)}</td><td>${esc(s.host)}</td><td class="mono">${esc(s.task ?? "idle")}</td>
      <td class="num">${s.recent_tasks}</td><td class="num">${num(s.recent_gflops)}</td>
      <td class="num">${s.since_heartbeat_ms} ms</td><td class="num">${secs(s.age_s)}</td></tr>`).join("");
  $("#n-slaves").textContent = slaves.length;
  $("#no-slaves").hidden = slaves.length > 0;
}

// One SVG chart: `series` are [{cls, values}] over the samples' times.
function drawChart(svg, history, series, fmt) {
  const W = 480, H = 160, L = 56, B = 18, T = 8;
  if (history.length < 2) { svg.innerHTML = `<text x="${L}" y="${H / 2}">collecting…</text>`; return; }
  const t0 = history[0].t_ms, t1 = history[history.length - 1].t_ms;
  const max = Math.max(1e-9, ...series.flatMap((s) => s.values)) * 1.1;
  const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - 4);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  let out = "";
  for (const f of [0, 0.5, 1]) {
    out += `<line class="grid" x1="${L}" x2="${W}" y1="${y(max * f)}" y2="${y(max * f)}"/><text x="2" y="${y(max * f) + 4}">${fmt(max * f)}</text>`;
  }
  out += `<text x="${L}" y="${H - 3}">−${secs((t1 - t0) / 1000)}</text><text x="${W - 30}" y="${H - 3}">now</text>`;
  for (const s of series) {
    const pts = history.map((h, i) => `${x(h.t_ms).toFixed(1)},${y(s.values[i]).toFixed(1)}`).join(" ");
    out += `<polyline class="${s.cls}" points="${pts}"/>`;
  }
  svg.innerHTML = out;
}

function figures(el, rows) {
  el.innerHTML = rows.map(([k, v, key]) => `<dt>${k}</dt><dd data-k="${key ?? ""}">${v}</dd>`).join("");
}

function draw(s) {
  const n = s.node || {};
  $("#node-line").textContent = `${n.tls ? "TLS" : "plaintext"} · ${n.sessions ?? 0} session(s) · ${n.commits ?? 0} commits`;
  $("#updated").textContent = "updated " + new Date(s.at_ms).toLocaleTimeString();
  $("#error").hidden = !s.error;
  $("#error").textContent = s.error ? "the store node did not answer: " + s.error : "";
  drawJobs(s.jobs || []);
  drawSlaves(s.slaves || []);
  const h = s.history || [];
  drawChart($("#chart-gflops"), h, [{ cls: "gflops", values: h.map((p) => p.gflops) }], (v) => v.toFixed(v < 1 ? 2 : 1));
  drawChart($("#chart-bytes"), h, [
    { cls: "read", values: h.map((p) => p.read_bytes_per_s) },
    { cls: "written", values: h.map((p) => p.written_bytes_per_s) },
  ], (v) => bytes(v) + "/s");
  const jobs = s.jobs || [];
  const sum = (k) => jobs.reduce((a, j) => a + (j[k] || 0), 0);
  figures($("#recovery"), [
    ["tasks orphaned (their slave died or was cut off)", n.tasks_orphaned ?? 0, "tasks_orphaned"],
    ["sessions lost (not closed by their client)", n.sessions_lost ?? 0, "sessions_lost"],
    ["tasks redone (listed jobs)", sum("tasks_redone"), "redone"],
    ["task runs aborted (listed jobs)", sum("tasks_aborted"), "aborted"],
    ["tasks dead-lettered now", sum("tasks_dead"), "dead"],
    ["dead-lettered since start", n.tasks_dead_lettered ?? 0, "dead_lettered"],
  ]);
  const diskUsed = (n.disk_total_bytes || 0) - (n.disk_free_bytes || 0);
  figures($("#store"), [
    ["disk", `${bar(n.disk_total_bytes ? diskUsed / n.disk_total_bytes : 0)}${bytes(n.disk_free_bytes || 0)} free / ${bytes(n.disk_total_bytes || 0)}`, "disk"],
    ["matrices", bytes(n.matrix_bytes || 0), "matrices"],
    ["RocksDB tables", bytes(n.rocksdb_sst_bytes || 0)],
    ["block cache", `${bar(n.block_cache_capacity_bytes ? n.block_cache_bytes / n.block_cache_capacity_bytes : 0)}${bytes(n.block_cache_bytes || 0)} / ${bytes(n.block_cache_capacity_bytes || 0)}`, "cache"],
    ["block files open", n.open_block_files ?? 0],
    ["block bytes read / written", `${bytes(n.block_bytes_read || 0)} / ${bytes(n.block_bytes_written || 0)}`],
    ["commits (mean latency)", `${n.commits ?? 0} (${num(n.commit_mean_ms)} ms)`],
    ["lock waits", n.lock_waits ?? 0],
    ["actions aborted by clients", n.aborts ?? 0],
  ]);
}

async function poll() {
  try {
    const r = await fetch("/api/snapshot", { headers, cache: "no-store" });
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    draw(await r.json());
  } catch (e) {
    $("#error").hidden = false;
    $("#error").textContent = "cannot reach the dashboard: " + e.message;
  }
  setTimeout(poll, 1000);
}
poll();
