// The run page: every scalar the run logs as a chart (loss, grad norm with clipped steps,
// lr, clip rate, final hidden RMS, log Z, ...), per-head summaries (layer x head heatmap,
// heatmap over steps, worst heads now) with a drill-down to one head, the alerts inbox, a
// zoom shared by the step charts that re-queries the server, and live updates over SSE.

import { AlertsPanel } from "./alerts.js";
import { API, ApiError, ago, el, getJSON, query, sparkline, wireText } from "./api.js";
import { HeatmapChart, LineChart, StepHeatmapChart, ZoomSync, gradNormPoints, scalarPoints } from "./charts.js";
import { alertActions } from "./inbox_actions.js";
import { LiveStream } from "./live.js";
import { needsLogin, showLogin } from "./login.js";

const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const base = `${API}/runs/${encodeURIComponent(runId)}`;
const $ = (id) => document.getElementById(id);

// Scalars drawn by the fixed charts, and the names a job may log its clip rate under.
const CLIP_RATE = ["grad.clip_rate", "clip_rate"];
const FIXED = new Set(["loss", "grad.norm", "grad.clipped", ...CLIP_RATE]);
// The charts after loss and grad norm, in this order when present; then any other scalar.
const KNOWN = ["lr", "clip_rate", "final.hidden_rms", "final.logz", "final.logit_max"];
const DEFAULT_STAT = "attn.logit_max";
const WORST_EVERY_MS = 3000;

const zoom = new ZoomSync(showZoom);
const charts = {
  loss: zoom.add(new LineChart($("loss"), `${base}/figures/loss`, scalarPoints("loss"))),
  gradNorm: zoom.add(new LineChart($("grad_norm"), `${base}/figures/grad_norm`, gradNormPoints)),
  heatmap: new HeatmapChart($("heatmap"), `${base}/figures/heatmap`, { name: DEFAULT_STAT }),
  headsTime: zoom.add(new StepHeatmapChart($("heads_time"), `${base}/figures/heads_time`, { name: DEFAULT_STAT })),
};
const scalarCharts = new Map(); // metric name (or "clip_rate") -> LineChart
let drill = null; // the single head's chart, when open
const panel = new AlertsPanel($("alerts"), $("alerts-count"), {
  tabs: $("alerts-tabs"),
  onShow: showAlert,
  actions: alertActions(base, (a) => panel.upsert(a)),
});

let metrics = new Map(); // name -> {kind, layers, heads}
let lastStep = -Infinity; // newest step on the page
let livePoints = 0; // steps that arrived through the stream (read by the browser tests)
let stat = DEFAULT_STAT;

function showRun(run) {
  $("run-name").textContent = run.name;
  $("run-project").textContent = run.project;
  document.title = `${run.name} · logitwatch`;
  $("compare-link").href = `/?compare=${encodeURIComponent(run.id)}`;
  showStep(run.last_step, run.last_time);
}

function showStep(step, time) {
  $("run-step").textContent = step == null ? "no steps yet" : `step ${step}`;
  if (time != null) $("run-seen").textContent = `last frame ${ago(time)}`;
}

function showZoom(range) {
  const label = $("zoom-state");
  label.dataset.zoomed = range ? "1" : "0";
  label.textContent = range
    ? `steps ${Math.max(0, Math.floor(range[0]))}–${Math.ceil(range[1])} (re-queried at this zoom; live points resume when you show all steps)`
    : "all steps · drag on a chart to zoom, the server sends that range at full detail";
  $("zoom-reset").hidden = !range;
}

// --- which charts: whatever the run has --------------------------------------------------

function chartCard(id, metric) {
  const card = el("div", "card");
  const div = el("div", "chart");
  div.id = id;
  div.dataset.metric = metric;
  card.append(div);
  return [card, div];
}

function scalarOrder(names) {
  const hasClip = names.has("grad.clipped") || CLIP_RATE.some((n) => names.has(n));
  const wanted = KNOWN.filter((n) => (n === "clip_rate" ? hasClip : names.has(n)));
  const rest = [...names].filter((n) => !FIXED.has(n) && !KNOWN.includes(n)).sort();
  return [...wanted, ...rest];
}

/** Read the run's metric list; add charts, statistics and layers that are new. */
async function discover() {
  const list = await getJSON(`${base}/metrics`);
  metrics = new Map(list.map((m) => [m.name, m]));
  const scalars = new Set(list.filter((m) => m.kind === "scalar").map((m) => m.name));
  const added = [];
  for (const name of scalarOrder(scalars)) {
    if (scalarCharts.has(name)) continue;
    const [card, div] = chartCard(name === "clip_rate" ? "clip_rate" : `chart-${name}`, name);
    $("more-charts").append(card);
    const chart =
      name === "clip_rate"
        ? new LineChart(div, `${base}/figures/clip_rate`, null)
        : new LineChart(div, `${base}/figures/series`, scalarPoints(name), { params: { name } });
    scalarCharts.set(name, zoom.add(chart));
    added.push(chart.reload());
  }
  fillStatistics();
  await Promise.all(added);
}

function fillStatistics() {
  const heads = [...metrics.values()].filter((m) => m.kind === "heads").map((m) => m.name).sort();
  const select = $("stat");
  const have = [...select.options].map((o) => o.value);
  if (heads.length && !heads.includes(stat)) setStat(heads.includes(DEFAULT_STAT) ? DEFAULT_STAT : heads[0]);
  if (have.join() !== heads.join()) {
    select.replaceChildren(...heads.map((n) => new Option(n, n, false, n === stat)));
  }
  select.disabled = heads.length === 0;
  const layers = metrics.get(stat)?.layers || 0;
  const layerSelect = $("layer");
  if (layerSelect.options.length !== layers + 1) {
    const keep = layerSelect.value;
    const opts = [new Option("every layer (max over its heads)", "")];
    for (let i = 0; i < layers; i++) opts.push(new Option(`layer ${i}, every head`, String(i)));
    layerSelect.replaceChildren(...opts);
    layerSelect.value = keep && Number(keep) < layers ? keep : "";
  }
}

function setStat(name) {
  if (name === stat) return Promise.resolve();
  stat = name;
  $("stat").value = name;
  charts.headsTime.params.name = name;
  const jobs = [charts.heatmap.setMetric(name), charts.headsTime.reload(), loadWorst()];
  if (drill) {
    drill.params.name = name;
    jobs.push(drill.reload());
  }
  return Promise.all(jobs);
}

// --- worst heads now -------------------------------------------------------------------------

let worstAt = 0;
let worstTimer = null;

async function loadWorst() {
  worstAt = Date.now();
  const w = await getJSON(`${base}/worst_heads${query({ name: stat, k: 10 })}`);
  const body = $("worst").querySelector("tbody");
  $("worst-sub").textContent = w.step == null
    ? `no ${w.name} yet`
    : `${w.order} ${w.name} at step ${w.step} · median of ${w.layers * w.heads} heads ${wireText(w.median, 3)}`;
  body.replaceChildren(
    ...w.rows.map((r) => {
      const tr = el("tr");
      tr.dataset.layer = String(r.layer);
      tr.dataset.head = String(r.head);
      if (r.alert) tr.dataset.alert = r.alert;
      const trend = el("td", "trend");
      trend.append(sparkline(r.trend_steps, r.trend_values, { width: 110, height: 22 }));
      const badge = el("td");
      if (r.alert) badge.append(el("span", `badge ${r.alert}`, r.alert));
      const change = r.change == null ? "—" : (r.change > 0 ? "+" : "") + wireText(r.change, 3);
      tr.append(
        el("td", "num", r.layer),
        el("td", "num", r.head),
        el("td", "num strong", wireText(r.value, 4)),
        el("td", "num", change),
        el("td", "num", r.ratio_to_median == null ? "—" : `${wireText(r.ratio_to_median, 3)}×`),
        trend,
        badge,
      );
      tr.title = `open layer ${r.layer}, head ${r.head}`;
      tr.addEventListener("click", () => openHead(r.layer, r.head));
      return tr;
    }),
  );
  $("worst").dataset.rows = String(w.rows.length);
}

function loadWorstSoon() {
  if (worstTimer) return;
  worstTimer = setTimeout(() => {
    worstTimer = null;
    loadWorst().catch(report);
  }, Math.max(0, worstAt + WORST_EVERY_MS - Date.now()));
}

// --- drill-down to one head ---------------------------------------------------------------

function openHead(layer, head) {
  $("drill-card").hidden = false;
  $("drill-title").textContent = `${stat} · layer ${layer} · head ${head} (grey: max over all heads)`;
  const params = { name: stat, layer, head };
  if (!drill) {
    drill = zoom.add(new LineChart($("drill"), `${base}/figures/series`, null, { params }));
  } else {
    drill.params = params;
  }
  $("drill").dataset.layer = String(layer);
  $("drill").dataset.head = String(head);
  const job = drill.reload().catch(report);
  $("drill-card").scrollIntoView({ block: "nearest" });
  return job;
}

$("drill-close").addEventListener("click", () => {
  $("drill-card").hidden = true;
  if (drill) zoom.remove(drill);
  Plotly.purge($("drill")); // eslint-disable-line no-undef
  drill = null;
});

// --- alerts --------------------------------------------------------------------------------

function lineCharts() {
  return [charts.loss, charts.gradNorm, ...scalarCharts.values()];
}

async function showAlert(a) {
  const pad = Math.max(50, (a.fired_step - a.started_step) * 2);
  const end = a.resolved_step ?? a.fired_step;
  const jobs = [];
  if (metrics.get(a.metric)?.kind === "heads" && a.metric !== stat) jobs.push(setStat(a.metric));
  if (a.layer != null && a.head != null) {
    $("layer").value = String(a.layer);
    charts.headsTime.params.layer = a.layer;
    jobs.push(openHead(a.layer, a.head));
  }
  jobs.push(zoom.set([Math.max(0, a.started_step - pad), end + pad]));
  await Promise.all(jobs);
}

function onAlert(alert) {
  // A new or changed alert: redraw the charts so that its marker and span show.
  if (panel.upsert(alert)) {
    for (const c of lineCharts()) c.reload().catch(report);
    charts.headsTime.reload().catch(report);
    charts.heatmap.reload().catch(report);
    if (drill) drill.reload().catch(report);
    loadWorstSoon();
  }
}

// --- live ----------------------------------------------------------------------------------

let discovering = null;

function onFrame({ frames, latest }) {
  const fresh = frames.filter((f) => f.step > lastStep);
  charts.loss.extend(frames);
  charts.gradNorm.extend(frames);
  for (const c of scalarCharts.values()) c.extend(frames);
  if (latest) charts.heatmap.update(latest);
  const unknown =
    frames.some((f) => Object.keys(f.scalars || {}).some((n) => !metrics.has(n))) ||
    Object.keys(latest || {}).some((n) => n !== "step" && !metrics.has(n));
  if (unknown && !discovering) {
    discovering = discover()
      .then(() => Promise.all([charts.headsTime.reload(), loadWorst()]))
      .catch(report)
      .finally(() => (discovering = null));
  }
  if (!fresh.length) return;
  if (!zoom.range) charts.headsTime.reloadSoon();
  if (drill) drill.extend(fresh);
  loadWorstSoon();
  lastStep = fresh[fresh.length - 1].step;
  livePoints += fresh.length;
  document.body.dataset.livePoints = String(livePoints);
  showStep(lastStep, Date.now() / 1000);
}

function report(err) {
  console.warn(err);
  $("page-error").textContent = `Could not load: ${err.message}`;
  $("page-error").hidden = false;
}

// --- start ---------------------------------------------------------------------------------

$("stat").addEventListener("change", (e) => setStat(e.target.value).catch(report));
$("layer").addEventListener("change", (e) => {
  charts.headsTime.params.layer = e.target.value === "" ? null : Number(e.target.value);
  charts.headsTime.reload().catch(report);
});
$("zoom-reset").addEventListener("click", () => zoom.set(null).catch(report));

function onHeatmapClick(ev) {
  const p = ev?.points?.[0];
  if (p && Number.isInteger(p.x) && Number.isInteger(p.y)) openHead(p.y, p.x);
}

function onHeadsTimeClick(ev) {
  const p = ev?.points?.[0];
  const layer = charts.headsTime.params.layer;
  if (!p || !Number.isInteger(p.y)) return;
  if (layer == null) {
    // A layer's row: show that layer's heads.
    $("layer").value = String(p.y);
    charts.headsTime.params.layer = p.y;
    charts.headsTime.reload().catch(report);
  } else {
    openHead(layer, p.y);
  }
}

async function main() {
  let run;
  try {
    run = await getJSON(base);
  } catch (err) {
    if (needsLogin(err)) {
      $("run-name").textContent = "log in to see this run";
      $("conn").textContent = "offline";
      $("conn").dataset.state = "offline";
      showLogin(err.message);
      document.body.dataset.ready = "1";
      return;
    }
    if (err instanceof ApiError && err.status === 404) {
      $("run-name").textContent = `run ${runId} not found`;
      $("conn").textContent = "offline";
      $("conn").dataset.state = "offline";
      document.body.dataset.ready = "1";
      return;
    }
    throw err;
  }
  showRun(run);
  await discover();
  const [alerts] = await Promise.all([
    getJSON(`${base}/alerts`),
    charts.loss.reload(),
    charts.gradNorm.reload(),
    charts.heatmap.reload(),
    charts.headsTime.reload(),
    loadWorst(),
  ]);
  charts.heatmap.el.on("plotly_click", onHeatmapClick);
  charts.headsTime.el.on("plotly_click", onHeadsTimeClick);
  panel.upsert(...alerts);
  panel.render();
  lastStep = Math.max(
    run.last_step ?? -Infinity,
    charts.loss.lastStep,
    charts.gradNorm.lastStep,
    charts.heatmap.step ?? -Infinity,
  );
  document.body.dataset.livePoints = "0";
  document.body.dataset.ready = "1";
  // The stream replays frames after `after`; the charts skip the steps already drawn.
  const onEnd = (body) => report(new ApiError(0, body.code, body.message));
  new LiveStream(`${base}/stream`, { onFrame, onAlert, onEnd, indicator: $("conn") }).start(
    Number(run.last_frame_id) || 0,
  );
}

main().catch((err) => {
  report(err);
  document.body.dataset.ready = "error";
});
