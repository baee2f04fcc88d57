"""The dashboard's run page on a one-week run: server time of what the page asks on load.

One run at ~1 step/s with the default interval (one sampled step in 10) is built through the
collector's own write path (``store/parse.py`` + ``store/ingest.py``, one transaction per
batch of 256 frames, the client's ``max_batch``; no HTTP, no alert engine), in the wire
format the hooks send: per sampled step ``--layers`` x ``--heads`` matrices of the 8 per-head
statistics (``attn.logit_max/p99/mean/std``, ``attn.entropy_mean/min``,
``qk.q_weight_norm/k_weight_norm``), the 16 usual scalars, and the history of the 9 steps
between (loss, grad.norm, grad.clipped, lr: every step of those four is stored). A week is
60,480 sampled frames and 544,320 history steps. Frame times end now, one second a step; on
PostgreSQL the day partitions of the run's days are created first, as an hourly collector
would have created them while the run went on.

At each checkpoint (``--at``, sampled frames: 1 hour = 360, 1 day = 8,640, 1 week = 60,480)
a real collector (``logitwatch serve``, uvicorn on loopback, started once) is asked over
HTTP, as web/js/run.js does on load:

1. ``GET /api/v1/dashboard/runs/{id}`` (the page data: run, verdict, incidents, alerts,
   metrics, ranks);
2. then, together: the batched initial figures ``GET /api/v1/runs/{id}/figures?f=...``
   (web/js/batch.js: one ``f`` per chart, built from the page data's metrics the way
   run.js's ``discover`` orders them, then heatmap, heads over steps, loss, grad norm) and
   ``GET /api/v1/runs/{id}/worst_heads?name=attn.logit_max&k=10``.

Each request is timed alone (one warm-up, then ``--repeat``: median and min, answer size),
and the page as the browser asks it (1, then 2's two requests at once: wall time); at the
last checkpoint (``--each``) every figure of the batch alone too (``/figures/{kind}``).

    python bench/bench_page_week.py                        # temporary SQLite, 4 x 8, a week
    python bench/bench_page_week.py --db postgresql+psycopg://postgres@127.0.0.1:55436/postgres
    python bench/bench_page_week.py --layers 32 --heads 32 --at 360,8640   # a day of 32 x 32

Figures: bench/README.md, "Scale".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import Server  # noqa: E402

EVERY = 10  # the default interval: one sampled step in 10, ~1 step/s
BATCH = 256  # the client's max_batch
PER_HEAD = ["attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
            "attn.entropy_mean", "attn.entropy_min", "qk.q_weight_norm", "qk.k_weight_norm"]
SCALARS = ["loss", "lr", "grad.norm", "grad.clipped", "grad.max_norm", "grad.clip_rate",
           "final.hidden_rms", "final.logz", "final.logit_max", "hooks.host_ms",
           "hooks.syncs", "hooks.bytes", "hooks.sample_every", "hooks.cost_ms",
           "hooks.overhead", "attn.dtype_max"]
HISTORY = ["loss", "grad.norm", "grad.clipped", "lr"]
WEEK = 7 * 86_400 // EVERY  # sampled frames

# web/js/run.js: the charts drawn by name, the order of the others, the monitor's own series.
CLIP_RATE = ["grad.clip_rate", "clip_rate"]
FIXED = {"loss", "grad.norm", "grad.clipped", *CLIP_RATE}
KNOWN = ["lr", "clip_rate", "final.hidden_rms", "final.logz", "final.logit_max"]
DEFAULT_STAT = "attn.logit_max"


def monitor(n: str) -> bool:
    return n.startswith("hooks.") or n in ("attn.dtype_max", "grad.max_norm",
                                           "loss.first_over_ln_vocab")


def scalar_order(names: set[str]) -> list[str]:
    has_clip = "grad.clipped" in names or any(n in names for n in CLIP_RATE)
    wanted = [n for n in KNOWN if (has_clip if n == "clip_rate" else n in names)]
    rest = sorted(n for n in names if n not in FIXED and n not in KNOWN)
    return wanted + rest


def initial_figures(metrics: list[dict]) -> list[str]:
    """The ``f`` of each chart run.js draws on load (default view: rank 0, no zoom)."""
    scalars = {m["name"] for m in metrics if m["kind"] == "scalar"}
    fs = []
    for name in scalar_order(scalars):  # discover(): the scalar charts, monitor folded away
        if monitor(name):
            continue
        fs.append("kind=clip_rate" if name == "clip_rate" else f"kind=series&name={quote(name)}")
    heads = sorted(m["name"] for m in metrics if m["kind"] == "heads")
    stat = DEFAULT_STAT if DEFAULT_STAT in heads or not heads else heads[0]
    fs += [f"kind=heatmap&name={stat}&color=auto", f"kind=heads_time&name={stat}&color=auto",
           "kind=loss", "kind=grad_norm"]
    return fs


class Run:
    """Frames of one run, built from a small pool of encoded matrices."""

    def __init__(self, layers: int, heads: int, frames: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.name = f"page-week-{layers}x{heads}-{uuid.uuid4().hex[:6]}"
        self.frames = frames
        self.t0 = time.time() - frames * EVERY  # the last frame is now
        self.pool = []
        for _ in range(8):
            mats = {n: json.dumps(np.round(rng.uniform(0.5, 12.0, (layers, heads)), 4).tolist())
                    for n in PER_HEAD}
            self.pool.append("{" + ",".join(f'"{k}":{v}' for k, v in mats.items()) + "}")
        steps = frames * EVERY
        x = np.arange(steps) / steps
        self.loss = np.round(3.0 * np.exp(-4 * x) + 0.5 + 0.05 * rng.standard_normal(steps), 4)
        self.gnorm = np.round(1.0 + 0.3 * np.sin(np.arange(steps) / 70)
                              + 0.1 * rng.random(steps), 4)
        self.clipped = (rng.random(steps) < 0.05).astype(float)
        self.rest = {n: round(float(rng.uniform(0, 5)), 4) for n in SCALARS}
        self.values = len(PER_HEAD) * layers * heads + len(SCALARS) + (EVERY - 1) * len(HISTORY)

    def frame(self, k: int) -> str:
        step = k * EVERY
        t = self.t0 + step
        scalars = dict(self.rest, loss=float(self.loss[step]), **{
            "grad.norm": float(self.gnorm[step]), "grad.clipped": float(self.clipped[step]),
            "lr": 1e-3, "final.hidden_rms": round(1.0 + step / (self.frames * EVERY), 4)})
        out = (f'{{"run":"{self.name}","rank":0,"seq":{k},"step":{step},"time":{t:.3f},'
               f'"scalars":{json.dumps(scalars)},"heads":{self.pool[k % len(self.pool)]}')
        if k:
            hs = list(range(step - EVERY + 1, step))
            hist = {"steps": hs, "scalars": {
                "loss": self.loss[hs].tolist(), "grad.norm": self.gnorm[hs].tolist(),
                "grad.clipped": self.clipped[hs].tolist(), "lr": [1e-3] * len(hs)}}
            out += f',"history":{json.dumps(hist)}'
        return out + "}"

    def body(self, lo: int, hi: int) -> bytes:
        return ('{"frames":[' + ",".join(self.frame(k) for k in range(lo, hi)) + "]}").encode()


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ingest(db_url: str, run: Run, lo: int, hi: int, *, engine) -> None:  # noqa: ANN001
    """Store sampled frames ``lo`` to ``hi`` (with their histories) through the write path."""
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import session_scope
    from logitwatch.server.store.ingest import ingest_frames
    from logitwatch.server.store.parse import parse_ingest

    sessions = sessionmaker(engine, expire_on_commit=False)
    t0 = last = time.perf_counter()
    for a in range(lo, hi, BATCH):
        b = min(hi, a + BATCH)
        parsed = parse_ingest(run.body(a, b), "application/json")
        with session_scope(sessions) as s:
            ingest_frames(s, parsed.frames)
        now = time.perf_counter()
        if now - last > 15 or b == hi:
            last = now
            rate = (b - lo) * run.values / (now - t0)
            print(f"  stored {b:,}/{run.frames:,} sampled frames ({b * EVERY:,} steps), "
                  f"{now - t0:.0f} s, {rate / 1e3:.0f} k values/s, load {load_average()}",
                  flush=True)


def timed(c: httpx.Client, url: str) -> tuple[float, int]:
    t = time.perf_counter()
    r = c.get(url)
    dt = time.perf_counter() - t
    if r.status_code != 200:
        sys.exit(f"GET {url} answered {r.status_code}: {r.text[:300]}")
    if "/figures?" in url:
        errs = [f["error"] for f in r.json()["figures"] if "error" in f]
        if errs:
            sys.exit(f"figure failed: {errs[0]}")
    return dt, len(r.content)


def measure(base: str, run_id: int, repeat: int,
            each: bool) -> dict[str, tuple[float, float, int]]:
    """{request: (median s, min s, bytes)}, and the page as the browser asks it; with
    ``each``, every figure of the batch alone too."""
    out = {}
    with httpx.Client(timeout=600) as c, httpx.Client(timeout=600) as c2:
        page = f"{base}/api/v1/dashboard/runs/{run_id}"
        metrics = c.get(page).json()["metrics"]
        fs = initial_figures(metrics)
        figs = (f"{base}/api/v1/runs/{run_id}/figures?"
                + "&".join(f"f={quote(f, safe='')}" for f in fs))
        worst = f"{base}/api/v1/runs/{run_id}/worst_heads?name={DEFAULT_STAT}&k=10"
        for label, url in (("page data", page), (f"figures ({len(fs)})", figs),
                           ("worst_heads", worst)):
            timed(c, url)  # warm-up
            got = [timed(c, url) for _ in range(repeat)]
            ts = [g[0] for g in got]
            out[label] = (statistics.median(ts), min(ts), got[-1][1])
        if each:  # what the batch's time is made of: each figure alone
            for f in fs:
                url = f"{base}/api/v1/runs/{run_id}/figures/{f.removeprefix('kind=')}"
                url = url.replace("&", "?", 1)
                timed(c, url)
                got = [timed(c, url) for _ in range(repeat)]
                ts = [g[0] for g in got]
                out[f"  {f.removeprefix('kind=')}"] = (statistics.median(ts), min(ts),
                                                       got[-1][1])
        timed(c2, worst)  # the second connection, open

        def whole() -> float:
            t = time.perf_counter()
            timed(c, page)
            th = threading.Thread(target=timed, args=(c2, worst))
            th.start()
            timed(c, figs)
            th.join()
            return time.perf_counter() - t

        ts = [whole() for _ in range(repeat)]
        out["page (browser order)"] = (statistics.median(ts), min(ts), 0)
    out["_f"] = fs  # type: ignore[assignment]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--at", default=f"360,8640,{WEEK}",
                    help="checkpoints in sampled frames (1 hour, 1 day, 1 week)")
    ap.add_argument("--repeat", type=int, default=5, help="timings per request")
    ap.add_argument("--each", default="last",
                    help="checkpoints at which each figure is also timed alone: 'last', "
                    "'all', 'none' or sampled frames, comma-separated")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    at = sorted(int(x) for x in args.at.split(","))
    named = {"last": {at[-1]}, "all": set(at), "none": set()}
    each = named[args.each] if args.each in named else {int(x) for x in args.each.split(",")}

    from logitwatch.server.db.partitions import ensure_partitions
    from logitwatch.server.db.session import make_engine, migrate

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'page_week.db'}"
        run = Run(args.layers, args.heads, at[-1])
        print(f"{db.split('://')[0]}: run {run.name}: {args.layers} x {args.heads} heads, "
              f"{run.values:,} values a sampled frame (8 per-head statistics, "
              f"{len(SCALARS)} scalars, {EVERY - 1} history steps of {len(HISTORY)}), "
              f"{at[-1]:,} sampled frames; load {load_average()}", flush=True)
        engine = make_engine(db)
        migrate(engine)
        # The run's days (a collector running all along would have made them hour by hour).
        made = ensure_partitions(engine, now=run.t0, ahead_days=at[-1] * EVERY // 86_400 + 2)
        if made:
            print(f"  {len(made)} partitions for the run's days", flush=True)
        rows = []
        with Server(db) as srv:
            done = 0
            for n in at:
                ingest(db, run, done, n, engine=engine)
                done = n
                run_id = _run_id(engine, run.name)
                load = load_average()
                got = measure(srv.url, run_id, args.repeat, n in each)
                fs = got.pop("_f")
                span = n * EVERY / 3600
                print(f"\n{n:,} sampled frames ({n * EVERY:,} steps, {span:,.0f} h), "
                      f"load {load} -> {load_average()}; figures: {', '.join(fs)}")
                for label, (med, mn, size) in got.items():
                    kib = f"{size / 1024:8.1f} KiB" if size else ""
                    print(f"  {label:<44} median {med * 1e3:8.1f} ms  min {mn * 1e3:8.1f} ms  "
                          f"{kib}", flush=True)
                    rows.append({"frames": n, "request": label, "median_ms": med * 1e3,
                                 "min_ms": mn * 1e3, "bytes": size, "load": load})
                print(flush=True)
        engine.dispose()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _run_id(engine, name: str) -> int:  # noqa: ANN001
    from sqlalchemy import select

    from logitwatch.server.db.models import Run as RunRow

    with engine.connect() as c:
        return int(c.execute(select(RunRow.id).where(RunRow.name == name)).scalar_one())


if __name__ == "__main__":
    os.environ.setdefault("LOGITWATCH_RATE_LIMIT_PER_SECOND", "0")
    main()
