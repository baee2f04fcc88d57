// Smoothing of the line charts, computed in the browser from the points drawn: the raw
// series stays, faint, behind the smoothed line, so a spike is still seen where it was.
//   ema-60: exponential moving average of weight 0.60 (debiased, as TensorBoard's);
//   median-9: rolling median over 9 points centred on each (a lone spike does not move it).
// Non-finite values (gaps) stay gaps and do not enter the average.

export const DEFAULT_AMOUNT = { ema: 60, median: 9 };

/** "ema-60" / "median-9" -> { mode, amount }; anything else -> null (off). */
export function parseSmooth(text) {
  const m = /^(ema|median)-(\d{1,2})$/.exec(text || "");
  if (!m) return null;
  const amount = Number(m[2]);
  return amount >= 1 && amount <= 99 ? { mode: m[1], amount } : null;
}

export function smoothText(s) {
  return s ? `${s.mode}-${s.amount}` : "";
}

/** A label for people: "EMA 0.60", "median of 9 points". */
export function smoothLabel(s) {
  if (!s) return "";
  return s.mode === "ema" ? `weight ${(s.amount / 100).toFixed(2)}` : `${medianWindow(s.amount)} points`;
}

export function medianWindow(amount) {
  return 2 * Math.floor(amount / 2) + 1;
}

const finite = (v) => v !== null && v !== undefined && Number.isFinite(Number(v));

export function ema(ys, weight) {
  const out = new Array(ys.length);
  let acc = 0;
  let n = 0;
  for (let i = 0; i < ys.length; i++) {
    if (!finite(ys[i])) {
      out[i] = null;
      continue;
    }
    acc = acc * weight + (1 - weight) * Number(ys[i]);
    n += 1;
    out[i] = acc / (1 - weight ** n); // debiased: the first points are not pulled to 0
  }
  return out;
}

export function rollingMedian(ys, window) {
  const half = Math.floor(window / 2);
  const out = new Array(ys.length);
  for (let i = 0; i < ys.length; i++) {
    if (!finite(ys[i])) {
      out[i] = null;
      continue;
    }
    const near = [];
    for (let j = Math.max(0, i - half); j <= Math.min(ys.length - 1, i + half); j++) {
      if (finite(ys[j])) near.push(Number(ys[j]));
    }
    near.sort((a, b) => a - b);
    const k = near.length >> 1;
    out[i] = near.length % 2 ? near[k] : (near[k - 1] + near[k]) / 2;
  }
  return out;
}

export function smoothed(ys, s) {
  return s.mode === "ema" ? ema(ys, s.amount / 100) : rollingMedian(ys, medianWindow(s.amount));
}

/** Add the smoothed line of the `series` trace of a figure's `data` (before drawing). */
export function addSmoothTrace(data, s) {
  const raw = data.find((t) => t.meta === "series");
  if (!s || !raw || !Array.isArray(raw.y)) return data;
  raw.opacity = 0.3;
  const color = raw.line?.color || raw.marker?.color;
  data.push({
    type: "scatter",
    mode: "lines",
    meta: "smooth",
    name: `${raw.name || "series"} (smoothed)`,
    x: [...raw.x],
    y: smoothed(raw.y, s),
    xaxis: raw.xaxis,
    yaxis: raw.yaxis,
    line: { color, width: 2 },
    showlegend: false,
    connectgaps: false,
    hovertemplate: "smoothed %{y:.4g}<extra></extra>",
  });
  return data;
}

/**
 * The smoothing control: a select (off, EMA, rolling median) and a strength slider shown
 * when on. `onChange(s)` gets { mode, amount } or null, once the slider is let go.
 */
export function smoothControl({ select, range, box, value }, initial, onChange) {
  const show = (s) => {
    select.value = s ? s.mode : "";
    box.hidden = !s;
    if (s) range.value = String(s.amount);
    value.textContent = smoothLabel(s);
  };
  const current = () => (select.value ? { mode: select.value, amount: Number(range.value) } : null);
  show(initial);
  select.addEventListener("change", () => {
    const s = select.value ? { mode: select.value, amount: DEFAULT_AMOUNT[select.value] } : null;
    show(s);
    onChange(s);
  });
  range.addEventListener("input", () => (value.textContent = smoothLabel(current())));
  range.addEventListener("change", () => onChange(current()));
}
