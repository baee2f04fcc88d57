// The alerts inbox: firing and resolved alerts, their evidence and remedies, a filter, and a
// "show" button that zooms the charts to the alert and opens its head. Text only via
// textContent.

import { el, wireText } from "./api.js";

const FILTERS = ["all", "firing", "resolved"];

export class AlertsPanel {
  /**
   * `list` holds the cards, `counter` the firing count; `tabs` (optional) the filter buttons;
   * `onShow(alert)` is called by a card's "show" button; `actions` (optional) adds buttons
   * per card: (alert) => [element...].
   */
  constructor(list, counter, { tabs = null, onShow = null, actions = null } = {}) {
    this.list = list;
    this.counter = counter;
    this.tabs = tabs;
    this.onShow = onShow;
    this.actions = actions;
    this.filter = "all";
    this.alerts = new Map();
    if (tabs) this.buildTabs();
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

  /** Add or update alerts; returns true when one is new or changed state. */
  upsert(...alerts) {
    let changed = false;
    for (const a of alerts) {
      const old = this.alerts.get(a.id);
      if (!old || old.state !== a.state || old.acked_at !== a.acked_at || old._silenced !== a._silenced) {
        changed = true;
      }
      this.alerts.set(a.id, a);
    }
    if (changed) this.render();
    return changed;
  }

  render() {
    const all = [...this.alerts.values()].sort(
      (a, b) => (b.state === "firing") - (a.state === "firing") || b.fired_step - a.fired_step,
    );
    const shown = all.filter((a) => this.filter === "all" || a.state === this.filter);
    this.list.replaceChildren(...shown.map((a) => this.card(a)));
    if (!all.length) this.list.append(el("p", "empty", "No alerts. Logits look healthy."));
    else if (!shown.length) this.list.append(el("p", "empty", `No ${this.filter} alerts.`));
    const firing = all.filter((a) => a.state === "firing").length;
    this.counter.textContent = firing ? `${firing} firing` : all.length ? "none firing" : "";
    this.counter.dataset.state = firing ? "firing" : "ok";
    if (this.tabButtons) {
      const n = { all: all.length, firing, resolved: all.filter((a) => a.state === "resolved").length };
      for (const [f, b] of Object.entries(this.tabButtons)) {
        b.textContent = `${f} ${n[f]}`;
        b.setAttribute("aria-pressed", String(f === this.filter));
      }
    }
    document.body.dataset.alerts = String(all.length);
  }

  card(a) {
    const node = el("article", "alert");
    node.dataset.id = String(a.id);
    node.dataset.state = a.state;
    node.dataset.acknowledged = String(a.acked_at != null);
    const head = el("header");
    head.append(
      el("span", `badge ${a.state}`, a.state),
      el("span", "where", a.layer == null ? `rank ${a.rank}` : `rank ${a.rank} · layer ${a.layer} · head ${a.head}`),
      el("span", "step", `fired at step ${a.fired_step}`),
    );
    const facts = el(
      "p",
      "facts",
      `${a.metric} ${wireText(a.value)} · baseline ${wireText(a.baseline, 3)} · limit ${wireText(a.threshold, 3)}` +
        ` · since step ${a.started_step}` +
        (a.resolved_step != null ? ` · resolved at step ${a.resolved_step}` : ""),
    );
    node.append(head, el("p", "message", a.message), facts);
    const evidence = Object.entries(a.evidence || {});
    if (evidence.length) {
      const details = el("details", "evidence");
      details.append(el("summary", null, `evidence (${evidence.length})`));
      const dl = el("dl");
      for (const [k, v] of evidence) {
        dl.append(el("dt", null, k), el("dd", null, evidenceText(v)));
      }
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
    if (this.onShow) {
      const show = el("button", "show", "show on charts");
      show.type = "button";
      show.title = "zoom every chart to this alert and open its head";
      show.addEventListener("click", () => this.onShow(a));
      row.append(show);
    }
    if (this.actions) row.append(...this.actions(a));
    if (row.childElementCount) node.append(row);
    return node;
  }
}

function evidenceText(v) {
  if (Array.isArray(v)) {
    const shown = v.slice(0, 12).map((x) => (typeof x === "object" && x !== null ? JSON.stringify(x) : wireText(x)));
    return shown.join(", ") + (v.length > 12 ? ` … (${v.length} values)` : "");
  }
  if (typeof v === "object" && v !== null) return JSON.stringify(v);
  return typeof v === "number" || typeof v === "string" ? (wireText(v) === "—" ? String(v) : wireText(v)) : String(v);
}
