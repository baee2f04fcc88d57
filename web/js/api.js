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

const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

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
