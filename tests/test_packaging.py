"""One distribution, one import name; the collector and client install without torch."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )
    (whl,) = out.glob("logitwatch-*.whl")
    return zipfile.ZipFile(whl)


def test_only_the_logitwatch_package_is_installed(wheel: zipfile.ZipFile) -> None:
    tops = {n.split("/")[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"logitwatch"}


def test_every_source_folder_and_asset_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for folder, pkg in [("hooks", "hooks"), ("client", "client"), ("server", "server"),
                        ("web", "web"), ("migrations", "migrations")]:
        for f in (ROOT / folder).rglob("*"):
            wanted = f.suffix in {".py", ".html", ".js", ".css", ".mako"}
            if wanted and "__pycache__" not in f.parts:
                rel = f.relative_to(ROOT / folder).as_posix()
                assert f"logitwatch/{pkg}/{rel}" in names, f"{folder}/{rel} is not packaged"
    assert "logitwatch/demo/data/corpus.txt" in names


def test_server_and_client_never_import_torch() -> None:
    code = ("import sys, logitwatch, logitwatch.client, logitwatch.server.app, logitwatch.cli;"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
