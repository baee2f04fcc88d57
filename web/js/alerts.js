// The alerts panel: one card per alert, firing first. Text only via textContent.

import { el, wireText } from "./api.js";

export class AlertsPanel {
  constructor(list, counter) {
    this.list = list;
    this.counter = counter;
    this.alerts = new Map();
  }

  /** Add or update alerts; returns true when one is new or changed state. */
  upsert(...alerts) {
    let changed = false;
    for (const a of alerts) {
      const old = this.alerts.get(a.id);
      if (!old || old.state !== a.state) changed = true;
      this.alerts.set(a.id, a);
    }
    if (changed) this.render();
    return changed;
  }

  render() {
    const all = [...this.alerts.values()].sort(
      (a, b) => (b.state === "firing") - (a.state === "firing") || b.fired_step - a.fired_step,
    );
    this.list.replaceChildren(...all.map(card));
    if (!all.length) this.list.append(el("p", "empty", "No alerts. Logits look healthy."));
    const firing = all.filter((a) => a.state === "firing").length;
    this.counter.textContent = firing ? `${firing} firing` : all.length ? "none firing" : "";
    this.counter.dataset.state = firing ? "firing" : "ok";
    document.body.dataset.alerts = String(all.length);
  }
}

function card(a) {
  const node = el("article", "alert");
  node.dataset.id = String(a.id);
  node.dataset.state = a.state;
  const head = el("header");
  head.append(
    el("span", `badge ${a.state}`, a.state),
    el("span", "where", a.layer === null ? `rank ${a.rank}` : `rank ${a.rank} · layer ${a.layer} · head ${a.head}`),
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
  if (a.remedies?.length) {
    const details = el("details", "remedies");
    details.append(el("summary", null, `remedies (${a.remedies.length})`));
    const ol = el("ol");
    for (const r of a.remedies) ol.append(el("li", null, r));
    details.append(ol);
    node.append(details);
  }
  return node;
}
