"""The project's documents stand alone: every file they (and the code) point to exists, and
docs/DESIGN.md holds the whole signal catalog."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target) in Markdown
DOC_PATH = re.compile(r"\b((?:docs|bench|scripts|tests|migrations)/[\w./-]+\.(?:md|py|sh|txt))")


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached",
                          *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.splitlines() if (ROOT / p).is_file()]


def test_markdown_links_point_to_files_that_exist() -> None:
    missing = []
    for md in tracked("*.md"):
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                missing.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_project_paths_named_in_code_and_docs_exist() -> None:
    missing = []
    for f in tracked("*.md", "*.py", "*.toml", "*.sh"):
        if "bench/scenarios" in str(f):
            continue
        for path in DOC_PATH.findall(f.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / path).exists() and "*" not in path:
                missing.append(f"{f.relative_to(ROOT)} names {path}")
    assert not missing, missing


def test_the_design_document_holds_every_signal() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    hooks = (ROOT / "docs" / "HOOKS.md").read_text(encoding="utf-8")
    table = hooks.split("## Signals", 1)[1].split("\n### ", 1)[0]
    cells = re.findall(r"^\| (`[^|]+)\|", table, flags=re.M)  # each row's first cell
    signals = {name for cell in cells for name in re.findall(r"`([a-z0-9_.]+)`", cell)}
    assert {"attn.logit_max", "final.logz", "grad.norm", "qk.q_bias_norm"} <= signals
    absent = sorted(s for s in signals if f"`{s}`" not in design
                    and not (s.startswith("hooks.") and "`hooks.*`" in design))
    assert not absent, f"signals of HOOKS.md missing from DESIGN.md: {absent}"
    for topic in ("softmax", "entropy", "QK-norm", "QK-clip", "soft-cap", "z-loss",
                  "log Z", "final.hidden_rms", "clip rate", "warm-up", "bias refuge"):
        assert topic in design, topic


def test_the_settings_reference_is_current() -> None:
    """docs/SETTINGS.md is generated from Settings and ClientConfig: every setting the
    collector or the client reads is there, with the code's default and text."""
    from logitwatch._settings_doc import render
    from logitwatch.cli import _OTHER_ENV

    text = (ROOT / "docs" / "SETTINGS.md").read_text()
    assert text == render(), "run: python -m logitwatch._settings_doc > docs/SETTINGS.md"
    for name in _OTHER_ENV:
        assert f"LOGITWATCH_{name}" in text, name
