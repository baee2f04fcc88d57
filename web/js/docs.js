// The API page: every path and method of /openapi.json with its summary and parameters.
// Built with text nodes only (el), so nothing in the document runs as code.

import { el } from "./api.js";

async function main() {
  const root = document.getElementById("api");
  const res = await fetch("/openapi.json", { headers: { Accept: "application/json" } });
  if (!res.ok) {
    root.append(el("p", null, `could not read /openapi.json (HTTP ${res.status})`));
    return;
  }
  const doc = await res.json();
  root.append(el("h2", null, `${doc.info?.title ?? "API"} ${doc.info?.version ?? ""}`));
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const [method, op] of Object.entries(item)) {
      const params = (op.parameters ?? []).map((p) => `${p.name} (${p.in})`).join(", ");
      const section = el("section", "card");
      section.append(
        el("h3", null, `${method.toUpperCase()} ${path}`),
        el("p", null, op.summary ?? ""),
        el("pre", null, op.description ?? ""),
      );
      if (params) section.append(el("p", "meta", `parameters: ${params}`));
      root.append(section);
    }
  }
}

main();
