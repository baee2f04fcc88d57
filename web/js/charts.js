// Charts drawn from the collector's figure JSON, then extended live.
//
// The server builds each figure (server/figures/); every trace carries a `meta` role
// ("series", "clipped", "nonfinite", "alerts") so that live points go to the right trace.
// Zoom re-queries the server for the visible step range (see ZoomSync), so the min/max
// downsampling keeps every spike at every zoom level.

import { plotValue, wireText } from "./api.js";
import { getFigure } from "./batch.js";
import { addSmoothTrace, smoothed } from "./smooth.js";

/* global Plotly */

const CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
const RECENT = 2000; // live frames remembered to replay after a redraw
const MARKER_ROW = 0.96; // top of the plot on the figures' overlay axis (see server/figures/style.py)
const RELOAD_EVERY_MS = 3000; // charts without live points refetch at most this often
const FEW_POINTS = 20; // a line of fewer points shows its points too (one point draws no line)

/** Markers on a line trace of few drawable points: Plotly draws nothing for a lone point. */
export function markFewPoints(trace) {
  if (trace.mode !== "lines" || !Array.isArray(trace.y)) return trace;
  const drawable = trace.y.filter((v) => v !== null && Number.isFinite(Number(v))).length;
  if (drawable < FEW_POINTS) trace.mode = "lines+markers";
  return trace;
}

function rolesOf(gd) {
  const roles = {};
  gd.data.forEach((t, i) => {
    if (typeof t.meta === "string") roles[t.meta] = i;
  });
  return roles;
}

/** The x range of a plotly_relayout event: [a, b], null (autorange), or undefined (none). */
export function rangeOf(ev) {
  if (!ev) return undefined;
  if (ev["xaxis.autorange"] === true) return null;
  const a = ev["xaxis.range[0]"] ?? ev["xaxis.range"]?.[0];
  const b = ev["xaxis.range[1]"] ?? ev["xaxis.range"]?.[1];
  if (a === undefined || b === undefined) return undefined;
  return [Number(a), Number(b)];
}

/**
 * A base: load() fetches and draws with Plotly.react; reloads coalesce.
 * `base` is the figure URL; `params` are extra query parameters (name, layer, ...);
 * `range` ([start, end] steps, or null) is the zoom the server is asked for.
 */
class Chart {
  constructor(el, base, params = {}) {
    this.el = el;
    this.base = base;
    this.params = params;
    this.range = null;
    this.loading = null;
    this.again = false;
    this.zoom = null;
    this.lastReload = 0;
    this.reloadTimer = null;
  }

  get url() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(this.params)) if (v !== null && v !== undefined) q.set(k, v);
    if (this.range) {
      q.set("start", String(Math.max(0, Math.floor(this.range[0]))));
      q.set("end", String(Math.max(0, Math.ceil(this.range[1]))));
    }
    const s = q.toString();
    return s ? `${this.base}${this.base.includes("?") ? "&" : "?"}${s}` : this.base;
  }

  /** (Re)draw from the server; concurrent calls coalesce into one more fetch. */
  reload() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        this.lastReload = Date.now();
        const fig = await getFigure(this.url);
        fig.data.forEach(markFewPoints);
        this.shapeData(fig.data);
        this.shapeLayout(fig.layout);
        await Plotly.react(this.el, fig.data, fig.layout, CONFIG);
        this.listen();
        this.afterDraw();
        this.el.dataset.loaded = String(Number(this.el.dataset.loaded || 0) + 1);
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

  /** Reload soon, at most once per RELOAD_EVERY_MS (for live data without live points). */
  reloadSoon() {
    if (this.reloadTimer) return;
    const wait = Math.max(0, this.lastReload + RELOAD_EVERY_MS - Date.now());
    this.reloadTimer = setTimeout(() => {
      this.reloadTimer = null;
      this.reload().catch((e) => console.warn(e));
    }, wait);
  }

  /** Traces the browser adds to the server's (the smoothed line). */
  shapeData() {}

  /** Keep the zoom the server was asked for (a programmatic range is not kept by uirevision),
   * the log y axis when asked for, and a hover at the step under the pointer. */
  shapeLayout(layout) {
    if (this.logY) {
      layout.yaxis = { ...(layout.yaxis || {}), type: "log", autorange: true };
      delete layout.yaxis.range;
    }
    if (this.hoverX) layout.hovermode = "x";
    if (!this.zoom) return;
    layout.xaxis = layout.xaxis || {};
    if (this.range) {
      layout.xaxis.range = [...this.range];
      layout.xaxis.autorange = false;
    } else {
      layout.xaxis.autorange = true;
    }
  }

  listen() {
    if (this.listening || !this.zoom) return;
    this.listening = true;
    this.el.on("plotly_relayout", (ev) => {
      const r = rangeOf(ev);
      if (r !== undefined) this.zoom.set(r, this);
    });
    if (this.hoverX) {
      this.el.on("plotly_hover", (ev) => this.zoom.hover(ev?.points?.[0]?.x, this));
      this.el.on("plotly_unhover", () => this.zoom.hover(null, this));
    }
  }

  /** Log or linear y (a chart of logits, norms or loss). */
  setLogY(on) {
    this.logY = on;
    if (!this.el.data) return Promise.resolve();
    return Promise.resolve(Plotly.relayout(this.el, on ? { "yaxis.type": "log", "yaxis.autorange": true } : { "yaxis.type": "linear", "yaxis.autorange": true }));
  }

  /** A new zoom: ask the server for that range (null: everything). */
  setRange(range) {
    this.range = range;
    return this.reload();
  }

  afterDraw() {}
}

/**
 * A line chart over steps. `pointsOf(frame)` returns the frame's additions by role:
 * { series: [x, y], clipped?: [x, y], nonfinite?: [x, text] } (or null to skip the frame).
 * Without `pointsOf`, live frames make the chart refetch (throttled): derived series.
 */
export class LineChart extends Chart {
  constructor(el, base, pointsOf, { maxPoints = 2000, params = {} } = {}) {
    super(el, base, params);
    this.pointsOf = pointsOf;
    this.maxPoints = maxPoints;
    this.lastStep = -Infinity;
    this.recent = [];
    this.hoverX = true; // the step under the pointer, on every line chart at once
    this.smooth = null; // { mode, amount } (smooth.js): a smoothed line over the faint raw one
  }

  shapeData(data) {
    if (this.smooth) addSmoothTrace(data, this.smooth);
  }

  /** Smoothing on ({ mode, amount }) or off (null): redrawn from the server's points. */
  setSmooth(s) {
    this.smooth = s;
    return this.el.data ? this.reload() : Promise.resolve();
  }

  afterDraw() {
    this.roles = rolesOf(this.el);
    const xs = this.el.data[this.roles.series].x;
    this.lastStep = xs.length ? xs[xs.length - 1] : -Infinity;
    // Frames that arrived while the figure was being fetched and drawn.
    if (this.pointsOf && !this.range) this.draw(this.recent);
  }

  /** Append live frames (step-ordered); returns how many new steps were drawn. */
  extend(frames) {
    if (!this.pointsOf) {
      if (!this.range && frames.length) this.reloadSoon();
      return 0;
    }
    for (const f of frames) this.recent.push(f);
    if (this.recent.length > RECENT) this.recent.splice(0, this.recent.length - RECENT);
    // Zoomed into a past range: the view stays as asked; a reset reloads everything.
    if (this.loading || this.range) return 0;
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
    const line = this.el.data[this.roles.series];
    if (line.mode === "lines+markers" && line.x.length >= FEW_POINTS) {
      Plotly.restyle(this.el, { mode: "lines" }, [this.roles.series]); // enough for a line
    }
    if ("smooth" in this.roles) {
      Plotly.restyle(this.el, { x: [[...line.x]], y: [smoothed(line.y, this.smooth)] }, [this.roles.smooth]);
    }
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

  /** Show another per-head statistic (e.g. attn.logit_p99). */
  setMetric(name) {
    this.params.name = name;
    this.step = null;
    return this.reload();
  }

  update(latest) {
    const name = this.meta?.metric || this.params.name || "attn.logit_max";
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
    if (this.meta.nonfinite_from != null) return; // showing the last finite step already
    if (matrix.some((row) => row.some((v) => plotValue(v) === null))) {
      // A NaN/Inf: the collector shows the last finite step, and since when.
      this.reloadSoon();
      return;
    }
    this.step = latest.step;
    const z = matrix.map((row) => row.map((v) => {
      const y = plotValue(v);
      return this.meta.log ? (y > 0 ? Math.log10(y) : (this.meta.log_floor ?? null)) : y;
    }));
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

/** Any server figure over steps that is refetched rather than extended (zoomable). */
export class FigureChart extends Chart {}

/** A heatmap over steps (heads of a layer, or per-layer envelope): refetched, zoomable. */
export class StepHeatmapChart extends FigureChart {}

/**
 * One zoom shared by the step-axis charts: a zoom or pan in one moves the others to the same
 * range, and each asks the server for that range (null range: the whole run).
 */
export class ZoomSync {
  constructor(onChange) {
    this.charts = new Set();
    this.range = null;
    this.onChange = onChange;
  }

  add(chart) {
    chart.zoom = this;
    chart.range = this.range;
    this.charts.add(chart);
    return chart;
  }

  remove(chart) {
    this.charts.delete(chart);
  }

  /** Show the hover of every other line chart at step `x` (null: hide them). */
  hover(x, source) {
    if (this.hovering) return;
    this.hovering = true;
    try {
      for (const c of this.charts) {
        if (c === source || !c.hoverX || !c.el.data || !c.el._fullLayout) continue;
        if (x == null) Plotly.Fx.unhover(c.el);
        else Plotly.Fx.hover(c.el, { xval: x }, "xy");
      }
    } finally {
      this.hovering = false;
    }
  }

  set(range, source = null) {
    const same =
      (range === null && this.range === null) ||
      (range && this.range && Math.abs(range[0] - this.range[0]) < 1e-6 && Math.abs(range[1] - this.range[1]) < 1e-6);
    if (same) return Promise.resolve();
    this.range = range;
    if (this.onChange) this.onChange(range);
    const jobs = [];
    for (const c of this.charts) {
      if (c !== source && c.el.data) {
        // The view moves at once; the data for it follows from the server.
        const upd = range ? { "xaxis.range": [...range], "xaxis.autorange": false } : { "xaxis.autorange": true };
        jobs.push(Promise.resolve(Plotly.relayout(c.el, upd)));
      }
      jobs.push(c.setRange(range));
    }
    return Promise.all(jobs);
  }
}
