// Talking to the collector, and the wire's non-finite numbers.

export const API = "/api/v1";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** GET a JSON document; a non-2xx answer becomes an ApiError with the collector's code. */
export async function getJSON(url) {
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  if (!res.ok) {
    let body = {};
    try {
      body = await res.json();
    } catch {
      /* not JSON: keep the status */
    }
    throw new ApiError(res.status, body.code || "http-" + res.status, body.message || res.statusText);
  }
  return res.json();
}

/** GET one page of a list: its items and the X-Total-Count the collector reports. */
export async function getPage(url) {
  const res = await fetch(url, { headers: { Accept: "application/json" } });
  if (!res.ok) {
    let body = {};
    try {
      body = await res.json();
    } catch {
      /* not JSON: keep the status */
    }
    throw new ApiError(res.status, body.code || "http-" + res.status, body.message || res.statusText);
  }
  const items = await res.json();
  const total = Number(res.headers.get("X-Total-Count"));
  return { items, total: Number.isFinite(total) && total > 0 ? total : items.length };
}

// The wire's spellings, and Python's (str(float) in alert evidence).
const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity, nan: NaN, inf: Infinity, "-inf": -Infinity };

/** A wire value (number, or "NaN" / "Infinity" / "-Infinity") as a JS number; else null. */
export function wireNumber(v) {
  if (typeof v === "number") return v;
  if (typeof v === "string" && v in NONFINITE) return NONFINITE[v];
  return null;
}

/** A wire value for plotting: finite numbers as they are, everything else a gap (null). */
export function plotValue(v) {
  const n = wireNumber(v);
  return Number.isFinite(n) ? n : null;
}

/** A wire value as text for people: "61.2", "NaN", "Infinity", or "—" when absent. */
export function wireText(v, digits = 4) {
  const n = wireNumber(v);
  if (n === null) return "—";
  if (Number.isNaN(n)) return "NaN";
  if (!Number.isFinite(n)) return n > 0 ? "Infinity" : "-Infinity";
  return Number.isInteger(n) ? String(n) : String(Number(n.toPrecision(digits)));
}

/** "12 s ago", "3 min ago", ... from unix seconds. */
/** When the collector last received a frame of the run (its clock, not the job's). */
export function lastSeen(run) {
  return run.seen_at ?? run.last_time;
}

export function ago(unixSeconds) {
  if (unixSeconds == null) return "—";
  const s = Math.max(0, Date.now() / 1000 - unixSeconds);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** Create an element with a class and text (always textContent, never HTML). */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

/**
 * A small inline SVG line (no Plotly: a hundred of them on the runs page stay cheap).
 * Non-finite values break the line and put a red dot at the top; `mark` ("last", or null)
 * draws the newest point.
 */
export function sparkline(steps, values, { width = 120, height = 28, cls = "spark" } = {}) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", cls);
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const ys = values.map(plotValue);
  const finite = ys.filter((y) => y !== null);
  if (steps.length < 1 || !finite.length) {
    svg.dataset.points = "0";
    return svg;
  }
  const x0 = steps[0];
  const x1 = steps[steps.length - 1];
  const lo = Math.min(...finite);
  const hi = Math.max(...finite);
  const pad = 2;
  const px = (s) => pad + ((s - x0) / (x1 - x0 || 1)) * (width - 2 * pad);
  const py = (y) => height - pad - ((y - lo) / (hi - lo || 1)) * (height - 2 * pad);
  let d = "";
  let pen = false;
  ys.forEach((y, i) => {
    if (y === null) {
      pen = false;
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", px(steps[i]).toFixed(1));
      dot.setAttribute("cy", String(pad + 1));
      dot.setAttribute("r", "2");
      dot.setAttribute("class", "nonfinite");
      svg.append(dot);
      return;
    }
    d += `${pen ? "L" : "M"}${px(steps[i]).toFixed(1)} ${py(y).toFixed(1)}`;
    pen = true;
  });
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", d);
  svg.append(path);
  const last = ys.length - 1;
  if (ys[last] !== null) {
    const dot = document.createElementNS(SVG, "circle");
    dot.setAttribute("cx", px(steps[last]).toFixed(1));
    dot.setAttribute("cy", py(ys[last]).toFixed(1));
    dot.setAttribute("r", "2");
    svg.append(dot);
  }
  svg.dataset.points = String(ys.length);
  return svg;
}

/** Call `fn` at most once per `ms` (the last call wins; trailing). */
export function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      last = Date.now();
      fn();
    }, Math.max(0, last + ms - Date.now()));
  };
}

/** A query string from an object, skipping null/undefined/"" values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : "";
}
