"""What the recorded-scenario tests share (``test_scenarios.py``, ``test_scenario_frames.py``,
``test_scenario_rounds.py``): where the bench and its recorded runs are, loading a bench
module, and a default rule taken back through a rules file as ``bench_alerts.py --rules``
reads it. Not a test module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench"
FILES = sorted((BENCH / "scenarios").glob("*.jsonl.gz"))


def load(name: str) -> ModuleType:
    """The bench module ``name`` (``bench/<name>.py``), loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the bench modules import each other
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def default_entry(name: str) -> dict[str, Any]:
    """The default rule ``name`` as an entry of a rules YAML (a dict to edit)."""
    from logitwatch.server.alerts.defaults import DEFAULT_RULES

    return next(r for r in DEFAULT_RULES if r.name == name).to_dict()


def over_defaults(tmp_path: Path, *rules: dict[str, Any]) -> list[Any]:
    """The default rules with ``rules`` replacing those of their names, written to a rules
    YAML and read back as ``bench_alerts.py --rules`` reads it: a change taken back."""
    import yaml

    path = tmp_path / f"rules{len(list(tmp_path.glob('rules*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"rules": list(rules)}))
    return load("bench_alerts").rules_over_defaults(path)
