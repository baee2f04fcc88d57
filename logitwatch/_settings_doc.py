"""docs/SETTINGS.md, generated from the code: every collector setting (``Settings``) and
every client setting (``ClientConfig``) with its variable, default and meaning, so the
reference cannot drift from what is read. ``python -m logitwatch._settings_doc`` prints it;
a test checks the file equals it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic_core import PydanticUndefined

HEADER = """# Settings

Generated from the code by `python -m logitwatch._settings_doc > docs/SETTINGS.md` (a test
checks it is current). Every setting is read from its `LOGITWATCH_*` variable; a command
line option, where there is one, wins (`logitwatch serve --help`).

## Collector (`logitwatch serve`, `logitwatch replay`)

`server/settings.py` (`Settings`). A variable that is set but names no setting is warned of
at start, with the name meant.

| variable | default | meaning |
| --- | --- | --- |
"""

CLIENT = """
## Client (in the training job)

`client/config.py` (`ClientConfig`). `logitwatch.attach(...)` and the framework callbacks
build it from these variables (`ClientConfig.from_env`); in code, pass
`attach(..., client=Client(url, run=..., config=ClientConfig(max_queue=...)))`.

| variable | default | meaning |
| --- | --- | --- |
"""


#: (variable, read by, meaning) of the variables that are not settings.
OTHER = (
    ("`LOGITWATCH_HOME`", "every command, the client",
     "where the default store (`logitwatch.db`) and the spool live (default: "
     "`~/.local/share/logitwatch` for the store, `~/.cache/logitwatch/spool` for the spool)"),
    ("`LOGITWATCH_ALERT_RULES`", "`serve`, `replay`, `demo`",
     "a YAML rules file merged over the default rules (docs/ALERTS.md)"),
    ("`LOGITWATCH_TORCH_INDEX`", "`scripts/demo.sh`",
     "the index the CPU torch build comes from (empty: your pip configuration only)"),
    ("`LOGITWATCH_TEST_PG_URL`, `LOGITWATCH_REQUIRE_PG`, `LOGITWATCH_REQUIRE_BROWSER`",
     "the tests", "the PostgreSQL the tests use (`scripts/test.sh` starts one), and whether "
     "a missing PostgreSQL or Chromium fails the tests instead of skipping them"),
)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"
    return str(value)


def _client_docs() -> dict[str, str]:
    """Each ``ClientConfig`` attribute's text, from its docstring's ``Attributes:``."""
    from logitwatch.client.config import ClientConfig

    doc = (ClientConfig.__doc__ or "").split("Attributes:", 1)[-1]
    out: dict[str, str] = {}
    for m in re.finditer(r"^ {8}(\w+): (.*?)(?=^ {8}\w+: |\Z)", doc, re.S | re.M):
        out[m.group(1)] = m.group(2)
    return out


def render() -> str:
    """The whole of docs/SETTINGS.md."""
    from logitwatch.client.config import ClientConfig
    from logitwatch.server.settings import Settings

    lines = [HEADER]
    for name, f in Settings.model_fields.items():
        default = ("see meaning" if f.default is PydanticUndefined else _default(f.default))
        lines.append(f"| `LOGITWATCH_{name.upper()}` | {default} | "
                     f"{_cell(f.description or '')} |\n")
    lines.append(CLIENT)
    docs = _client_docs()
    for f in dataclasses.fields(ClientConfig):
        lines.append(f"| `LOGITWATCH_{f.name.upper()}` | {_default(f.default)} | "
                     f"{_cell(docs.get(f.name, ''))} |\n")
    lines.append("\n## Other variables\n\n| variable | read by | meaning |\n"
                 "| --- | --- | --- |\n")
    lines += [f"| {var} | {who} | {what} |\n" for var, who, what in OTHER]
    return "".join(lines)


if __name__ == "__main__":
    print(render(), end="")
