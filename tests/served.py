"""``logitwatch serve`` as a user starts it: a real process on a loopback port, for the tests
of the command line (store, install, errors) and the hostile-day tests. Not a test module."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from logitwatch.demo.runner import free_port


class Served:
    """``logitwatch serve --port P ARGS`` started by ``command`` (default: this Python's
    ``-m logitwatch.cli``) in ``cwd``, its output in ``log``; :meth:`stop` ends it.

    ``port``: a given port (a collector restarted where its clients post), else a free one;
    ``nofile``: the open-file limit of the process (a collector out of descriptors).
    It is up once ``GET /api/v1/session`` answers ``up_status`` (200; 401 when its store
    holds tokens and the request carries none)."""

    def __init__(self, tmp: Path, *args: str, command: list[str] | None = None,
                 cwd: Path | None = None, env: dict[str, str] | None = None,
                 timeout: float = 60, port: int | None = None,
                 nofile: int | None = None, up_status: int = 200) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        cmd = [*(command or [sys.executable, "-m", "logitwatch.cli"]), "serve",
               "--port", str(self.port), "--log-level", "warning", *args]

        def limit_files() -> None:  # in the child
            assert nofile is not None
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log, "ab") as out:  # a restart on the same port appends
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=cwd, env={**os.environ, **(env or {})},
                                         preexec_fn=limit_files if nofile is not None else None)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited ({self.proc.returncode}): {self.output}")
            try:
                if httpx.get(self.url + "/api/v1/session",
                             timeout=2).status_code == up_status:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"serve did not answer within {timeout} s: {self.output}")
            time.sleep(0.05)

    def get(self, path: str, **params: Any) -> Any:
        """``GET path`` (JSON), asserting a 200."""
        r = httpx.get(self.url + path, params=params, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def run_id(self, name: str) -> int:
        return next(r["id"] for r in self.get("/api/v1/runs") if r["name"] == name)

    def steps(self, run: str, name: str = "loss") -> list[int]:
        """Every step of ``run``'s series ``name``, sorted."""
        s = self.get(f"/api/v1/runs/{self.run_id(run)}/series", name=name, max_points=100_000)
        return sorted(s["steps"])

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
