// The alerts inbox across runs: every run with alerts, firing first, its verdict and its
// incidents told from their cause (the same cards as the run page). Refreshed every few
// seconds; the filter is kept in the address.

import { API, el, getJSON, query } from "./api.js";
import { AlertsPanel } from "./alerts.js";
import { headOf } from "./alert_card.js";
import { alertActions } from "./inbox_actions.js";
import { needsLogin, showLogin } from "./login.js";

const REFRESH_MS = 5000;
let timer = null;
const $ = (id) => document.getElementById(id);
const start = new URLSearchParams(location.search);
$("f-state").value = start.get("state") || "";

function runBlock(entry) {
  const box = el("section", "card inbox-run");
  box.dataset.runId = String(entry.run.id);
  box.dataset.verdict = entry.verdict.kind;
  const h = el("h2");
  const link = el("a", null, entry.run.name);
  link.href = `/runs/${encodeURIComponent(entry.run.id)}`;
  h.append(link, el("span", `state ${entry.verdict.kind}`, entry.verdict.text), el("span", "chip", entry.run.project));
  const list = el("div", "alerts");
  const counter = el("span", "count");
  h.append(counter);
  box.append(h, el("p", "meta", entry.verdict.detail), list);
  const panel = new AlertsPanel(list, counter, {
    onShow: (a) => {
      const at = headOf(a);
      location.href = `/runs/${encodeURIComponent(a.run_id)}${query({ rank: a.rank || null, head: at ? at.join(".") : null, stat: a.metric.startsWith("attn.") ? a.metric : null })}`;
    },
    actions: alertActions(null, (a) => panel.upsert(a)),
  });
  panel.setIncidents(entry.incidents, entry.alerts);
  return box;
}

async function refresh() {
  const state = $("f-state").value;
  const q = query({ state });
  history.replaceState(null, "", `${location.pathname}${q}`);
  try {
    const runs = await getJSON(`${API}/dashboard/alerts${q}`);
    $("inbox").replaceChildren(...runs.map(runBlock));
    $("inbox-empty").hidden = runs.length > 0;
    const n = runs.reduce((s, r) => s + r.incidents.length, 0);
    $("f-count").textContent = `${n} incident${n === 1 ? "" : "s"} on ${runs.length} run${runs.length === 1 ? "" : "s"}`;
    $("status").textContent = "up to date";
    $("status").dataset.state = "ok";
    document.body.dataset.ready = "1";
  } catch (err) {
    if (needsLogin(err)) {
      showLogin(err.message);
      document.body.dataset.ready = "1";
      return;
    }
    $("status").textContent = `could not load: ${err.message}`;
    $("status").dataset.state = "error";
  }
  clearTimeout(timer);
  timer = setTimeout(refresh, REFRESH_MS);
}

$("f-state").addEventListener("change", () => refresh());
refresh();
