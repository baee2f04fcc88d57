// The fuses an alert carries (the collector's `alert.fuses`, docs/FUSES.md): one button per
// fuse to apply or undo it for the alert's run (POST /api/v1/runs/{run_id}/fuses; the job
// acts on the next ingest answer's control.fuses), and the last action asked. Text only via
// textContent.

import { API, ApiError, el } from "./api.js";

const NAMES = { qk_clip: "QK-clip", lr_backoff: "LR backoff", rollback: "Rollback",
                qk_norm: "QK-norm", soft_cap: "soft-cap" };

async function post(url, body) {
  const res = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
  });
  let data = {};
  try {
    data = await res.json();
  } catch {
    /* keep the status */
  }
  if (!res.ok) throw new ApiError(res.status, data.code || `http-${res.status}`, data.message || res.statusText);
  return data;
}

function lastAction(f) {
  const e = f.actions?.length ? f.actions[f.actions.length - 1] : null;
  if (!e) return null;
  const step = e.step != null ? ` at step ${e.step}` : "";
  return `${e.action === "apply" ? "applied" : "undone"}${step}${e.by ? ` by ${e.by}` : ""}`;
}

/** (alert, rerender) => elements: per fuse the alert carries, its state and a button. */
export function fuseActions(a, rerender) {
  const out = [];
  for (const f of a.fuses || []) {
    const name = NAMES[f.fuse] || f.fuse;
    const box = el("span", "fuse");
    box.dataset.fuse = f.fuse;
    if (f.job == null || f.job === "off" || f.job === "unavailable") {
      const why = f.job == null ? "not attached in this job" : f.job;
      box.append(el("span", "fuse-state", `fuse ${name}: ${why}`));
      out.push(box);
      continue;
    }
    const on = f.control ? f.control === "apply" : f.job === "acting";
    const action = on ? "undo" : "apply";
    const button = el("button", `fuse-${action}`, `${action} ${name}`);
    button.type = "button";
    button.title = on
      ? `undo ${name} in the run's job (it acts after its next report)`
      : `apply ${name} in the run's job (it acts after its next report)`;
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const got = await post(`${API}/runs/${encodeURIComponent(a.run_id)}/fuses`, {
          fuse: f.fuse,
          action,
          alert_id: a.id,
        });
        const fuses = (a.fuses || []).map((g) => ({
          ...g,
          control: got.fuses?.[g.fuse] ?? g.control,
          actions: (got.log || []).filter((e) => e.fuse === g.fuse),
        }));
        rerender({ ...a, fuses });
      } catch (e) {
        button.disabled = false;
        button.textContent = `${action} ${name} failed: ${e.message}`;
      }
    });
    const said = lastAction(f);
    box.append(el("span", "fuse-state", `fuse ${name} (job: ${f.job})${said ? `, ${said}` : ""}`), button);
    out.push(box);
  }
  return out;
}
