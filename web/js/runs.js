// The runs page: every run with its status, a loss sparkline, last step and open alerts;
// filters (kept in the address, so a filtered view can be bookmarked); tick runs to compare.
// Refreshed every few seconds (the collector caches sparklines and reads only new frames).

import { API, ago, el, getPage, query, sparkline, wireText } from "./api.js";
import { needsLogin, showLogin } from "./login.js";

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
  const name = el("td", "name");
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
  const state = el("td");
  state.append(el("span", `state ${run.status}`, run.status));
  const spark = el("td", "spark-cell");
  const wrap = el("div", "spark-wrap");
  wrap.append(sparkline(run.loss_steps, run.loss_values), el("span", "last", run.last_loss == null ? "" : wireText(run.last_loss, 4)));
  spark.append(wrap);
  spark.title = run.loss_steps.length ? `loss over steps ${run.loss_steps[0]}–${run.loss_steps.at(-1)}` : "no loss yet";
  const alerts = el("td", "num");
  const badge = el("span", run.open_alerts > 0 ? "badge firing" : "badge ok", run.open_alerts);
  badge.title = run.open_alerts > 0 ? `${run.open_alerts} alert(s) firing` : "no alert firing";
  alerts.append(badge);
  tr.append(
    name,
    el("td", null, run.project),
    state,
    spark,
    el("td", "num", run.last_step ?? "—"),
    el("td", "num", ago(run.last_time)),
    alerts,
  );
  return tr;
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
    body.replaceChildren(...runs.map(row));
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

function onFilter() {
  const f = filters();
  history.replaceState(null, "", `/${query({ ...f, compare: [...selected].join(",") })}`);
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
