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


def test_the_collectors_sit_behind_one_address() -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    collectors = [n for n, s in services.items() if "logitwatch" in str(s.get("command"))]
    assert len(collectors) >= 2
    assert all("ports" not in services[n] for n in collectors)  # reached through the proxy
    proxy = services["proxy"]
    assert proxy["ports"] == ["8000:80"] and set(proxy["depends_on"]) == set(collectors)
    mount = proxy["volumes"][0].split(":")[0]
    conf = (ROOT / mount).read_text()
    for name in collectors:  # every collector is an upstream of the one address
        assert f"server {name}:8000" in conf
    assert "proxy_buffering off" in conf  # the live stream is not held back
