"""What the storage benchmarks share: the frames' shapes (a 24-layer x 16-head model, four
per-head statistics, four scalars), a generator of plausible frames, a free port, a median
timer."""

from __future__ import annotations

import json
import socket
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

L, H = 24, 16
HEAD_METRICS = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std")
SCALARS = ("loss", "grad.norm", "grad.clipped", "lr")
VALUES_PER_FRAME = len(HEAD_METRICS) * L * H + len(SCALARS)
BATCH = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_frames(run: str, n: int, seed: int = 0, rank: int = 0) -> list[dict[str, Any]]:
    """``n`` frames of a plausible run: logits with noise, one head drifting up."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(4, 12, size=(L, H))
    out = []
    for i in range(n):
        mx = base + rng.normal(0, 0.3, size=(L, H))
        mx[3, 5] += i * 0.002
        heads = {"attn.logit_max": np.round(mx, 4).tolist(),
                 "attn.logit_p99": np.round(mx * 0.7, 4).tolist(),
                 "attn.logit_mean": np.round(rng.normal(0, 1, (L, H)), 4).tolist(),
                 "attn.logit_std": np.round(rng.uniform(0.5, 2, (L, H)), 4).tolist()}
        out.append({"run": run, "rank": rank, "seq": i, "step": i * 10, "time": 1.7e9 + i,
                    "scalars": {"loss": 3.0 + float(rng.normal(0, 0.05)),
                                "grad.norm": float(rng.uniform(0.5, 1.5)),
                                "grad.clipped": 0.0, "lr": 3e-4},
                    "heads": heads})
    return out


def bodies(frames: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps({"frames": frames[i:i + BATCH]}).encode()
            for i in range(0, len(frames), BATCH)]


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def sqlite_bytes(path: Path) -> int:
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    return path.stat().st_size
