// Figure requests of a run, batched: the charts that ask within the same turn of the event
// loop are answered by one GET /api/v1/runs/{id}/figures?f=...&f=... (one `f` per figure:
// the query string of /figures/{kind} with its kind; server/api/routes/figures.py). A run
// page opens with one figure request instead of one per chart; a zoom, a rank or a new
// alert redraws every chart with one request too. Other URLs are fetched as they are.

import { ApiError, getJSON } from "./api.js";

const MAX = 32; // figures per request (the collector's limit)
const FIGURE = /^(.*\/runs\/[^/?]+\/figures)\/([a-z_]+)(?:\?(.*))?$/;
let pending = []; // { root, f, resolve, reject }

/** The figure at `url` (`.../runs/{id}/figures/{kind}?...`), fetched with its neighbours. */
export function getFigure(url) {
  const m = FIGURE.exec(url);
  if (!m) return getJSON(url);
  return new Promise((resolve, reject) => {
    if (!pending.length) setTimeout(flush, 0);
    pending.push({ root: m[1], f: m[3] ? `kind=${m[2]}&${m[3]}` : `kind=${m[2]}`, resolve, reject });
  });
}

function flush() {
  const asked = pending;
  pending = [];
  const byRoot = new Map();
  for (const p of asked) {
    if (!byRoot.has(p.root)) byRoot.set(p.root, []);
    byRoot.get(p.root).push(p);
  }
  for (const [root, all] of byRoot) {
    for (let i = 0; i < all.length; i += MAX) send(root, all.slice(i, i + MAX));
  }
}

async function send(root, chunk) {
  const body = document.body;
  body.dataset.figureRequests = String(Number(body.dataset.figureRequests || 0) + 1);
  try {
    const { figures } = await getJSON(`${root}?${chunk.map((p) => `f=${encodeURIComponent(p.f)}`).join("&")}`);
    chunk.forEach((p, i) => {
      const fig = figures[i];
      if (fig && fig.error) p.reject(new ApiError(fig.error.status, fig.error.code, fig.error.message));
      else p.resolve(fig);
    });
  } catch (err) {
    for (const p of chunk) p.reject(err);
  }
}
