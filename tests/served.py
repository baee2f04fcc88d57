"""``logitwatch serve`` as a user starts it: a real process on a loopback port, for the tests
of the command line (store, install, errors). Not a test module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from logitwatch.demo.runner import free_port


class Served:
    """``logitwatch serve --port P ARGS`` started by ``command`` (default: this Python's
    ``-m logitwatch.cli``) in ``cwd``, its output in ``log``; :meth:`stop` ends it."""

    def __init__(self, tmp: Path, *args: str, command: list[str] | None = None,
                 cwd: Path | None = None, env: dict[str, str] | None = None,
                 timeout: float = 60) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        cmd = [*(command or [sys.executable, "-m", "logitwatch.cli"]), "serve",
               "--port", str(self.port), "--log-level", "warning", *args]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=cwd, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited ({self.proc.returncode}): {self.output}")
            try:
                if httpx.get(self.url + "/api/v1/session", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"serve did not answer within {timeout} s: {self.output}")
            time.sleep(0.1)

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
