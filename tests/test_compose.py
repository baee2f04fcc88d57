"""docker-compose.yml is validated offline against the compose specification (no engine here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_matches_the_compose_spec() -> None:
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    r = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec",
                        str(ROOT / "docker-compose.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_collector_uses_the_postgres_service() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    col, pg = spec["services"]["collector"], spec["services"]["postgres"]
    assert "@postgres:5432/" in col["environment"]["LOGITWATCH_DB_URL"]
    assert col["environment"]["LOGITWATCH_DB_URL"].startswith("postgresql+psycopg://")
    assert col["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in pg and (ROOT / "Dockerfile").exists()
