"""Scale: one job on 1, 64 and 1,024 ranks through two collectors on one PostgreSQL.

Simulated senders (no torch): frames in the wire format (``logitwatch/wire.py``) of a
32-layer, 32-head model at the default interval (one sampled step in 10, its history of
the 9 steps between), as the hooks send them:

* ``per-rank``: every rank sends its own frame per sampled step (``reduce_ranks=False``):
  8 per-head matrices (``attn.logit_max/p99/mean/std``, ``attn.entropy_mean/min``,
  ``qk.q_weight_norm/k_weight_norm``), 16 scalars, 9 history steps of 4 series;
* ``reduced``: the default under ``torch.distributed`` (``hooks/_reduce.py``): the group's
  rank 0 sends one frame: the same matrices, ``attn.logit_max_rank``, the gathered
  ``ranks.loss`` and ``ranks.final.*`` (1 x ranks each), 21 scalars, its history.

Two real collectors (``logitwatch serve``, uvicorn on loopback, alerts on) share one
PostgreSQL; sender threads post one frame per request, alternating collectors, as fast as
the collectors answer. Measured: values/s stored, p99 request latency, bytes on disk per
frame (relation sizes before and after) and so bytes per sampled step and per day at
~1 step/s (8,640 sampled steps a day, by arithmetic), the collectors' resident memory.

    python bench/bench_scale.py --pg postgresql+psycopg://postgres@127.0.0.1:55433/postgres
        [--values 1500000] [--ranks 1,64,1024] [--modes reduced,per-rank] [--threads 4]

Each scenario sends about ``--values`` values (at least one sampled step); the per-rank
1,024 one sends all 1,024 frames of its sampled step(s). ``--quick`` (a few minutes on a
loaded 2-core machine): ``--values 300000``, per rank at 1 and 64 ranks, reduced at 64 and
1,024 (the per-rank 1,024 case is 1,024 first frames of new (run, rank)s and 8.4 M values
a sampled step). Figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import Server, pg_bytes  # noqa: E402

L, H = 32, 32
EVERY = 10  # the default interval
STEPS_PER_DAY = 86_400  # at ~1 step/s
SAMPLED_PER_DAY = STEPS_PER_DAY // EVERY
PER_HEAD = ["attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
            "attn.entropy_mean", "attn.entropy_min", "qk.q_weight_norm", "qk.k_weight_norm"]
SCALARS = ["loss", "lr", "grad.norm", "grad.clipped", "grad.max_norm", "grad.clip_rate",
           "final.hidden_rms", "final.logz", "final.logit_max", "hooks.host_ms",
           "hooks.syncs", "hooks.bytes", "hooks.sample_every", "hooks.cost_ms",
           "hooks.overhead", "attn.dtype_max"]
REDUCED_SCALARS = ["loss.ranks_mean", "loss.ranks_max", "loss.ranks_min", "reduce.ranks",
                   "reduce.attn_ranks"]
GATHERED = ["loss", "final.hidden_rms", "final.logz", "final.logit_max"]
HISTORY = ["loss", "grad.norm", "grad.clipped", "lr"]


def _matrix_json(rng: np.random.Generator, rows: int, cols: int, lo: float, hi: float) -> str:
    return json.dumps(np.round(rng.uniform(lo, hi, (rows, cols)), 4).tolist())


class Frames:
    """Frame bodies built from a small pool of encoded matrices (the sender's CPU stays
    small next to the collectors')."""

    def __init__(self, ranks: int, reduced: bool, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.ranks, self.reduced = ranks, reduced
        self.pool = []
        for _ in range(4):
            heads = {n: _matrix_json(rng, L, H, 0.5, 12.0) for n in PER_HEAD}
            if reduced:
                heads["attn.logit_max_rank"] = json.dumps(
                    rng.integers(0, ranks, (L, H)).astype(float).tolist())
                for n in GATHERED:
                    heads[f"ranks.{n}"] = _matrix_json(rng, 1, ranks, 2.0, 4.0)
            self.pool.append("{" + ",".join(f'"{k}":{v}' for k, v in heads.items()) + "}")
        names = SCALARS + (REDUCED_SCALARS if reduced else [])
        self.scalars = json.dumps({n: round(float(rng.uniform(0, 5)), 4) for n in names})
        self.values = (len(PER_HEAD) * L * H + len(names) + (EVERY - 1) * len(HISTORY)
                       + ((L * H + len(GATHERED) * ranks) if reduced else 0))

    def senders(self) -> int:
        """Frames per sampled step: one per rank, or one for the group."""
        return 1 if self.reduced else self.ranks

    def body(self, run: str, rank: int, sample: int) -> bytes:
        step = sample * EVERY
        hist = {"steps": list(range(step - EVERY + 1, step)) if sample else [],
                "scalars": {n: [3.0] * (EVERY - 1 if sample else 0) for n in HISTORY}}
        frame = (f'{{"run":"{run}","rank":{rank},"seq":{sample + 1},"step":{step},'
                 f'"time":{1.7e9 + step},"scalars":{self.scalars},'
                 f'"heads":{self.pool[(sample + rank) % len(self.pool)]}'
                 + (f',"history":{json.dumps(hist)}' if sample else "") + "}")
        return ('{"frames":[' + frame + "]}").encode()


def rss_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of a process."""
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            got[line.split(":")[0]] = int(line.split()[1]) / 1024
    return got.get("VmRSS", 0.0), got.get("VmHWM", 0.0)


def send(urls: list[str], bodies: list[bytes], threads: int) -> tuple[float, list[float]]:
    """Post every body (``threads`` at once, alternating collectors); (wall s, latencies s)."""
    todo = list(enumerate(bodies))
    lock = threading.Lock()
    lat: list[float] = []
    errors: list[str] = []

    def work(k: int) -> None:
        with httpx.Client(timeout=300) as c:
            while True:
                with lock:
                    if not todo or errors:
                        return
                    i, body = todo.pop(0)
                url = urls[(i + k) % len(urls)] + "/api/v1/ingest"
                t0 = time.perf_counter()
                r = c.post(url, content=body, headers={"Content-Type": "application/json"})
                while r.status_code == 503:
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                    r = c.post(url, content=body, headers={"Content-Type": "application/json"})
                lat.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:300]}")

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"ingest failed: {errors[0]}")
    return time.perf_counter() - t0, lat


def scenario(pg: str, servers: list[Server], ranks: int, reduced: bool, target: int,
             threads: int) -> dict[str, Any]:
    frames = Frames(ranks, reduced)
    per_step = frames.values * frames.senders()
    samples = max(1, target // per_step)
    run = f"scale-{ranks}-{'red' if reduced else 'all'}-{uuid.uuid4().hex[:4]}"
    senders = [0] if reduced else list(range(ranks))
    # the first sampled step of each sender (run, rank, metrics) is a warm-up, not timed
    send([s.url for s in servers], [frames.body(run, r, 0) for r in senders], threads)
    before = pg_bytes(pg)
    bodies = [frames.body(run, r, s) for s in range(1, samples + 1) for r in senders]
    wall, lat = send([s.url for s in servers], bodies, threads)
    grown = pg_bytes(pg) - before
    step_bytes = grown / samples
    mem = [rss_mb(s.proc.pid) for s in servers]
    return {
        "ranks": ranks, "mode": "reduced" if reduced else "per-rank",
        "frames/step": frames.senders(), "values/step": per_step,
        "sampled steps": samples, "values/s": per_step * samples / wall,
        "p99 ms": 1e3 * statistics.quantiles(lat, n=100)[98] if len(lat) > 1 else 1e3 * lat[0],
        "bytes/value": grown / (per_step * samples), "MB/step": step_bytes / 1e6,
        "GB/day": step_bytes * SAMPLED_PER_DAY / 1e9,
        "GB/week": 7 * step_bytes * SAMPLED_PER_DAY / 1e9,
        "job values/s": per_step / EVERY,  # at ~1 step/s
        "collector RSS MB": [round(m[0]) for m in mem],
        "collector peak MB": [round(m[1]) for m in mem],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", default=os.environ.get("LOGITWATCH_TEST_PG_URL"),
                    help="PostgreSQL URL (postgresql+psycopg://...)")
    ap.add_argument("--ranks", default="1,64,1024", help="comma-separated rank counts")
    ap.add_argument("--modes", default="per-rank,reduced", help="per-rank, reduced or both")
    ap.add_argument("--values", type=int, default=1_500_000,
                    help="values sent per scenario (at least one sampled step)")
    ap.add_argument("--threads", type=int, default=4, help="sender threads")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--quick", action="store_true",
                    help="--values 300000; per rank up to 64 ranks, reduced at 64 and 1,024")
    args = ap.parse_args()
    if args.quick and args.values == ap.get_default("values"):
        args.values = 300_000
    if not args.pg:
        sys.exit("--pg (or LOGITWATCH_TEST_PG_URL) is needed: the bench is about PostgreSQL")
    servers = [Server(args.pg), Server(args.pg)]
    rows = []
    with servers[0]:
        with servers[1]:
            for mode in args.modes.split(","):
                for ranks in [int(r) for r in args.ranks.split(",")]:
                    if mode == "reduced" and ranks == 1:
                        continue  # a one-rank job sends its own frames
                    if args.quick and mode == "per-rank" and ranks > 64:
                        continue
                    row = scenario(args.pg, servers, ranks, mode == "reduced", args.values,
                                   args.threads)
                    rows.append(row)
                    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                      for k, v in row.items()}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
