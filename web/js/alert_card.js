// One alert as a card: where and how severe, what it showed when it fired, what it shows now
// (its latest breach), flapping, paging, evidence and remedies. Every number is labelled
// with the step it belongs to, so the text and the numbers never disagree. Text only via
// textContent.

import { el, wireText } from "./api.js";

/** "layer 1 · heads 0, 1, 2, 3", "max over heads: layer 1 · head 3", or "run". */
export function whereText(a) {
  const layer = firedLayer(a);
  if (layer == null) return "run";
  const heads = firedHeads(a);
  if (a.layer == null) return heads.length ? `max over heads: layer ${layer} · head ${heads[0]}` : `max over heads: layer ${layer}`;
  if (!heads.length) return `layer ${layer}`;
  return heads.length === 1 ? `layer ${layer} · head ${heads[0]}` : `layer ${layer} · heads ${heads.join(", ")}`;
}

/** The layer an alert fired on (the collector's `fired_layer`: its layer, or the max's). */
export function firedLayer(a) {
  if (a.fired_layer != null) return a.fired_layer;
  if (a.layer != null) return a.layer;
  return Number.isInteger(a.evidence?.at_layer) && Number.isInteger(a.evidence?.at_head) ? a.evidence.at_layer : null;
}

/** The heads an alert fired on, from the collector's `fired_heads` (kept when it fired;
 * `heads` grows as more heads breach while it is open). */
export function firedHeads(a) {
  if (Array.isArray(a.fired_heads)) return [...a.fired_heads];
  if (a.layer == null) return Number.isInteger(a.evidence?.at_head) ? [a.evidence.at_head] : [];
  const heads = a.heads?.length ? a.heads : [a.head];
  return [...new Set(heads)].filter((h) => h != null).sort((x, y) => x - y);
}

/** The (layer, head) to open for an alert: its own, or the head holding the max. */
export function headOf(a) {
  const layer = firedLayer(a);
  const heads = firedHeads(a);
  if (layer != null && heads.length) return [layer, heads[0]];
  if (a.layer != null && a.head != null) return [a.layer, a.head];
  const ev = a.evidence || {};
  if (Number.isInteger(ev.at_layer) && Number.isInteger(ev.at_head)) return [ev.at_layer, ev.at_head];
  return null;
}

/** The message without "run: rank r, layer l...: " (the card's header says where). */
export function whatText(a) {
  let m = a.message || "";
  if (a.run && m.startsWith(`${a.run}: `)) m = m.slice(a.run.length + 2);
  // "rank 0 (worst head: layer 1, head 3): " or "rank 0, layer 1, heads 0, 1: "
  return m.replace(/^rank \d+( \([^)]*\))?(, layer [^:]*)?: /, "");
}

function numbers(value, baseline, limit) {
  const parts = [`value ${wireText(value)}`];
  if (baseline != null) parts.push(`baseline ${wireText(baseline, 4)}`);
  if (limit != null) parts.push(`limit ${wireText(limit, 4)}`);
  return parts.join(" · ");
}

const SHOWN_APART = new Set(["latest", "breaches", "reopened", "last_breach_step", "params", "page", "fired_heads", "fuses"]);

export function evidenceText(v) {
  if (Array.isArray(v)) {
    const shown = v.slice(0, 12).map((x) => (typeof x === "object" && x !== null ? JSON.stringify(x) : wireText(x)));
    return shown.join(", ") + (v.length > 12 ? ` … (${v.length} values)` : "");
  }
  if (typeof v === "object" && v !== null) return JSON.stringify(v);
  return typeof v === "number" || typeof v === "string" ? (wireText(v) === "—" ? String(v) : wireText(v)) : String(v);
}

function badges(a) {
  const out = [el("span", `sev ${a.severity}`, a.severity), el("span", `badge ${a.state}`, a.state)];
  if (a.suppressed) out.push(el("span", "chip", a.suppressed));
  const all = new Set(a.heads || []);
  if (a.layer != null && all.size > firedHeads(a).length) {
    out.push(el("span", "chip", `now heads ${[...all].sort((x, y) => x - y).join(", ")}`));
  }
  const reopened = Number(a.evidence?.reopened || 0);
  if (reopened) {
    const flap = el("span", "chip flap", `flapping: reopened ${reopened}×`);
    flap.title = "it breached again within its hold this many times after firing";
    out.push(flap);
  }
  return out;
}

/** The full card. `onShow(a)` (optional) adds "show on charts"; `actions(a)` more buttons. */
export function alertCard(a, { onShow = null, actions = null } = {}) {
  const node = el("article", "alert");
  node.dataset.id = String(a.id);
  node.dataset.state = a.state;
  node.dataset.severity = a.severity;
  node.dataset.acknowledged = String(a.acked_at != null);
  const head = el("header");
  head.append(...badges(a), el("span", "where", `rank ${a.rank} · ${whereText(a)}`), el("span", "rule", a.rule));
  const step = el("span", "step", `fired at step ${a.fired_step}`);
  head.append(step);
  node.append(head);
  // the verdict before the evidence: an info alert that paged later says when and why
  // first (its message tells the firing first and the escalation last)
  if (a.paged_step != null && a.paged_step !== a.fired_step) {
    const why = a.evidence?.escalated_because;
    node.append(el("p", "facts paged", `paged (${a.severity}) at step ${a.paged_step}${why ? `: ${why}` : ""}`));
  } else if (a.paged_step == null && a.severity === "info") {
    node.append(el("p", "facts paged", "info: shown here, not paged"));
  }

  const fired = el("div", "when fired");
  fired.append(el("span", "label", `when it fired (step ${a.fired_step})`), el("p", "message", whatText(a)));
  fired.append(el("p", "facts", `${a.metric}: ${numbers(a.value, a.baseline, a.threshold)} · left its range at step ${a.started_step}`));
  node.append(fired);
  const latest = a.evidence?.latest;
  if (latest && typeof latest === "object") {
    const now = el("div", "when latest");
    const heads = latest.heads?.length ? ` · heads ${latest.heads.join(", ")}` : "";
    now.append(
      el("span", "label", `latest breach (step ${latest.step})`),
      el("p", "facts", `${a.metric}: ${numbers(latest.value, latest.baseline, latest.limit)}${heads}`),
    );
    node.append(now);
  }
  if (a.resolved_step != null) node.append(el("p", "facts", `resolved at step ${a.resolved_step}`));

  const evidence = Object.entries(a.evidence || {}).filter(([k]) => !SHOWN_APART.has(k));
  if (evidence.length) {
    const details = el("details", "evidence");
    details.append(el("summary", null, `evidence when it fired (${evidence.length})`));
    const dl = el("dl");
    for (const [k, v] of evidence) dl.append(el("dt", null, k), el("dd", null, evidenceText(v)));
    details.append(dl);
    node.append(details);
  }
  if (a.remedies?.length) {
    const details = el("details", "remedies");
    details.append(el("summary", null, `remedies (${a.remedies.length})`));
    const ol = el("ol");
    for (const r of a.remedies) ol.append(el("li", null, r));
    details.append(ol);
    node.append(details);
  }
  const row = el("div", "actions");
  if (onShow) {
    const show = el("button", "show", "show on charts");
    show.type = "button";
    show.title = "zoom the charts to this alert and open its head";
    show.addEventListener("click", () => onShow(a));
    row.append(show);
  }
  if (actions) row.append(...actions(a));
  if (row.childElementCount) node.append(row);
  return node;
}

/** One line for a folded alert; opening it shows the full card. */
export function foldedCard(a, opts) {
  const d = el("details", "folded");
  d.dataset.id = String(a.id);
  const s = el("summary");
  s.append(
    el("span", `sev ${a.severity}`, a.severity),
    el("span", null, a.rule),
    el("span", "where", whereText(a)),
    el("span", "step", `step ${a.fired_step}`),
  );
  d.append(s);
  let built = false;
  d.addEventListener("toggle", () => {
    if (d.open && !built) {
      built = true;
      d.append(alertCard(a, opts));
    }
  });
  return d;
}
