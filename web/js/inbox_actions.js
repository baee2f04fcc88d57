// Acknowledge and silence buttons of the alerts inbox, on the alert engine's API:
//   POST /api/v1/alerts/{id}/ack          -> the alert, with acked_at / acked_by
//   GET|POST /api/v1/alerts/silences      -> silences (null fields match anything)

import { API, ApiError, el, getJSON } from "./api.js";
import { fuseActions } from "./fuse_actions.js";

const DURATIONS = [
  ["1 h", 3600],
  ["8 h", 8 * 3600],
  ["1 day", 86400],
  ["1 week", 7 * 86400],
];

async function send(method, url, body) {
  const res = await fetch(url, {
    method,
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
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

function matches(s, a) {
  const now = Date.now() / 1000;
  return (
    s.starts_at <= now &&
    now < s.ends_at &&
    (s.project == null || s.project === a.project) &&
    (s.run == null || s.run === a.run) &&
    (s.rule == null || s.rule === a.rule) &&
    (s.rank == null || s.rank === a.rank) &&
    (s.layer == null || s.layer === a.layer)
  );
}

/**
 * (alert) => [elements] for a card: "acknowledge" (or who acknowledged it) and "silence"
 * with a duration (or until when it is silenced). `rerender(alert)` gets changed alerts.
 */
export function alertActions(_base, rerender) {
  let silences = [];
  getJSON(`${API}/alerts/silences`)
    .then((list) => {
      silences = list;
    })
    .catch((e) => console.warn("silences unavailable", e));

  return (a) => {
    const out = fuseActions(a, rerender);
    if (a.acked_at != null) {
      out.push(el("span", "acked", `acknowledged${a.acked_by ? ` by ${a.acked_by}` : ""}`));
    } else if (a.state === "firing") {
      const ack = el("button", "ack", "acknowledge");
      ack.type = "button";
      ack.title = "someone is on it (the alert keeps firing until it resolves)";
      ack.addEventListener("click", async () => {
        ack.disabled = true;
        try {
          const updated = await send("POST", `${API}/alerts/${encodeURIComponent(a.id)}/ack`);
          rerender({ ...a, ...updated });
        } catch (e) {
          ack.disabled = false;
          ack.textContent = `acknowledge failed: ${e.message}`;
        }
      });
      out.push(ack);
    }
    const active = silences.find((s) => matches(s, a));
    if (active) {
      out.push(el("span", "silenced", `silenced until ${new Date(active.ends_at * 1000).toLocaleString()}`));
      return out;
    }
    const pick = el("select", "silence-for");
    pick.title = "silence this rule on this head (or run) for";
    for (const [label, seconds] of DURATIONS) pick.append(new Option(label, String(seconds)));
    const silence = el("button", "silence", "silence");
    silence.type = "button";
    silence.title = "stop notifications for this rule on this layer of this run";
    silence.addEventListener("click", async () => {
      silence.disabled = true;
      try {
        const s = await send("POST", `${API}/alerts/silences`, {
          project: a.project,
          run: a.run,
          rule: a.rule,
          rank: a.rank,
          layer: a.layer,
          duration_s: Number(pick.value),
          comment: `from the dashboard, alert ${a.id}`,
        });
        silences.push(s);
        rerender({ ...a, _silenced: s.id });
      } catch (e) {
        silence.disabled = false;
        silence.textContent = `silence failed: ${e.message}`;
      }
    });
    out.push(pick, silence);
    return out;
  };
}
