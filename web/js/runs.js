// The runs page: every run with its last step and open alerts, refreshed every few seconds.

import { API, ago, el, getJSON } from "./api.js";
import { needsLogin, showLogin } from "./login.js";

const REFRESH_MS = 3000;

const table = document.getElementById("runs-table");
const body = table.querySelector("tbody");
const empty = document.getElementById("runs-empty");
const status = document.getElementById("status");

function row(run) {
  const tr = el("tr");
  tr.dataset.runId = String(run.id);
  const name = el("td", "name");
  const link = el("a", null, run.name);
  link.href = `/runs/${encodeURIComponent(run.id)}`;
  name.append(link);
  const alerts = el("td", "num");
  const badge = el("span", run.open_alerts > 0 ? "badge firing" : "badge ok", run.open_alerts);
  badge.title = run.open_alerts > 0 ? `${run.open_alerts} alert(s) firing` : "no alert firing";
  alerts.append(badge);
  tr.append(
    name,
    el("td", null, run.project),
    el("td", "num", run.last_step ?? "—"),
    el("td", "num", ago(run.last_time)),
    alerts,
  );
  return tr;
}

async function refresh() {
  let again = true;
  try {
    const runs = await getJSON(`${API}/runs`);
    body.replaceChildren(...runs.map(row));
    table.hidden = runs.length === 0;
    empty.hidden = runs.length !== 0;
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.dataset.state = "ok";
  } catch (err) {
    if (needsLogin(err)) {
      again = false; // the page reloads after a login
      status.textContent = "log in to see runs";
      status.dataset.state = "error";
      showLogin(err.message);
      return;
    }
    status.textContent = `collector unreachable (${err.message}); retrying`;
    status.dataset.state = "error";
    console.warn("runs refresh failed", err);
  } finally {
    document.body.dataset.ready = "1";
    if (again) setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
