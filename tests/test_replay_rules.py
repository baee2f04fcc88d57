"""``logitwatch replay`` judges frames with the rules ``logitwatch serve`` would apply: the
defaults with the settings, the YAML file (``--rules`` or ``$LOGITWATCH_ALERT_RULES``) and
the rules stored through the API in the database it writes to."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from logitwatch.cli import main as cli
from logitwatch.server.alerts.defaults import RULES_ENV
from logitwatch.server.alerts.replay import replay
from logitwatch.server.db.models import AlertRule
from logitwatch.server.db.session import make_engine, migrate, session_scope

RULES = """
rules:
  - name: big_loss
    kind: threshold
    metric: loss
    params: {value: 8}
    severity: critical
  - name: loss_jump
    kind: loss_jump
    metric: loss
    enabled: false
"""


def frames() -> list[dict[str, Any]]:
    """A loss that sits at 2.5 for 25 samples, then jumps to 9 (loss_jump fires)."""
    return [{"run": "r", "rank": 0, "seq": i, "step": 10 * i, "time": 1000.0 + i,
             "scalars": {"loss": 2.5 - 0.001 * i if i < 25 else 9.0}} for i in range(28)]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "run.jsonl"
    data.write_text("\n".join(json.dumps(f) for f in frames()) + "\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    return data, rules


def rules_fired(output: str) -> set[str]:
    return {a["rule"] for a in json.loads(output)}


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    r = CliRunner().invoke(cli, ["replay", *args, "--json"], env=env)
    assert r.exit_code == 0, r.output + r.stderr
    return r


def test_defaults(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RULES_ENV, raising=False)
    r = run(str(files[0]))
    assert rules_fired(r.stdout) == {"loss_jump"}
    assert re.search(r"rules: defaults: \d+ rules", r.stderr), r.stderr


def test_rules_file_from_the_environment_as_serve(files: tuple[Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data, rules = files
    monkeypatch.setenv(RULES_ENV, str(rules))
    r = run(str(data))
    assert rules_fired(r.stdout) == {"big_loss"}
    assert f"rules: defaults + {rules}: " in r.stderr
    # the function's default is the same
    assert {a.rule for a in replay(frames()).alerts} == {"big_loss"}


def test_rules_option_names_the_file(files: tuple[Path, Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data, rules = files
    monkeypatch.delenv(RULES_ENV, raising=False)
    r = run(str(data), "--rules", str(rules))
    assert rules_fired(r.stdout) == {"big_loss"}
    assert f"rules: defaults + {rules}: " in r.stderr


def test_settings_apply(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RULES_ENV, raising=False)
    monkeypatch.setenv("LOGITWATCH_ALERT_FOR_SAMPLES", "7")
    got = replay(frames())
    assert "defaults with alert_for_samples" in got.rules



def test_the_ingest_limits_of_serve_apply(files: tuple[Path, Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the collector would refuse (more metric names than a run may have) is refused
    by replay too, the lines named, not replayed; its batches keep to the frame limit."""
    data, _ = files
    monkeypatch.delenv(RULES_ENV, raising=False)
    wide = [{**f, "scalars": {**f["scalars"], **{f"m{k}": 1.0 for k in range(6)}}}
            for f in frames()]
    monkeypatch.setenv("LOGITWATCH_MAX_METRICS_PER_RUN", "5")
    with pytest.raises(Exception, match=r"frame 1 to frame 16: .*max_metrics_per_run"):
        replay(wide)
    monkeypatch.delenv("LOGITWATCH_MAX_METRICS_PER_RUN")
    whole = [(a.rule, a.fired_step) for a in replay(frames()).alerts]
    monkeypatch.setenv("LOGITWATCH_MAX_FRAMES_PER_REQUEST", "8")  # batches of 8, not 16
    assert [(a.rule, a.fired_step) for a in replay(frames()).alerts] == whole != []
    monkeypatch.delenv("LOGITWATCH_MAX_FRAMES_PER_REQUEST")
    data.write_text("\n".join(json.dumps(f) for f in wide) + "\n")
    r = CliRunner().invoke(cli, ["replay", str(data)],
                           env={"LOGITWATCH_MAX_METRICS_PER_RUN": "5"})
    assert r.exit_code != 0 and "max_metrics_per_run" in r.output + r.stderr, r.output

def test_api_rules_of_the_database_apply(files: tuple[Path, Path], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RULES_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'collector.db'}"
    engine = make_engine(url)
    try:
        migrate(engine)
        from sqlalchemy.orm import sessionmaker

        with session_scope(sessionmaker(engine)) as s:
            s.add(AlertRule(name="api_loss", updated_at=time.time(), spec={
                "name": "api_loss", "kind": "threshold", "metric": "loss",
                "params": {"value": 8.5}, "severity": "critical"}))
    finally:
        engine.dispose()
    r = run(str(files[0]), "--db", url)
    assert rules_fired(r.stdout) == {"loss_jump", "api_loss"}
    assert "+ 1 API rule from the database" in r.stderr


def test_a_bad_rules_file_is_named(files: tuple[Path, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    kind: nope\n    metric: loss\n")
    r = CliRunner().invoke(cli, ["replay", str(files[0]), "--rules", str(bad)])
    assert r.exit_code != 0 and "bad.yaml" in r.stderr
