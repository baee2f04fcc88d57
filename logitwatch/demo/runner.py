"""``logitwatch demo``: a collector on SQLite plus three demo jobs streaming to it (the
unstable run, the same run with fuses on auto, and its healthy twin).

The jobs run as separate processes (one CPU thread each), exactly as a user's training
job would: they only know the collector's URL.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

__all__ = ["DEFAULT_SETTINGS", "Collector", "run_demo"]

#: The demo's jobs, in this order: diverging, trained through by its fuses, healthy twin.
DEFAULT_SETTINGS = ("unstable", "fused", "healthy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Collector:
    """A real uvicorn collector in a background thread, bound to 127.0.0.1."""

    def __init__(self, db_url: str, port: int = 0, **settings: Any) -> None:
        import uvicorn

        from logitwatch.server.app import create_app
        from logitwatch.server.settings import Settings

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(Settings(db_url=db_url, port=self.port, **settings))
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                           timeout_graceful_shutdown=2)
        )
        self.thread = threading.Thread(target=self.server.run, name="collector", daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the collector did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def _stream(proc: subprocess.Popen[str], echo: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        echo(line.rstrip())


def run_jobs(url: str, *, settings: list[str], steps: int | None, seed: int, stamp: str,
             echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run one job process per setting side by side; return their JSON summaries."""
    # the jobs' summaries are read back here and printed: nothing to keep afterwards
    with tempfile.TemporaryDirectory(prefix="logitwatch-demo-") as tmp:
        return _run_jobs(url, Path(tmp), settings=settings, steps=steps, seed=seed,
                         stamp=stamp, echo=echo)


def _run_jobs(url: str, out_dir: Path, *, settings: list[str], steps: int | None, seed: int,
              stamp: str, echo: Callable[[str], None]) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs = []
    for name in settings:
        cmd = [sys.executable, "-m", "logitwatch.demo.job", "--setting", name, "--url", url,
               "--run", f"{name}-{stamp}", "--seed", str(seed),
               "--result", str(out_dir / f"{name}.json")]
        if steps:
            cmd += ["--steps", str(steps)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        t = threading.Thread(target=_stream, args=(proc, echo), daemon=True)
        t.start()
        procs.append((name, proc, t))
    results = []
    for name, proc, t in procs:
        rc = proc.wait()
        t.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
        f = out_dir / f"{name}.json"
        if rc != 0 or not f.exists():
            raise RuntimeError(f"the {name} demo job failed (exit code {rc}); see its output above")
        results.append(json.loads(f.read_text()))
    return results


def first_alerts(url: str, run_name: str) -> dict[str, Any] | None:
    """The first alert the collector stored for ``run_name`` (by fired step)."""
    runs = httpx.get(f"{url}/api/v1/runs", timeout=10).json()
    rid = next((r["id"] for r in runs if r["name"] == run_name), None)
    if rid is None:
        return None
    alerts = httpx.get(f"{url}/api/v1/runs/{rid}/alerts", timeout=10).json()
    alerts.sort(key=lambda a: a["fired_step"])
    return ({"run_id": rid, **alerts[0]} if alerts else {"run_id": rid})


def _loss(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and x == x else "NaN"


def fuse_line(f: dict[str, Any]) -> str:
    """What a job's fuses did (``job.fuse_summary``), in words."""
    parts = []
    if f.get("clip_steps"):
        parts.append(f"QK-clip clipped on {f['clip_steps']} steps (steps {f['first_clip']}-"
                     f"{f['last_clip']})")
    else:
        parts.append("QK-clip never clipped")
    if f.get("backoffs"):
        parts.append(f"LR backoff started {f['backoffs']} time(s)")
    rb = f.get("rollbacks") or []
    if rb:
        parts.append("rolled back " + ", ".join(f"at {a} to {b}" for a, b in rb))
    return "; ".join(parts)


def run_demo(*, port: int, db_url: str, steps: int | None, settings: list[str] | None,
             seed: int, keep_serving: bool, echo: Callable[[str], None] = print) -> int:
    settings = settings or list(DEFAULT_SETTINGS)
    # The jobs print the alerts they receive; the collector's own alert log would repeat them.
    logging.getLogger("logitwatch.alerts").setLevel(logging.ERROR)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with Collector(db_url, port) as col:
        echo(f"collector: {col.url}")
        echo(f"dashboard: {col.url}/   (runs appear as the jobs start)")
        t0 = time.monotonic()
        results = run_jobs(col.url, settings=settings, steps=steps, seed=seed, stamp=stamp,
                           echo=echo)
        echo("")
        echo(f"demo finished in {time.monotonic() - t0:.0f} s. What happened:")
        echo(f"{'run':<28} {'steps':>6} {'loss diverged':>14} {'first alert':>12} {'lead':>10}"
             f" {'final loss':>10}")
        for r in results:
            a = first_alerts(col.url, r["run"]) or {}
            fired = a.get("fired_step")
            div = r["divergence_step"]
            lead = f"{div - fired} steps" if fired is not None and div is not None else "-"
            div_s = f"step {div}" if div is not None else "no"
            fired_s = f"step {fired}" if fired is not None else "none"
            echo(f"{r['run']:<28} {r['steps']:>6} {div_s:>14} {fired_s:>12} {lead:>10}"
                 f" {_loss(r.get('final_loss_50')):>10}")
            if a.get("message"):
                echo(f"  first alert: {a['message']}")
            if r.get("fuses") is not None:
                echo(f"  fuses: {fuse_line(r['fuses'])}")
            if "run_id" in a:
                echo(f"  chart: {col.url}/runs/{a['run_id']}")
        echo("Loss 'diverged' = first step whose loss is non-finite or whose 10-step mean "
             "exceeds the lowest 10-step mean so far by more than 1 nat (see README); final "
             "loss = mean of the last 50 steps.")
        echo("The runs stay in the store: `logitwatch runs list` lists them from any "
             "directory and `logitwatch serve` shows them again (with the same --db, if "
             "you gave one).")
        if keep_serving:
            echo(f"\nThe dashboard stays up at {col.url}/  -- press Ctrl-C to stop.")
            try:
                while col.thread.is_alive():
                    time.sleep(1)
            except KeyboardInterrupt:
                echo("stopping")
    return 0
