// Charts drawn from the collector's figure JSON, then extended live.
//
// The server builds each figure (server/figures.py); every trace carries a `meta` role
// ("series", "clipped", "nonfinite", "alerts") so that live points go to the right trace.

import { getJSON, plotValue, wireText } from "./api.js";

/* global Plotly */

const CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
const RECENT = 2000; // live frames remembered to replay after a redraw
const MARKER_ROW = 0.96; // top of the plot on the figures' overlay axis (see figures.py)

function rolesOf(gd) {
  const roles = {};
  gd.data.forEach((t, i) => {
    if (typeof t.meta === "string") roles[t.meta] = i;
  });
  return roles;
}

/** A base: load() fetches and draws with Plotly.react; reloads coalesce. */
class Chart {
  constructor(el, url) {
    this.el = el;
    this.url = url;
    this.loading = null;
    this.again = false;
  }

  /** (Re)draw from the server; concurrent calls coalesce into one more fetch. */
  reload() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        const fig = await getJSON(this.url);
        await Plotly.react(this.el, fig.data, fig.layout, CONFIG);
        this.afterDraw();
      } finally {
        this.loading = null;
      }
      if (this.again) {
        this.again = false;
        await this.reload();
      }
    })();
    return this.loading;
  }

  afterDraw() {}
}

/**
 * A line chart over steps. `pointsOf(frame)` returns the frame's additions by role:
 * { series: [x, y], clipped?: [x, y], nonfinite?: [x, text] } (or null to skip the frame).
 */
export class LineChart extends Chart {
  constructor(el, url, pointsOf, { maxPoints = 2000 } = {}) {
    super(el, url);
    this.pointsOf = pointsOf;
    this.maxPoints = maxPoints;
    this.lastStep = -Infinity;
    this.recent = [];
  }

  afterDraw() {
    this.roles = rolesOf(this.el);
    const xs = this.el.data[this.roles.series].x;
    this.lastStep = xs.length ? xs[xs.length - 1] : -Infinity;
    // Frames that arrived while the figure was being fetched and drawn.
    this.draw(this.recent);
  }

  /** Append live frames (step-ordered); returns how many new steps were drawn. */
  extend(frames) {
    for (const f of frames) this.recent.push(f);
    if (this.recent.length > RECENT) this.recent.splice(0, this.recent.length - RECENT);
    if (this.loading) return 0; // afterDraw() replays them
    if (this.lastStep === -Infinity) {
      // An empty chart ("no data yet"): redraw from the server rather than patching.
      if (frames.some((f) => this.pointsOf(f))) this.reload();
      return 0;
    }
    const n = this.draw(frames);
    // Live points are appended at full resolution; past twice the budget, fetch the
    // downsampled figure again (the layout's uirevision keeps the user's zoom).
    if (this.el.data[this.roles.series].x.length > 2 * this.maxPoints) this.reload();
    return n;
  }

  draw(frames) {
    const add = { series: [[], []], clipped: [[], []], nonfinite: [[], [], []] };
    let last = this.lastStep;
    for (const f of frames) {
      if (f.step <= last) continue; // already drawn (history replayed by the stream)
      const p = this.pointsOf(f);
      if (!p) continue;
      last = f.step;
      for (const role of ["series", "clipped"]) {
        if (p[role]) {
          add[role][0].push(p[role][0]);
          add[role][1].push(p[role][1]);
        }
      }
      if (p.nonfinite) {
        add.nonfinite[0].push(p.nonfinite[0]);
        add.nonfinite[1].push(MARKER_ROW);
        add.nonfinite[2].push(p.nonfinite[1]);
      }
    }
    const n = add.series[0].length;
    if (!n) return 0;
    this.lastStep = last;
    const xy = ["series", "clipped"].filter((r) => add[r][0].length && r in this.roles);
    Plotly.extendTraces(
      this.el,
      { x: xy.map((r) => add[r][0]), y: xy.map((r) => add[r][1]) },
      xy.map((r) => this.roles[r]),
    );
    if (add.nonfinite[0].length && "nonfinite" in this.roles) {
      const [x, y, text] = add.nonfinite;
      Plotly.extendTraces(this.el, { x: [x], y: [y], text: [text] }, [this.roles.nonfinite]);
    }
    return n;
  }
}

/** One scalar per frame, e.g. `loss`. */
export function scalarPoints(name) {
  return (f) => {
    const v = f.scalars?.[name];
    if (v === undefined) return null;
    const y = plotValue(v);
    const p = { series: [f.step, y] };
    if (y === null) p.nonfinite = [f.step, `${name} = ${wireText(v)} at step ${f.step}`];
    return p;
  };
}

/** The gradient norm, with a clipped marker on steps where `grad.clipped` > 0. */
export function gradNormPoints(f) {
  const p = scalarPoints("grad.norm")(f);
  if (p && plotValue(f.scalars?.["grad.clipped"]) > 0) p.clipped = [f.step, p.series[1]];
  return p;
}

/** The layer x head heatmap; live frames replace its matrix (only ever forward in steps). */
export class HeatmapChart extends Chart {
  afterDraw() {
    this.meta = this.el.layout.meta || {};
    this.step = this.meta.step ?? null;
    if (this.pending) {
      const latest = this.pending;
      this.pending = null;
      this.update(latest);
    }
  }

  update(latest) {
    const name = this.meta?.metric || "attn.logit_max";
    const matrix = latest?.[name];
    if (!matrix || !matrix.length) return;
    if (this.loading) {
      this.pending = latest;
      return;
    }
    if (this.step === null) {
      this.reload(); // first matrix: draw the whole figure (axes, colour bar)
      return;
    }
    if (latest.step < this.step) return; // an older frame (stream catching up)
    this.step = latest.step;
    const z = matrix.map((row) => row.map(plotValue));
    const text = matrix.map((row) => row.map((v) => wireText(v)));
    const heads = matrix[0].length;
    Plotly.update(
      this.el,
      { z: [z], text: [text], x: [[...Array(heads).keys()]], y: [[...Array(matrix.length).keys()]] },
      { "title.text": `${this.meta.title}, step ${latest.step}`, "meta.step": latest.step },
      [0],
    );
  }
}
