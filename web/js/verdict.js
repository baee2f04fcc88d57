// The run's verdict at the top of the page (healthy, warning, diverged, finished, finished
// with a paging alert still open, stopped reporting) with its first incident: the first
// alert's layer, head, rank, step and severity, and one click to its evidence. And the
// run's dot: whether the run (not the browser's connection) is reporting.

import { ago, el, lastSeen } from "./api.js";
import { headOf, whatText, whereText } from "./alert_card.js";

const WORDS = {
  healthy: "healthy",
  warning: "warning",
  diverged: "diverged",
  finished: "finished",
  // finished with a warning or critical alert still open: the word, in the at-risk colour
  finished_alerting: "finished",
  stopped: "stopped reporting",
  empty: "no data yet",
};
//: A running run that sent nothing for this long is "quiet" (the collector's no_data rule
//: says "stopped" later, at its own threshold).
const QUIET_S = 120;

/** Fill #verdict from the collector's page data; `onShow(alert)` opens the evidence. */
export function showVerdict(data, onShow) {
  const v = data.verdict;
  const box = document.getElementById("verdict");
  box.dataset.kind = v.kind;
  const word = WORDS[v.kind] || v.kind;
  document.getElementById("verdict-word").textContent = word;
  // "diverged at step 959" -> "at step 959"; "diverged: the last loss ..." -> "the last loss ..."
  document.getElementById("verdict-text").textContent = v.text.startsWith(word) ? v.text.slice(word.length).replace(/^[\s:,]+/, "") : v.text;
  const inc = data.incidents?.[0];
  const cause = inc && data.alerts.find((a) => a.id === inc.cause);
  const box2 = document.getElementById("incident");
  box2.hidden = !cause;
  if (!cause) {
    document.getElementById("incident-none").textContent = v.detail;
    return;
  }
  document.getElementById("incident-none").textContent = "";
  box2.dataset.severity = cause.severity;
  box2.dataset.alertId = String(cause.id);
  const at = headOf(cause);
  const facts = document.getElementById("incident-facts");
  const parts = [
    ["sev", cause.severity],
    ["layer", at ? `layer ${at[0]}` : whereText(cause)],
    ["head", at ? `head ${at[1]}` : ""],
    ["rank", `rank ${cause.rank}`],
    ["step", `step ${cause.fired_step}`],
  ].filter(([, t]) => t);
  facts.replaceChildren(
    ...parts.map(([k, t]) => {
      const s = el("span", k === "sev" ? `sev ${cause.severity}` : `fact ${k}`, t);
      s.dataset.fact = k;
      return s;
    }),
  );
  if (cause.paged_step != null && cause.paged_step !== cause.fired_step) {
    facts.append(el("span", "fact paged", `${cause.severity} since step ${cause.paged_step}`));
  }
  const more = data.incidents.length > 1 ? ` · ${data.incidents.length} incidents` : "";
  const n = inc.members.length;
  document.getElementById("incident-what").textContent = `${cause.rule}: ${whatText(cause)}`;
  document.getElementById("incident-count").textContent = `${n} alert${n > 1 ? "s" : ""} in this incident${more}`;
  const show = document.getElementById("incident-show");
  show.onclick = () => onShow(cause);
}

/** The run's dot: live (a frame lately), quiet, finished, stopped; from the run itself. */
export function showRunState(run, lastTime) {
  const dot = document.getElementById("conn");
  const t = lastTime ?? lastSeen(run);
  const since = t == null ? Infinity : Date.now() / 1000 - t;
  let state;
  let text;
  if (run.last_step == null) [state, text] = ["quiet", "no frame yet"];
  else if (run.ended_at != null) [state, text] = ["ended", `ended at step ${run.end_step ?? run.last_step}, ${ago(run.ended_at)}`];
  else if (run.status === "stopped") [state, text] = ["stopped", `stopped reporting: last frame ${ago(t)}`];
  else if (since <= QUIET_S) [state, text] = ["live", `reporting · last frame ${ago(t)}`];
  else [state, text] = ["quiet", `no frame for ${ago(t).replace(" ago", "")}`];
  dot.dataset.state = state;
  dot.textContent = text;
  dot.title = "the run's own state: its last frame, or how it ended (not this page's connection)";
}
