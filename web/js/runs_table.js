// The runs table's columns and their order: each column knows how to draw its cell and the
// key it sorts by; a click on a header sorts by it (again: the other way), kept in the
// address as ?sort=duration-desc. Text only via textContent.

import { ago, el, lastSeen, plotValue, sparkline, wireText } from "./api.js";

/** "3 h 12 min", "45 s". */
export function duration(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** How long it ran: its last (or end) frame's time minus its first frame's, both stamped
 * by the job, so a skewed job clock cancels out; a run without frame times falls back to
 * the collector's clock (first and last received). */
export function runDuration(run) {
  if (run.first_time != null) {
    const end = run.ended_at ?? run.last_time;
    return end == null ? null : end - run.first_time;
  }
  const end = lastSeen(run);
  return end == null ? null : end - run.created_at;
}

/** "lr=0.001 · batch=16 · model=gpt2" (scalars first; nested values as JSON). */
export function configText(config) {
  if (!config) return "";
  return Object.entries(config)
    .map(([k, v]) => `${k}=${typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)}`)
    .join(" · ");
}

// The runs that need a person first: a run that finished with a warning or critical alert
// still open sorts with them, not with the healthy ones.
const VERDICT_ORDER = { diverged: 0, stopped: 1, warning: 2, finished_alerting: 3, running: 4, healthy: 5, finished: 6, empty: 7 };
const VERDICT_WORDS = { finished_alerting: "finished, alerting" };
const STATUS_ORDER = { diverged: 0, stopped: 1, running: 2, finished: 3, empty: 4 };

function configCell(run) {
  const td = el("td", "config");
  const text = configText(run.config);
  if (!text) {
    td.append(el("span", "meta", "—"));
    return td;
  }
  const d = el("details");
  const entries = Object.entries(run.config);
  d.append(el("summary", null, entries.length > 3 ? `${configText(Object.fromEntries(entries.slice(0, 3)))} …` : text));
  const dl = el("dl");
  for (const [k, v] of entries) dl.append(el("dt", null, k), el("dd", null, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)));
  d.append(dl);
  d.title = text;
  td.append(d);
  return td;
}

function tagsCell(run) {
  const td = el("td", "tags");
  for (const t of run.tags || []) td.append(el("span", "chip", t));
  return td;
}

/** key: the column's name (data-col, ?sort=); sort(run): the value it sorts by. */
export const COLUMNS = [
  { key: "name", label: "run", sort: (r) => r.name.toLowerCase() },
  { key: "project", label: "project", sort: (r) => r.project.toLowerCase(), cell: (r) => el("td", null, r.project) },
  {
    key: "status", label: "status", sort: (r) => STATUS_ORDER[r.status] ?? 9,
    cell: (r) => {
      const td = el("td");
      td.append(el("span", `state ${r.status}`, r.status));
      return td;
    },
  },
  {
    key: "verdict", label: "verdict", sort: (r) => VERDICT_ORDER[r.verdict] ?? 9,
    cell: (r) => {
      const td = el("td", "verdict-cell");
      td.append(el("span", `verdict-chip ${r.verdict}`, VERDICT_WORDS[r.verdict] || r.verdict));
      td.title = r.verdict_text;
      return td;
    },
  },
  {
    key: "loss", label: "loss", sort: (r) => plotValue(r.last_loss) ?? Infinity,
    cell: (r) => {
      const td = el("td", "spark-cell");
      const wrap = el("div", "spark-wrap");
      wrap.append(sparkline(r.loss_steps, r.loss_values), el("span", "last", r.last_loss == null ? "" : wireText(r.last_loss, 4)));
      td.append(wrap);
      td.title = r.loss_steps.length ? `loss over steps ${r.loss_steps[0]}–${r.loss_steps.at(-1)}` : "no loss yet";
      return td;
    },
  },
  {
    key: "started", label: "started", num: true, sort: (r) => r.created_at,
    cell: (r) => {
      const td = el("td", "num", new Date(r.created_at * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" }));
      td.title = new Date(r.created_at * 1000).toISOString();
      return td;
    },
  },
  { key: "duration", label: "duration", num: true, sort: (r) => runDuration(r) ?? -1, cell: (r) => el("td", "num", duration(runDuration(r))) },
  { key: "step", label: "last step", num: true, sort: (r) => r.last_step ?? -1, cell: (r) => el("td", "num", r.last_step ?? "—") },
  { key: "seen", label: "last seen", num: true, sort: (r) => lastSeen(r) ?? 0, cell: (r) => el("td", "num", ago(lastSeen(r))) },
  {
    key: "alerts", label: "open alerts", num: true, sort: (r) => r.open_alerts,
    cell: (r) => {
      const td = el("td", "num");
      const badge = el("span", r.open_alerts > 0 ? "badge firing" : "badge ok", r.open_alerts);
      badge.title = r.open_alerts > 0 ? `${r.open_alerts} alert(s) firing` : "no alert firing";
      td.append(badge);
      return td;
    },
  },
  { key: "tags", label: "tags", sort: (r) => (r.tags || []).join(" "), cell: tagsCell },
  { key: "config", label: "config", sort: (r) => configText(r.config), cell: configCell },
];

/** "duration-desc" -> { key, desc }; anything else -> null (the collector's order). */
export function parseSort(text) {
  const m = /^([a-z]+)-(asc|desc)$/.exec(text || "");
  return m && COLUMNS.some((c) => c.key === m[1]) ? { key: m[1], desc: m[2] === "desc" } : null;
}

/** The runs in the order asked for (stable: ties keep the collector's order). */
export function sorted(runs, sort) {
  if (!sort) return runs;
  const col = COLUMNS.find((c) => c.key === sort.key);
  const dir = sort.desc ? -1 : 1;
  return runs
    .map((r, i) => [col.sort(r), i, r])
    .sort((a, b) => (a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1]))
    .map((x) => x[2]);
}

/** The header row: a button per column; `onSort(key)` when one is clicked. */
export function headerRow(sort, onSort) {
  const tr = el("tr");
  for (const c of COLUMNS) {
    const th = el("th", c.num ? "num" : null);
    th.dataset.col = c.key;
    th.setAttribute("aria-sort", sort?.key === c.key ? (sort.desc ? "descending" : "ascending") : "none");
    const b = el("button", "sort", c.label);
    b.type = "button";
    b.title = `sort by ${c.label}`;
    if (sort?.key === c.key) b.append(el("span", "arrow", sort.desc ? " ▼" : " ▲"));
    b.addEventListener("click", () => onSort(c.key));
    th.append(b);
    tr.append(th);
  }
  return tr;
}
