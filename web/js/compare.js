// Compare runs: chosen series of several runs overlaid, one chart per series, one zoom for
// all of them (re-queried from the server), refreshed every few seconds while not zoomed.
//   /compare?runs=1,2,3&names=loss,grad.norm

import { API, ApiError, el, getJSON, query } from "./api.js";
import { FigureChart, ZoomSync } from "./charts.js";
import { needsLogin, showLogin } from "./login.js";

const PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4", "#bc4c00", "#57606a", "#e85aad", "#2da44e"];
const DEFAULT = ["loss", "grad.norm", "attn.logit_max", "lr"];
const REFRESH_MS = 5000;

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let runs = [...new Set((params.get("runs") || "").split(",").filter(Boolean))];
const zoom = new ZoomSync(showZoom);
const charts = new Map(); // metric name -> chart

function showZoom(range) {
  $("zoom-state").dataset.zoomed = range ? "1" : "0";
  $("zoom-state").textContent = range
    ? `steps ${Math.max(0, Math.floor(range[0]))}–${Math.ceil(range[1])} (re-queried at this zoom)`
    : "all steps · drag on a chart to zoom every chart";
  $("zoom-reset").hidden = !range;
}

function chosen() {
  return [...document.querySelectorAll("#pick input:checked")].map((i) => i.value);
}

function remember() {
  history.replaceState(null, "", `/compare${query({ runs: runs.join(","), names: chosen().join(",") })}`);
}

function sync() {
  const want = chosen();
  for (const [name, chart] of charts) {
    if (!want.includes(name)) {
      zoom.remove(chart);
      chart.el.parentElement.remove();
      charts.delete(name);
    }
  }
  const jobs = [];
  for (const name of want) {
    if (charts.has(name)) continue;
    const card = el("div", "card");
    const div = el("div", "chart");
    div.dataset.metric = name;
    card.append(div);
    $("compare-charts").append(card);
    const chart = zoom.add(new FigureChart(div, `${API}/compare/figure`, { runs: runs.join(","), name }));
    charts.set(name, chart);
    jobs.push(chart.reload());
  }
  // Keep the cards in the order of the list.
  for (const name of want) $("compare-charts").append(charts.get(name).el.parentElement);
  remember();
  return Promise.all(jobs);
}

function refresh() {
  if (!zoom.range) for (const c of charts.values()) c.reloadSoon();
  setTimeout(refresh, REFRESH_MS);
}

const notFound = (err) => err instanceof ApiError && err.status === 404 && err.code === "run-not-found";

/** The chosen runs and their metrics; a run id the collector does not know (or this
 * token may not see) is left out and named, the others are drawn. */
async function loadRuns() {
  const metrics = (ids) => getJSON(`${API}/compare/metrics${query({ runs: ids.join(",") })}`);
  try {
    return { info: await metrics(runs), missing: [] };
  } catch (err) {
    if (!notFound(err)) throw err;
  }
  const missing = [];
  await Promise.all(runs.map((id) => metrics([id]).catch((err) => {
    if (!notFound(err)) throw err;
    missing.push(id);
  })));
  const found = runs.filter((id) => !missing.includes(id));
  return { info: found.length ? await metrics(found) : null, missing: runs.filter((id) => missing.includes(id)), found };
}

function showMissing(missing) {
  const box = $("compare-missing");
  box.hidden = !missing.length;
  box.textContent = missing.length
    ? `${missing.length === 1 ? "No run with id" : "No runs with ids"} ${missing.join(", ")}${runs.length ? ": showing the others" : ""}.`
    : "";
}

async function main() {
  if (!runs.length) {
    $("status").textContent = "no runs chosen: tick runs on the runs page";
    document.body.dataset.ready = "1";
    return;
  }
  let loaded;
  try {
    loaded = await loadRuns();
  } catch (err) {
    if (needsLogin(err)) {
      showLogin(err.message);
      document.body.dataset.ready = "1";
      return;
    }
    throw err;
  }
  const { info, missing, found } = loaded;
  if (found) runs = found;
  showMissing(missing);
  if (!info) {
    $("status").textContent = "none of the chosen runs exist: tick runs on the runs page";
    document.body.dataset.ready = "1";
    return;
  }
  $("compare-runs").replaceChildren(
    ...info.runs.map((r, i) => {
      const a = el("a", "run-chip", r.name);
      a.href = `/runs/${encodeURIComponent(r.id)}`;
      a.style.setProperty("--c", PALETTE[i % PALETTE.length]);
      a.title = `${r.project} · last step ${r.last_step ?? "—"}`;
      return a;
    }),
  );
  document.title = `${info.runs.map((r) => r.name).join(" vs ")} · logitwatch`;
  const asked = (params.get("names") || "").split(",").filter(Boolean);
  const names = info.metrics.map((m) => m.name);
  const initial = asked.length ? asked : DEFAULT.filter((n) => names.includes(n));
  $("pick").replaceChildren(
    ...info.metrics.map((m) => {
      const label = el("label", "pick-item");
      const box = el("input");
      box.type = "checkbox";
      box.value = m.name;
      box.checked = initial.includes(m.name);
      box.addEventListener("change", () => sync().catch(report));
      label.append(box, document.createTextNode(m.kind === "heads" ? `${m.name} (max over heads)` : m.name));
      return label;
    }),
  );
  $("zoom-reset").addEventListener("click", () => zoom.set(null).catch(report));
  await sync();
  $("status").textContent = `${info.runs.length} run${info.runs.length === 1 ? "" : "s"}`;
  document.body.dataset.ready = "1";
  setTimeout(refresh, REFRESH_MS);
}

function report(err) {
  console.warn(err);
  $("page-error").textContent = `Could not load: ${err.message}`;
  $("page-error").hidden = false;
}

main().catch((err) => {
  report(err);
  document.body.dataset.ready = "error";
});
