// The run page: the verdict and its first incident at the top; then the per-head view
// (layer x head heatmap, worst heads, heads over steps, one head's series); then the
// training charts (loss, grad norm, lr, clip rate, final hidden RMS, log Z, ...) with the
// monitor's own series folded away; the incidents panel; a zoom shared by the step charts
// that re-queries the server; a rank selector; the view kept in the address; live updates.

import { AlertsPanel } from "./alerts.js";
import { headOf } from "./alert_card.js";
import { API, ApiError, el, getJSON, throttle } from "./api.js";
import { HeatmapChart, LineChart, StepHeatmapChart, ZoomSync, gradNormPoints, scalarPoints } from "./charts.js";
import { loadWorst } from "./heads.js";
import { alertActions } from "./inbox_actions.js";
import { LiveStream } from "./live.js";
import { needsLogin, showLogin } from "./login.js";
import { smoothControl } from "./smooth.js";
import { readState, writeState } from "./state.js";
import { showRunState, showVerdict } from "./verdict.js";

const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const base = `${API}/runs/${encodeURIComponent(runId)}`;
const pageData = `${API}/dashboard/runs/${encodeURIComponent(runId)}`;
const $ = (id) => document.getElementById(id);
const t0 = performance.now();

// Scalars drawn by the fixed charts, and the names a job may log its clip rate under.
const CLIP_RATE = ["grad.clip_rate", "clip_rate"];
const FIXED = new Set(["loss", "grad.norm", "grad.clipped", ...CLIP_RATE]);
// The charts after loss and grad norm, in this order when present; then any other scalar.
const KNOWN = ["lr", "clip_rate", "final.hidden_rms", "final.logz", "final.logit_max"];
// The monitor's own series (its cost, bytes, sampling, constants): folded away.
const MONITOR = (n) => n.startsWith("hooks.") || ["attn.dtype_max", "grad.max_norm", "loss.first_over_ln_vocab"].includes(n);
// Charts the log-scale toggle applies to.
const LOG_Y = (n) => n === "loss" || n === "grad.norm" || n.includes("logit") || n.endsWith("_norm");
const DEFAULT_STAT = "attn.logit_max";
const WORST_EVERY_MS = 3000;

const state = readState();
const zoom = new ZoomSync((range) => {
  showZoom(range);
  state.zoom = range;
  writeState(state);
});
const rankParams = () => ({ rank: state.rank || null });
const charts = {
  loss: zoom.add(new LineChart($("loss"), `${base}/figures/loss`, scalarPoints("loss"), { params: rankParams() })),
  gradNorm: zoom.add(new LineChart($("grad_norm"), `${base}/figures/grad_norm`, gradNormPoints, { params: rankParams() })),
  heatmap: new HeatmapChart($("heatmap"), `${base}/figures/heatmap`, { name: DEFAULT_STAT, ...rankParams(), color: state.color }),
  headsTime: zoom.add(new StepHeatmapChart($("heads_time"), `${base}/figures/heads_time`, { name: DEFAULT_STAT, ...rankParams(), color: state.color })),
};
charts.loss.logY = charts.gradNorm.logY = state.log;
charts.loss.smooth = charts.gradNorm.smooth = state.smooth;
const scalarCharts = new Map(); // metric name (or "clip_rate") -> LineChart
const monitorCharts = new Map(); // drawn once the fold is opened
let drill = null; // the single head's chart, when open
let stream = null;
const panel = new AlertsPanel($("alerts"), $("alerts-count"), {
  tabs: $("alerts-tabs"),
  onShow: showAlert,
  actions: alertActions(base, (a) => panel.upsert(a)),
});

let run = null;
let metrics = new Map(); // name -> {kind, layers, heads}
let lastStep = -Infinity; // newest step on the page
let lastTime = null; // newest frame's arrival (unix seconds)
let livePoints = 0; // steps that arrived through the stream (read by the browser tests)

function showRun(r) {
  run = r;
  $("run-name").textContent = r.name;
  $("run-project").textContent = r.project;
  document.title = `${r.name} · logitwatch`;
  $("compare-link").href = `/?compare=${encodeURIComponent(r.id)}`;
  $("run-step").textContent = r.last_step == null ? "no steps yet" : `step ${Math.max(r.last_step, lastStep)}`;
  showRunState(r, lastTime);
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

function makeChart(name, into) {
  const [card, div] = chartCard(name === "clip_rate" ? "clip_rate" : `chart-${name}`, name);
  into.append(card);
  const chart = name === "clip_rate"
    ? new LineChart(div, `${base}/figures/clip_rate`, null, { params: rankParams() })
    : new LineChart(div, `${base}/figures/series`, scalarPoints(name), { params: { name, ...rankParams() } });
  chart.logY = state.log && LOG_Y(name);
  chart.smooth = state.smooth;
  return zoom.add(chart);
}

/** Whether the run sent any attention statistic (an attn.* per-head metric). */
function hasAttention(list) {
  return list.some((m) => m.kind === "heads" && m.name.startsWith("attn."));
}

/** Take the run's metric list; add charts, statistics and layers that are new. */
function discover(list) {
  metrics = new Map(list.map((m) => [m.name, m]));
  panel.setAttention(hasAttention(list));
  const scalars = new Set(list.filter((m) => m.kind === "scalar").map((m) => m.name));
  const added = [];
  const monitor = $("monitor");
  for (const name of scalarOrder(scalars)) {
    if (scalarCharts.has(name) || monitorCharts.has(name)) continue;
    if (MONITOR(name)) {
      monitorCharts.set(name, null);
      continue;
    }
    const chart = makeChart(name, $("more-charts"));
    scalarCharts.set(name, chart);
    added.push(chart.reload());
  }
  monitor.hidden = monitorCharts.size === 0;
  $("monitor-count").textContent = `(${monitorCharts.size}: cost, bytes, sampling, dtype limit)`;
  if (monitor.open) openMonitor();
  fillStatistics();
  return Promise.all(added);
}

function openMonitor() {
  for (const [name, chart] of monitorCharts) {
    if (chart) continue;
    const c = makeChart(name, $("monitor-charts"));
    monitorCharts.set(name, c);
    c.reload().catch(report);
  }
}

function fillStatistics() {
  const heads = [...metrics.values()].filter((m) => m.kind === "heads").map((m) => m.name).sort();
  const select = $("stat");
  const stat = charts.heatmap.params.name;
  if (heads.length && !heads.includes(stat)) {
    const want = state.stat && heads.includes(state.stat) ? state.stat : heads.includes(DEFAULT_STAT) ? DEFAULT_STAT : heads[0];
    setStatParams(want);
  }
  if ([...select.options].map((o) => o.value).join() !== heads.join()) {
    select.replaceChildren(...heads.map((n) => new Option(n, n, false, n === charts.heatmap.params.name)));
  }
  select.value = charts.heatmap.params.name;
  select.disabled = heads.length === 0;
  const layers = metrics.get(charts.heatmap.params.name)?.layers || 0;
  const layerSelect = $("layer");
  if (layerSelect.options.length !== layers + 1) {
    const keep = layerSelect.value || (state.layer != null ? String(state.layer) : "");
    const opts = [new Option("every layer (max over its heads)", "")];
    for (let i = 0; i < layers; i++) opts.push(new Option(`layer ${i}, every head`, String(i)));
    layerSelect.replaceChildren(...opts);
    layerSelect.value = keep && Number(keep) < layers ? keep : "";
    charts.headsTime.params.layer = layerSelect.value === "" ? null : Number(layerSelect.value);
  }
}

function setStatParams(name) {
  state.stat = name;
  charts.heatmap.params.name = name;
  charts.headsTime.params.name = name;
  if (drill) {
    drill.params.name = name;
    drill.logY = state.log && LOG_Y(name);
  }
  writeState(state);
}

function setStat(name) {
  if (name === charts.heatmap.params.name) return Promise.resolve();
  setStatParams(name);
  $("stat").value = name;
  const jobs = [charts.heatmap.setMetric(name), charts.headsTime.reload(), refreshWorst()];
  if (drill) jobs.push(drill.reload());
  return Promise.all(jobs);
}

function setLayer(layer) {
  $("layer").value = layer == null ? "" : String(layer);
  charts.headsTime.params.layer = layer;
  state.layer = layer;
  writeState(state);
  return charts.headsTime.reload();
}

// --- worst heads, rank ------------------------------------------------------------------------

function refreshWorst() {
  return loadWorst(base, { name: charts.heatmap.params.name, rank: state.rank || null }, openHead);
}
const refreshWorstSoon = throttle(() => refreshWorst().catch(report), WORST_EVERY_MS);

function lineCharts() {
  return [charts.loss, charts.gradNorm, ...scalarCharts.values(), ...[...monitorCharts.values()].filter(Boolean), ...(drill ? [drill] : [])];
}

function allCharts() {
  return [charts.loss, charts.gradNorm, charts.heatmap, charts.headsTime, ...scalarCharts.values(), ...[...monitorCharts.values()].filter(Boolean), ...(drill ? [drill] : [])];
}

function setRank(rank) {
  if (rank === state.rank) return Promise.resolve();
  state.rank = rank;
  $("rank").value = String(rank);
  writeState(state);
  for (const c of allCharts()) c.params.rank = rank || null;
  charts.heatmap.step = null;
  startStream(Number(run?.last_frame_id) || 0);
  return Promise.all([...allCharts().map((c) => c.reload()), refreshWorst()]);
}

function fillRanks(ranks) {
  const select = $("rank");
  if ([...select.options].map((o) => o.value).join() !== ranks.join()) {
    select.replaceChildren(...ranks.map((r) => new Option(String(r), String(r))));
  }
  select.value = String(state.rank);
  $("rank-label").hidden = ranks.length < 2 && state.rank === 0;
}

// --- drill-down to one head ---------------------------------------------------------------

function openHead(layer, head) {
  const stat = charts.heatmap.params.name;
  $("drill-card").hidden = false;
  $("drill-title").textContent = `${stat} · layer ${layer} · head ${head} · rank ${state.rank} (grey: max over all heads)`;
  const params = { name: stat, layer, head, ...rankParams() };
  if (!drill) {
    drill = zoom.add(new LineChart($("drill"), `${base}/figures/series`, null, { params }));
  } else {
    drill.params = params;
  }
  drill.logY = state.log && LOG_Y(stat);
  drill.smooth = state.smooth;
  state.head = [layer, head];
  writeState(state);
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
  state.head = null;
  writeState(state);
});

// --- alerts --------------------------------------------------------------------------------

/** Everything about one alert: its rank, statistic, head, layer over steps, and its steps. */
async function showAlert(a) {
  const jobs = [];
  if (a.rank !== state.rank) await setRank(a.rank);
  if (metrics.get(a.metric)?.kind === "heads" && a.metric !== charts.heatmap.params.name) jobs.push(setStat(a.metric));
  const at = headOf(a);
  if (at) {
    jobs.push(setLayer(at[0]));
    jobs.push(openHead(at[0], at[1]));
  }
  const from = a.started_step > 0 ? a.started_step : Math.max(0, a.fired_step - 200);
  const end = Math.max(a.resolved_step ?? a.fired_step, a.evidence?.last_breach_step ?? 0);
  const pad = Math.max(50, (a.fired_step - from) * 2);
  jobs.push(zoom.set([Math.max(0, from - pad), end + pad]));
  (at ? $("drill-card") : $("charts")).scrollIntoView({ block: "start", behavior: "instant" });
  await Promise.all(jobs);
}

let summaryBusy = false;
async function refreshSummary() {
  if (summaryBusy) return;
  summaryBusy = true;
  try {
    const data = await getJSON(pageData);
    showRun(data.run);
    showVerdict(data, showAlert);
    panel.setIncidents(data.incidents, data.alerts);
    fillRanks(data.ranks);
  } finally {
    summaryBusy = false;
  }
}
const refreshSummarySoon = throttle(() => refreshSummary().catch(report), 1000);

function onAlert(alert) {
  // A new or changed alert: redraw the charts so that its marker and span show.
  if (panel.upsert(alert)) {
    refreshSummarySoon();
    for (const c of [charts.loss, charts.gradNorm, ...scalarCharts.values()]) c.reload().catch(report);
    charts.headsTime.reload().catch(report);
    charts.heatmap.reload().catch(report);
    if (drill) drill.reload().catch(report);
    refreshWorstSoon();
  }
}

// --- live ----------------------------------------------------------------------------------

let discovering = null;

function onFrame({ frames, latest }) {
  const fresh = frames.filter((f) => f.step > lastStep);
  charts.loss.extend(frames);
  charts.gradNorm.extend(frames);
  for (const c of scalarCharts.values()) c.extend(frames);
  for (const c of monitorCharts.values()) if (c) c.extend(frames);
  if (latest) charts.heatmap.update(latest);
  const unknown =
    frames.some((f) => Object.keys(f.scalars || {}).some((n) => !metrics.has(n))) ||
    Object.keys(latest || {}).some((n) => n !== "step" && !metrics.has(n));
  if (unknown && !discovering) {
    discovering = getJSON(`${base}/metrics`)
      .then(discover)
      .then(() => Promise.all([charts.headsTime.reload(), refreshWorst()]))
      .catch(report)
      .finally(() => (discovering = null));
  }
  if (!fresh.length) return;
  if (!zoom.range) charts.headsTime.reloadSoon();
  if (drill) drill.extend(fresh);
  refreshWorstSoon();
  lastStep = fresh[fresh.length - 1].step;
  lastTime = Date.now() / 1000;
  livePoints += fresh.length;
  document.body.dataset.livePoints = String(livePoints);
  $("run-step").textContent = `step ${lastStep}`;
  if (run) showRunState({ ...run, last_step: lastStep, ended_at: null, status: run.status === "stopped" ? "running" : run.status }, lastTime);
}

function startStream(after) {
  if (stream) stream.stop();
  const onEnd = (body) => report(new ApiError(0, body.code, body.message));
  const url = state.rank ? `${base}/stream?rank=${state.rank}` : `${base}/stream`;
  stream = new LiveStream(url, { onFrame, onAlert, onEnd, indicator: $("stream") });
  stream.start(after);
}

function report(err) {
  console.warn(err);
  $("page-error").textContent = `Could not load: ${err.message}`;
  $("page-error").hidden = false;
}

// --- start ---------------------------------------------------------------------------------

$("stat").addEventListener("change", (e) => setStat(e.target.value).catch(report));
$("layer").addEventListener("change", (e) => setLayer(e.target.value === "" ? null : Number(e.target.value)).catch(report));
$("rank").addEventListener("change", (e) => setRank(Number(e.target.value)).catch(report));
$("zoom-reset").addEventListener("click", () => zoom.set(null).catch(report));
$("monitor").addEventListener("toggle", () => $("monitor").open && openMonitor());
$("color").value = state.color;
$("color").addEventListener("change", (e) => {
  state.color = e.target.value;
  writeState(state);
  charts.heatmap.params.color = charts.headsTime.params.color = state.color;
  Promise.all([charts.heatmap.reload(), charts.headsTime.reload()]).catch(report);
});
smoothControl({ select: $("smooth"), range: $("smooth-amount"), box: $("smooth-amount-label"), value: $("smooth-value") }, state.smooth, (s) => {
  state.smooth = s;
  writeState(state);
  Promise.all(lineCharts().map((c) => c.setSmooth(s))).catch(report);
});
$("log-y").checked = state.log;
$("log-y").addEventListener("change", (e) => {
  state.log = e.target.checked;
  writeState(state);
  const named = [[charts.loss, "loss"], [charts.gradNorm, "grad.norm"], ...[...scalarCharts].map(([n, c]) => [c, n])];
  if (drill) named.push([drill, drill.params.name]);
  Promise.all(named.filter(([, n]) => LOG_Y(n)).map(([c]) => c.setLogY(state.log))).catch(report);
});

function onHeatmapClick(ev) {
  const p = ev?.points?.[0];
  if (p && Number.isInteger(p.x) && Number.isInteger(p.y)) openHead(p.y, p.x);
}

function onHeadsTimeClick(ev) {
  const p = ev?.points?.[0];
  const layer = charts.headsTime.params.layer;
  if (!p || !Number.isInteger(p.y)) return;
  if (layer == null) setLayer(p.y).catch(report); // a layer's row: show that layer's heads
  else openHead(layer, p.y);
}

function notFound(text) {
  $("run-name").textContent = text;
  $("verdict-word").textContent = "not found";
  $("verdict").dataset.kind = "empty";
  $("incident-none").textContent = "";
  const help = el("span", "meta");
  const link = el("a", null, "every run");
  link.href = "/";
  const inbox = el("a", null, "alerts across runs");
  inbox.href = "/alerts";
  help.append("see ", link, " or ", inbox);
  $("verdict-text").replaceChildren(help);
  $("stream").textContent = "offline";
  $("stream").dataset.state = "offline";
  document.body.dataset.ready = "1";
}

async function main() {
  let data;
  try {
    data = await getJSON(pageData);
  } catch (err) {
    if (needsLogin(err)) {
      $("run-name").textContent = "log in to see this run";
      $("stream").textContent = "offline";
      $("stream").dataset.state = "offline";
      showLogin(err.message);
      document.body.dataset.ready = "1";
      return;
    }
    if (err instanceof ApiError && err.status === 404) return notFound(`run ${runId} not found`);
    throw err;
  }
  if (!data.ranks.includes(state.rank)) state.rank = data.ranks[0] ?? 0;
  for (const c of [charts.loss, charts.gradNorm, charts.heatmap, charts.headsTime]) c.params.rank = state.rank || null;
  showRun(data.run);
  showVerdict(data, showAlert);
  panel.attention = hasAttention(data.metrics);
  panel.setIncidents(data.incidents, data.alerts);
  fillRanks(data.ranks);
  document.body.dataset.verdictMs = String(Math.round(performance.now() - t0));
  if (state.zoom) {
    zoom.range = state.zoom;
    for (const c of zoom.charts) c.range = state.zoom;
    showZoom(state.zoom);
  }
  const jobs = [discover(data.metrics)];
  jobs.push(charts.heatmap.reload(), charts.headsTime.reload(), refreshWorst(), charts.loss.reload(), charts.gradNorm.reload());
  if (state.head) jobs.push(openHead(...state.head));
  await Promise.all(jobs);
  charts.heatmap.el.on("plotly_click", onHeatmapClick);
  charts.headsTime.el.on("plotly_click", onHeadsTimeClick);
  lastStep = Math.max(data.run.last_step ?? -Infinity, charts.loss.lastStep, charts.gradNorm.lastStep, charts.heatmap.step ?? -Infinity);
  document.body.dataset.livePoints = "0";
  document.body.dataset.readyMs = String(Math.round(performance.now() - t0));
  document.body.dataset.ready = "1";
  // The stream replays frames after `after`; the charts skip the steps already drawn.
  startStream(Number(data.run.last_frame_id) || 0);
  setInterval(() => refreshSummary().catch((e) => console.warn(e)), 15000);
  setInterval(() => run && showRunState(run, lastTime), 5000);
}

main().catch((err) => {
  report(err);
  document.body.dataset.ready = "error";
});
