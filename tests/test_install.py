"""The README's install path, as a newcomer takes it: the wheel that ``python -m build``
makes, installed with pip into a fresh virtual environment, then ``logitwatch --help``,
``logitwatch serve`` (a real uvicorn on loopback) and a training job attached to it; and the
demo script's help and torch choice, which must install nothing.

The fresh environment gets only the wheel from pip (``--no-deps --no-index``: no network,
never a CUDA torch); its dependencies are this environment's, made visible through a
``.pth`` file, after checking that they satisfy every requirement the wheel declares.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest

from logitwatch.cli import main
from tests.served import Served

ROOT = Path(__file__).resolve().parents[1]

#: Run by the fresh environment's Python: every requirement of logitwatch[hooks,server]
#: is met by an installed distribution.
CHECK_REQUIREMENTS = """
import importlib.metadata as md
from packaging.requirements import Requirement
unmet = []
for text in md.requires("logitwatch") or []:
    req = Requirement(text)
    if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", "hooks",
                                                                         "server")):
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(f"{req} (missing)")
        continue
    if not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req} (have {have})")
assert not unmet, unmet
"""

#: A training job as README shows it: attach, train a few steps, close.
JOB = """
import sys, torch, torch.nn.functional as F
import logitwatch
print(logitwatch.__file__, flush=True)

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.head = torch.nn.Linear(32, 64)
    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(y.transpose(1, 2).reshape(2, 8, 32))

torch.manual_seed(0)
model = Block()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
mon = logitwatch.attach(model, opt, run="first-job", url=sys.argv[1], sample_every=1)
for step in range(5):
    x = torch.randn(2, 8, 32)
    loss = F.cross_entropy(model(x).reshape(-1, 64), torch.randint(0, 64, (16,)))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
    mon.log(loss=loss)
mon.close()
"""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the built wheel installed; its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("install")
    dist = tmp / "dist"
    # Run from tmp: in the source tree, setuptools' build/ folder would shadow `build`.
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
         str(ROOT)], cwd=tmp, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("logitwatch-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.stdout.strip()) / "zz_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", f"{wheel}[hooks,server]"],
        capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    yield venv / "bin"
    shutil.rmtree(tmp, ignore_errors=True)


def test_the_wheel_declares_what_it_needs(fresh: Path) -> None:
    r = subprocess.run([str(fresh / "python"), "-c", CHECK_REQUIREMENTS], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def test_installed_wheel_serves_and_a_job_attaches(fresh: Path, tmp_path: Path) -> None:
    env = {"LOGITWATCH_HOME": str(tmp_path / "home"), "PYTHONWARNINGS": "ignore"}
    helped = subprocess.run([str(fresh / "logitwatch"), "--help"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert helped.returncode == 0 and "serve" in helped.stdout and "demo" in helped.stdout

    with Served(tmp_path, command=[str(fresh / "logitwatch")], cwd=tmp_path, env=env) as col:
        job = subprocess.run([str(fresh / "python"), "-c", JOB, col.url], capture_output=True,
                             text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, **env, "OMP_NUM_THREADS": "1"})
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.stdout.splitlines()[0].startswith(str(fresh.parent)), job.stdout
        run = httpx.get(f"{col.url}/api/v1/runs/first-job", timeout=10).json()
        names = {m["name"] for m in
                 httpx.get(f"{col.url}/api/v1/runs/first-job/metrics", timeout=10).json()}
        listed = subprocess.run([str(fresh / "logitwatch"), "runs", "list"], env={
            **os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run["status"] == "finished" and run["last_step"] == 4, run
    assert {"loss", "grad.norm", "attn.logit_max"} <= names
    assert f"store: sqlite:///{(tmp_path / 'home').resolve() / 'logitwatch.db'}" in col.output
    assert "first-job" in listed.stdout and "finished" in listed.stdout, listed


# --- scripts/demo.sh ----------------------------------------------------------------------


def sandbox(tmp_path: Path) -> Path:
    """A checkout with only the scripts and the pin: what demo.sh sees on a fresh clone."""
    root = tmp_path / "clone"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    shutil.copy(ROOT / "constraints-cpu.txt", root)
    return root


def test_demo_help_installs_nothing(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    r = subprocess.run(["bash", str(root / "scripts" / "demo.sh"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("Usage: scripts/demo.sh"), r
    assert not (root / ".venv").exists()  # nothing installed (not a wall time: a shared box)
    assert "LOGITWATCH_PORT" in r.stdout  # the port's default, as `logitwatch demo` takes it
    demo = main.commands["demo"]
    for p in demo.params:
        if isinstance(p, click.Option):
            assert all(o in r.stdout for o in p.opts + p.secondary_opts), (p.opts, r.stdout)
    assert "--system-site-packages" in r.stdout  # how to keep an existing (GPU) torch


class _TorchIndex(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def torch_args(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f"source {root}/scripts/_env.sh; torch_index_args"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU index is for Linux")
def test_demo_takes_a_cpu_torch_from_the_cpu_index_when_it_answers(tmp_path: Path) -> None:
    root = sandbox(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TorchIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_port}/whl/cpu"
        up = torch_args(root, LOGITWATCH_TORCH_INDEX=index)
        assert up.returncode == 0 and up.stdout.strip() == f"--index-url {index}", up
    finally:
        server.shutdown()
        server.server_close()
    # An index that does not answer (no internet, a mirror-only machine): the pip
    # configuration alone, said once, and no time lost in pip's retries.
    down = torch_args(root, LOGITWATCH_TORCH_INDEX=index)
    assert down.returncode == 0 and down.stdout.strip() == ""
    assert "does not answer: torch comes from your pip configuration" in down.stderr
    off = torch_args(root, LOGITWATCH_TORCH_INDEX="")
    assert off.returncode == 0 and off.stdout.strip() == "" and off.stderr == ""


def test_demo_keeps_the_torch_the_venv_has(tmp_path: Path) -> None:
    """A .venv that has a torch (any build: a GPU one through --system-site-packages) keeps
    it: no pip run, and the build is named."""
    root = sandbox(tmp_path)
    (root / ".venv" / "bin").mkdir(parents=True)
    python = root / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    r = subprocess.run(["bash", "-c", f"source {root}/scripts/_env.sh; install_torch"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import torch

    assert f"keeping the torch .venv has: {torch.__version__}" in r.stdout
    assert "installing" not in r.stdout
