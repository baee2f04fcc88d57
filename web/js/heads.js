// The worst-heads table: the k heads with the most extreme value of a per-head statistic,
// with their trend; after a NaN, those of the last step where every head was finite.

import { el, getJSON, query, sparkline, wireText } from "./api.js";

/** Fetch and fill #worst; `onOpen(layer, head)` is called when a row is clicked. */
export async function loadWorst(base, { name, rank }, onOpen) {
  const w = await getJSON(`${base}/worst_heads${query({ name, k: 10, rank })}`);
  const table = document.getElementById("worst");
  const body = table.querySelector("tbody");
  let sub = w.step == null
    ? `no ${w.name} yet`
    : `${w.order} ${w.name} at step ${w.step} · median of ${w.layers * w.heads} heads ${wireText(w.median, 3)}`;
  if (w.nonfinite_from != null) sub += ` · last finite step: NaN/Inf from step ${w.nonfinite_from}`;
  document.getElementById("worst-sub").textContent = sub;
  table.dataset.step = w.step == null ? "" : String(w.step);
  table.dataset.nonfiniteFrom = w.nonfinite_from == null ? "" : String(w.nonfinite_from);
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
      tr.addEventListener("click", () => onOpen(r.layer, r.head));
      return tr;
    }),
  );
  table.dataset.rows = String(w.rows.length);
  return w;
}
