// The run page's view in its address, so a link opens the same view:
//   ?rank=1&stat=attn.logit_p99&layer=1&head=1.3&zoom=200-480&log=1&color=log&smooth=ema-60
// Read once at load; written (replaceState, no history entries) on every change.

import { parseSmooth, smoothText } from "./smooth.js";

const KEYS = ["rank", "stat", "layer", "head", "zoom", "log", "color", "smooth"];

export function readState() {
  const q = new URLSearchParams(location.search);
  const out = {};
  const int = (k) => {
    const v = q.get(k);
    return v !== null && /^\d+$/.test(v) ? Number(v) : null;
  };
  out.rank = int("rank") ?? 0;
  out.stat = q.get("stat") || null;
  out.layer = int("layer");
  const head = /^(\d+)\.(\d+)$/.exec(q.get("head") || "");
  out.head = head ? [Number(head[1]), Number(head[2])] : null;
  const zoom = /^(\d+)-(\d+)$/.exec(q.get("zoom") || "");
  out.zoom = zoom && Number(zoom[1]) < Number(zoom[2]) ? [Number(zoom[1]), Number(zoom[2])] : null;
  out.log = q.get("log") === "1";
  out.color = ["log", "linear", "auto"].includes(q.get("color")) ? q.get("color") : "auto";
  out.smooth = parseSmooth(q.get("smooth")); // null: off
  return out;
}

/** Write `state` into the address (defaults left out). */
export function writeState(state) {
  const q = new URLSearchParams(location.search);
  for (const k of KEYS) q.delete(k);
  if (state.rank) q.set("rank", String(state.rank));
  if (state.stat && state.stat !== "attn.logit_max") q.set("stat", state.stat);
  if (state.layer != null) q.set("layer", String(state.layer));
  if (state.head) q.set("head", `${state.head[0]}.${state.head[1]}`);
  if (state.zoom) q.set("zoom", `${Math.max(0, Math.floor(state.zoom[0]))}-${Math.ceil(state.zoom[1])}`);
  if (state.log) q.set("log", "1");
  if (state.color && state.color !== "auto") q.set("color", state.color);
  if (state.smooth) q.set("smooth", smoothText(state.smooth));
  const s = q.toString();
  const url = `${location.pathname}${s ? `?${s}` : ""}${location.hash}`;
  if (url !== `${location.pathname}${location.search}${location.hash}`) history.replaceState(null, "", url);
}
