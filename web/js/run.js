// The run page: loss, gradient norm and layer x head charts, the alerts panel, live updates.

import { AlertsPanel } from "./alerts.js";
import { API, ApiError, ago, getJSON } from "./api.js";
import { HeatmapChart, LineChart, gradNormPoints, scalarPoints } from "./charts.js";
import { LiveStream } from "./live.js";
import { needsLogin, showLogin } from "./login.js";

const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const base = `${API}/runs/${encodeURIComponent(runId)}`;
const $ = (id) => document.getElementById(id);

const charts = {
  loss: new LineChart($("loss"), `${base}/figures/loss`, scalarPoints("loss")),
  gradNorm: new LineChart($("grad_norm"), `${base}/figures/grad_norm`, gradNormPoints),
  heatmap: new HeatmapChart($("heatmap"), `${base}/figures/heatmap`),
};
const panel = new AlertsPanel($("alerts"), $("alerts-count"));

let lastStep = -Infinity; // newest step on the page
let livePoints = 0; // steps that arrived through the stream (read by the browser tests)

function showRun(run) {
  $("run-name").textContent = run.name;
  $("run-project").textContent = run.project;
  document.title = `${run.name} · logitwatch`;
  showStep(run.last_step, run.last_time);
}

function showStep(step, time) {
  $("run-step").textContent = step == null ? "no steps yet" : `step ${step}`;
  if (time != null) $("run-seen").textContent = `last frame ${ago(time)}`;
}

function onFrame({ frames, latest }) {
  const fresh = frames.filter((f) => f.step > lastStep);
  charts.loss.extend(frames);
  charts.gradNorm.extend(frames);
  if (latest) charts.heatmap.update(latest);
  if (!fresh.length) return;
  lastStep = fresh[fresh.length - 1].step;
  livePoints += fresh.length;
  document.body.dataset.livePoints = String(livePoints);
  showStep(lastStep, Date.now() / 1000);
}

function onAlert(alert) {
  // A new or changed alert: redraw the line charts so that its marker and span show.
  if (panel.upsert(alert)) {
    charts.loss.reload().catch(report);
    charts.gradNorm.reload().catch(report);
  }
}

function report(err) {
  console.warn(err);
  $("page-error").textContent = `Could not load: ${err.message}`;
  $("page-error").hidden = false;
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
  const [alerts] = await Promise.all([
    getJSON(`${base}/alerts`),
    charts.loss.reload(),
    charts.gradNorm.reload(),
    charts.heatmap.reload(),
  ]);
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
