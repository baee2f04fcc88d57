"""What the dashboard's browser tests share (``test_dashboard*.py``): the model's shape, how
long a page may take, a real collector in a background thread, a head's max logits that
climb from a given sample, and a checked ingest. Not a test module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from logitwatch.demo.runner import Collector as LiveCollector

LAYERS, HEADS = 2, 4
WAIT_MS = 10_000


class Collector(LiveCollector):
    """A real collector on 127.0.0.1:<free port>, served by uvicorn in a background thread."""

    def __init__(self, db: Path) -> None:
        super().__init__(f"sqlite:///{db}", stream_interval=0.2)
        self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)
        assert not self.thread.is_alive(), "the collector did not stop"


def logits(i: int, climbing: dict[tuple[int, int], int]) -> list[list[float]]:
    """Every head sits near 5; a head in ``climbing`` jumps to 40+ from sample ``start``."""
    m = [[5.0 + 0.1 * ((i + 3 * layer + head) % 4) for head in range(HEADS)]
         for layer in range(LAYERS)]
    for (layer, head), start in climbing.items():
        if i >= start:
            m[layer][head] = 40.0 + 5.0 * (i - start)
    return m


def ingest(url: str, batch: list[dict[str, Any]]) -> dict[str, Any]:
    # 1,000 wide frames per call: a loaded 2-core machine took over 10 s to store them once
    # (a read timeout, not a wrong answer); the timeout only bounds a hung collector
    r = httpx.post(f"{url}/api/v1/ingest", json={"frames": batch}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()
