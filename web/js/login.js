// The login form, shown when the collector asks for a token (401).
//
// The read token is sent once, to POST /api/v1/session; the collector answers with an
// HttpOnly, SameSite=Strict cookie that the API calls and the live stream then carry. The
// token is never kept by the page (no localStorage, nothing script-readable).

import { API, ApiError, el } from "./api.js";

/** True when `err` is the collector asking for a (valid) token. */
export function needsLogin(err) {
  return err instanceof ApiError && err.status === 401;
}

/** Show the form (once) with the collector's reason; reloads the page after a login. */
export function showLogin(reason) {
  document.body.dataset.login = "1";
  if (document.getElementById("login")) return;
  const form = el("form", "login card");
  form.id = "login";
  const input = el("input");
  input.type = "password";
  input.name = "token";
  input.id = "login-token";
  input.autocomplete = "off";
  input.placeholder = "lw_…";
  input.required = true;
  const label = el("label", null, "read token");
  label.htmlFor = input.id;
  const button = el("button", null, "log in");
  button.type = "submit";
  const error = el("p", "login-error");
  error.id = "login-error";
  form.append(
    el("h2", null, "This collector needs a token"),
    el("p", "hint", reason || ""),
    el("p", "hint", "Create one with: logitwatch token create --project <project> --scope read"),
    label,
    input,
    button,
    error,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    const res = await fetch(`${API}/session`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ token: input.value.trim() }),
    });
    if (res.ok) {
      location.reload();
      return;
    }
    let body = {};
    try {
      body = await res.json();
    } catch {
      /* keep the status */
    }
    error.textContent = body.message || `login failed (${res.status})`;
  });
  (document.querySelector("main") || document.body).prepend(form);
  input.focus();
}
