// The alerts panel: the run's alerts grouped into incidents by the collector (earliest
// first), each told from its cause; the divergence shown beside it, near-duplicates and
// related alerts folded, consequences (NaN/loss after the divergence) folded under it.
// A filter on incident state. Text only via textContent.

import { el } from "./api.js";
import { alertCard, foldedCard, whereText } from "./alert_card.js";

const FILTERS = ["all", "firing", "resolved"];
// [one, several]: "1 consequence (after the divergence)", "2 consequences (...)"
const ROLE_TITLES = {
  related: ["related alert", "related alerts"],
  duplicate: ["saying the same (same metric and heads, within 50 steps)", "saying the same (same metric and heads, within 50 steps)"],
  consequence: ["consequence (after the divergence)", "consequences (after the divergence)"],
};
//: What an empty panel says when the run sent no attention statistic (no attn.* per-head
//: metric): no alert is not evidence that the logits are healthy.
export const NO_ATTENTION =
  "No alerts. No attention statistics received: the attention hooks may not be attached (see docs/HOOKS.md).";

export class AlertsPanel {
  /**
   * `list` holds the incidents, `counter` the firing count; `tabs` (optional) the filter
   * buttons; `onShow(alert)` is called by a card's "show on charts"; `actions` (optional)
   * adds buttons per card: (alert) => [element...].
   */
  constructor(list, counter, { tabs = null, onShow = null, actions = null } = {}) {
    this.list = list;
    this.counter = counter;
    this.tabs = tabs;
    this.opts = { onShow, actions };
    this.filter = "all";
    this.alerts = new Map();
    this.incidents = [];
    this.attention = null; // whether the run sent attention statistics (null: not known)
    if (tabs) this.buildTabs();
  }

  /** Whether the run has sent any attention statistic (an attn.* per-head metric). */
  setAttention(has) {
    if (this.attention === has) return;
    this.attention = has;
    this.render();
  }

  buildTabs() {
    this.tabButtons = {};
    for (const f of FILTERS) {
      const b = el("button", "tab", f);
      b.type = "button";
      b.dataset.filter = f;
      b.addEventListener("click", () => {
        this.filter = f;
        this.render();
      });
      this.tabButtons[f] = b;
    }
    this.tabs.replaceChildren(...Object.values(this.tabButtons));
  }

  /** The collector's grouping (GET /dashboard/runs/{id}) with the alerts it names. */
  setIncidents(incidents, alerts) {
    for (const a of alerts) this.alerts.set(a.id, a);
    this.incidents = incidents;
    this.render();
  }

  /** Add or update alerts; returns true when one is new or changed state. */
  upsert(...alerts) {
    let changed = false;
    for (const a of alerts) {
      const old = this.alerts.get(a.id);
      // what a card shows: an escalation from info changes severity, paged step and message
      const shown = ["state", "severity", "paged_step", "message", "acked_at", "suppressed", "_silenced"];
      if (!old || shown.some((k) => old[k] !== a[k]) || JSON.stringify(old.fuses) !== JSON.stringify(a.fuses)) {
        changed = true;
      }
      this.alerts.set(a.id, a);
    }
    if (changed) this.render();
    return changed;
  }

  /** Incidents to draw: the collector's, plus any alert it has not grouped yet (live). */
  groups() {
    const known = new Set(this.incidents.flatMap((i) => i.members.map((m) => m.id)));
    const extra = [...this.alerts.values()].filter((a) => !known.has(a.id));
    const out = this.incidents.map((i) => ({ ...i, state: i.members.some((m) => this.alerts.get(m.id)?.state === "firing") ? "firing" : "resolved" }));
    for (const a of extra) {
      out.push({ id: a.id, cause: a.id, severity: a.severity, state: a.state, fired_step: a.fired_step, members: [{ id: a.id, role: "cause" }] });
    }
    return out;
  }

  render() {
    const groups = this.groups();
    const shown = groups.filter((g) => this.filter === "all" || g.state === this.filter);
    this.list.replaceChildren(...shown.map((g, i) => this.incidentCard(g, groups.indexOf(g) + 1 || i + 1)));
    const all = [...this.alerts.values()];
    if (!all.length) {
      const text = this.attention === false ? NO_ATTENTION : this.attention ? "No alerts. Logits look healthy." : "No alerts.";
      this.list.append(el("p", "empty", text));
    } else if (!shown.length) this.list.append(el("p", "empty", `No ${this.filter} incidents.`));
    const firing = all.filter((a) => a.state === "firing").length;
    const open = groups.filter((g) => g.state === "firing").length;
    this.counter.textContent = firing
      ? `${open} incident${open > 1 ? "s" : ""} firing (${firing} alert${firing > 1 ? "s" : ""})`
      : all.length ? "none firing" : "";
    this.counter.dataset.state = firing ? "firing" : "ok";
    if (this.tabButtons) {
      const n = { all: groups.length, firing: groups.filter((g) => g.state === "firing").length };
      n.resolved = n.all - n.firing;
      for (const [f, b] of Object.entries(this.tabButtons)) {
        b.textContent = `${f} ${n[f]}`;
        b.setAttribute("aria-pressed", String(f === this.filter));
      }
    }
    document.body.dataset.alerts = String(all.length);
    document.body.dataset.incidents = String(groups.length);
  }

  incidentCard(g, number) {
    const node = el("section", "incident");
    node.dataset.id = String(g.id);
    node.dataset.state = g.state;
    node.dataset.severity = g.severity;
    const cause = this.alerts.get(g.cause);
    const members = g.members.map((m) => ({ ...m, alert: this.alerts.get(m.id) })).filter((m) => m.alert);
    const firing = members.filter((m) => m.alert.state === "firing").length;
    const head = el("h3", "incident-head");
    const last = Math.max(...members.map((m) => m.alert.fired_step));
    const span = last > g.fired_step ? `steps ${g.fired_step}–${last}` : `step ${g.fired_step}`;
    head.append(
      el("span", "num", `#${number}`),
      el("span", `sev ${g.severity}`, g.severity),
      el("span", `badge ${g.state}`, g.state),
      el("span", "span", span),
      el("span", "count", `${members.length} alert${members.length > 1 ? "s" : ""}${firing ? `, ${firing} firing` : ""}`),
    );
    node.append(head);
    if (cause) {
      node.append(el("p", "incident-cause", `started with ${cause.rule} on ${whereText(cause)} (rank ${cause.rank}) at step ${cause.fired_step}`));
      const card = alertCard(cause, this.opts);
      card.dataset.role = "cause";
      node.append(card);
    }
    const div = members.find((m) => m.role === "divergence");
    if (div) {
      const card = alertCard(div.alert, this.opts);
      card.dataset.role = "divergence";
      node.append(el("p", "incident-cause", `the run diverged at step ${div.alert.fired_step}`), card);
    }
    for (const role of ["related", "duplicate", "consequence"]) {
      const of = members.filter((m) => m.role === role).sort((x, y) => x.alert.fired_step - y.alert.fired_step);
      if (!of.length) continue;
      const box = el("details", `fold ${role}`);
      box.dataset.role = role;
      box.append(el("summary", null, `${of.length} ${ROLE_TITLES[role][of.length === 1 ? 0 : 1]}`));
      for (const m of of) box.append(foldedCard(m.alert, this.opts));
      node.append(box);
    }
    return node;
  }
}
