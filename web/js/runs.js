// The runs page: a table of every run (status, verdict, loss sparkline, start, duration,
// last step, open alerts, tags, configuration), sorted by a click on a header; filters and
// the sort kept in the address, so a view can be bookmarked; tick runs to compare.
// Refreshed every few seconds (the collector caches sparklines and reads only new frames).

import { API, el, getPage, query } from "./api.js";
import { needsLogin, showLogin } from "./login.js";
import { COLUMNS, headerRow, parseSort, sorted } from "./runs_table.js";

const REFRESH_MS = 3000;

const $ = (id) => document.getElementById(id);
const table = $("runs-table");
const body = table.querySelector("tbody");
const status = $("status");
const form = $("filters");
const selected = new Set();
const projects = new Set();
let timer = null;

// Filters and selection from the address: /?project=p&status=running&q=gpt&compare=3
const start = new URLSearchParams(location.search);
$("f-q").value = start.get("q") || "";
$("f-status").value = start.get("status") || "";
$("f-alerting").checked = start.get("alerting") === "true";
for (const id of (start.get("compare") || "").split(",")) if (id) selected.add(id);
let wantedProject = start.get("project") || "";
let sort = parseSort(start.get("sort"));
let lastRuns = [];

function filters() {
  return {
    q: $("f-q").value.trim(),
    project: $("f-project").value || wantedProject,
    status: $("f-status").value,
    alerting: $("f-alerting").checked ? "true" : "",
  };
}

function showProjects() {
  const select = $("f-project");
  const keep = select.value || wantedProject;
  const names = [...projects].sort();
  if ([...select.options].slice(1).map((o) => o.value).join() === names.join()) return;
  select.replaceChildren(new Option("all", ""), ...names.map((p) => new Option(p, p)));
  select.value = names.includes(keep) ? keep : "";
}

function updateCompare() {
  const button = $("compare");
  button.disabled = selected.size < 1;
  button.textContent = selected.size ? `compare selected (${selected.size})` : "compare selected";
}

function row(run) {
  const tr = el("tr");
  tr.dataset.runId = String(run.id);
  tr.dataset.status = run.status;
  tr.dataset.verdict = run.verdict;
  const name = el("td", "name");
  name.dataset.col = "name";
  const tick = el("input");
  tick.type = "checkbox";
  tick.className = "pick";
  tick.title = "compare";
  tick.checked = selected.has(String(run.id));
  tick.addEventListener("change", () => {
    if (tick.checked) selected.add(String(run.id));
    else selected.delete(String(run.id));
    updateCompare();
  });
  const link = el("a", null, run.name);
  link.href = `/runs/${encodeURIComponent(run.id)}`;
  name.append(tick, link);
  tr.append(name);
  for (const c of COLUMNS.slice(1)) {
    const td = c.cell(run);
    td.dataset.col = c.key;
    tr.append(td);
  }
  return tr;
}

function draw() {
  table.tHead.replaceChildren(headerRow(sort, onSort));
  body.replaceChildren(...sorted(lastRuns, sort).map(row));
}

function onSort(key) {
  sort = sort?.key === key ? { key, desc: !sort.desc } : { key, desc: ["started", "duration", "step", "seen", "alerts"].includes(key) };
  writeAddress();
  draw();
}

async function refresh() {
  clearTimeout(timer);
  let again = true;
  const f = filters();
  try {
    // the newest runs first, one page (the collector's default: 500); filters narrow it
    const { items: runs, total } = await getPage(`${API}/dashboard/runs${query(f)}`);
    for (const r of runs) projects.add(r.project);
    showProjects();
    wantedProject = "";
    lastRuns = runs;
    draw();
    const filtered = Boolean(f.q || f.project || f.status || f.alerting);
    table.hidden = runs.length === 0;
    $("runs-empty").hidden = runs.length !== 0 || filtered;
    $("runs-none").hidden = runs.length !== 0 || !filtered;
    const shown = runs.length < total ? `${runs.length} of ${total}` : `${runs.length}`;
    $("f-count").textContent = `${shown} run${total === 1 ? "" : "s"}`;
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.dataset.state = "ok";
  } catch (err) {
    if (needsLogin(err)) {
      again = false; // the page reloads after a login
      status.textContent = "log in to see runs";
      status.dataset.state = "error";
      form.hidden = true;
      showLogin(err.message);
      return;
    }
    status.textContent = `collector unreachable (${err.message}); retrying`;
    status.dataset.state = "error";
    console.warn("runs refresh failed", err);
  } finally {
    document.body.dataset.ready = "1";
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    if (again) timer = setTimeout(refresh, REFRESH_MS);
  }
}

function writeAddress() {
  const s = sort ? `${sort.key}-${sort.desc ? "desc" : "asc"}` : "";
  history.replaceState(null, "", `/${query({ ...filters(), sort: s, compare: [...selected].join(",") })}`);
}

function onFilter() {
  writeAddress();
  refresh();
}

form.addEventListener("submit", (e) => e.preventDefault());
$("f-q").addEventListener("input", onFilter);
for (const id of ["f-project", "f-status", "f-alerting"]) $(id).addEventListener("change", onFilter);
$("compare").addEventListener("click", () => {
  location.href = `/compare${query({ runs: [...selected].join(",") })}`;
});
updateCompare();
refresh();
