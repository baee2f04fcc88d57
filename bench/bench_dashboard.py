"""Initial-load cost of the dashboard's pages with many runs and one very long run.

Seeds a fresh SQLite (or ``--db`` PostgreSQL) database directly in bulk: ``--runs`` runs of
``--frames`` sampled steps each (loss, grad norm, clipped, lr; a 4 x 4 per-head matrix), plus
one run of ``--big`` sampled steps (six scalars; two 8 x 8 per-head statistics). Then asks
the collector, in process (no network), for every request each page makes when it opens, and
prints the median server time and size of each, per page, with ratios against a baseline
measured in the same run: the unfiltered ``/api/v1/runs`` for the runs page, and a naive
full-resolution ``/series`` of the loss (what a page without server-side downsampling would
fetch) for the run page.

    python bench/bench_dashboard.py                  # 100 runs x 1000 steps + a 100k-step run
    python bench/bench_dashboard.py --runs 20 --big 20000 --repeat 3

``--browser DB`` instead opens every run page of a collector's database (e.g. the demo's:
``logitwatch demo --exit --db sqlite:///demo.db``) in headless Chromium, on a copy, and
prints the median time from navigation to the verdict shown and to every initial chart
drawn, the requests (all, and those for data: ``/api/``, the live stream apart) and bytes
the page fetched before it was ready; ``--shots DIR`` saves each run page at
1440x900 and 390x844 (first screen and full page):

    python bench/bench_dashboard.py --browser .logitwatch/demo.db --shots /tmp/shots
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, update

from logitwatch.server.app import create_app
from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.session import make_engine, migrate
from logitwatch.server.settings import Settings

CHUNK = 20_000


def _seed_run(conn, name: str, steps: int, scalars: list[str],
              heads: dict[str, tuple[int, int]], rng: np.random.Generator) -> int:
    now = time.time()
    run_id = conn.execute(insert(Run).values(project="bench", name=name, created_at=now - 3600,
                                             last_step=(steps - 1) * 10, last_time=now)
                          .returning(Run.id)).scalar_one()
    mids = {}
    for s in scalars:
        mids[s] = conn.execute(insert(Metric).values(run_id=run_id, name=s, layers=0, heads=0)
                               .returning(Metric.id)).scalar_one()
    for h, (layers, n) in heads.items():
        mids[h] = conn.execute(insert(Metric).values(run_id=run_id, name=h, layers=layers,
                                                     heads=n).returning(Metric.id)).scalar_one()
    spike = steps // 2
    last_id = 0
    for lo in range(0, steps, CHUNK):
        hi = min(steps, lo + CHUNK)
        ids = conn.execute(
            insert(Frame).returning(Frame.id, sort_by_parameter_order=True),
            [{"run_id": run_id, "rank": 0, "seq": i, "step": i * 10, "time": now - steps + i}
             for i in range(lo, hi)],
        ).scalars().all()
        last_id = max(last_id, *ids)
        points = []
        for fid, i in zip(ids, range(lo, hi), strict=True):
            t = i / max(1, steps)
            vals = {"loss": 50.0 if i == spike else 3.0 * math.exp(-4 * t) + 0.5,
                    "grad.norm": 1.0 + 0.3 * math.sin(i / 7), "grad.clipped": float(i % 5 == 0),
                    "lr": 1e-3, "final.hidden_rms": 1.0 + t, "final.logz": 0.5 + t}
            for s in scalars:
                points.append({"metric_id": mids[s], "frame_id": fid,
                               "data": np.float32(vals[s]).tobytes()})
            for h, (layers, n) in heads.items():
                m = (5.0 + rng.random((layers, n)) + 10.0 * t).astype("<f4")
                points.append({"metric_id": mids[h], "frame_id": fid, "data": m.tobytes()})
        conn.execute(insert(Point), points)
    # what ingest keeps on the run (0016): its newest frame, rank 0's last loss
    last = steps - 1
    loss = float(np.float32(50.0 if last == spike else
                            3.0 * math.exp(-4 * last / max(1, steps)) + 0.5))
    conn.execute(update(Run).where(Run.id == run_id).values(
        last_frame_id=last_id, last_loss=loss, last_loss_finite=True,
        last_loss_step=last * 10, last_loss_seq=last))
    return run_id


def seed(db_url: str, runs: int, frames: int, big: int) -> int:
    """Fill the database; return the id of the long run."""
    engine = make_engine(db_url)
    migrate(engine)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        if conn.execute(select(Run.id).limit(1)).first() is not None:
            sys.exit(f"{db_url} already holds runs; give an empty database")
        for r in range(runs):
            _seed_run(conn, f"run-{r:03d}", frames, ["loss", "grad.norm", "grad.clipped", "lr"],
                      {"attn.logit_max": (4, 4)}, rng)
            if (r + 1) % 20 == 0:
                print(f"  seeded {r + 1}/{runs} runs of {frames} steps", flush=True)
        big_id = _seed_run(conn, "long-run", big, ["loss", "grad.norm", "grad.clipped", "lr",
                                                   "final.hidden_rms", "final.logz"],
                           {"attn.logit_max": (8, 8), "attn.logit_p99": (8, 8)}, rng)
    engine.dispose()
    print(f"seeded {runs} x {frames} + 1 x {big} sampled steps in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return big_id


def measure(client: TestClient, url: str, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - t)
        if r.status_code != 200:
            sys.exit(f"GET {url} answered {r.status_code}: {r.text[:300]}")
        size = len(r.content)
    return statistics.median(times), size


def browser_bench(db: str, repeat: int, shots: str | None) -> None:
    """Run-page ready times in Chromium on a copy of ``db`` (see the module)."""
    import shutil

    from playwright.sync_api import sync_playwright

    from logitwatch.demo.runner import Collector

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "bench.db"
        shutil.copy(db, copy)
        out = Path(shots) if shots else None
        if out:
            out.mkdir(parents=True, exist_ok=True)
        with Collector(f"sqlite:///{copy}") as col, sync_playwright() as p:
            runs = httpx.get(f"{col.url}/api/v1/runs", timeout=10).json()
            b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                  args=["--no-sandbox", "--disable-gpu",
                                        "--disable-dev-shm-usage"])
            print(f"run page in Chromium, median of {repeat} loads (fresh page, warm cache "
                  "after the first)")
            for r in runs:
                verdict, ready, reqs, data, size = [], [], [], [], []
                for _ in range(repeat):
                    page = b.new_page(viewport={"width": 1440, "height": 900})
                    got: list[int] = []
                    api: list[str] = []
                    page.on("requestfinished", lambda q, got=got: got.append(
                        q.sizes()["responseBodySize"]))
                    page.on("request", lambda q, api=api: api.append(q.url)
                            if "/api/" in q.url and "/stream" not in q.url else None)
                    page.goto(f"{col.url}/runs/{r['id']}")
                    page.wait_for_function("document.body.dataset.ready === '1'",
                                           timeout=30_000)
                    d = page.evaluate("({...document.body.dataset})")
                    verdict.append(float(d["verdictMs"]))
                    ready.append(float(d["readyMs"]))
                    reqs.append(len(got))
                    data.append(len(api))
                    size.append(sum(got))
                    page.close()
                v_ms = statistics.median(verdict)
                print(f"  {r['name']:<32} {r['status']:<9} verdict {v_ms:6.0f} ms"
                      f"  ready {statistics.median(ready):6.0f} ms  {statistics.median(reqs):4.0f} "
                      f"requests ({statistics.median(data):.0f} for data)"
                      f"  {statistics.median(size) / 1024:7.0f} KiB")
                for name, vp in (("desktop", (1440, 900)), ("phone", (390, 844))):
                    if not out:
                        continue
                    page = b.new_page(viewport={"width": vp[0], "height": vp[1]})
                    page.goto(f"{col.url}/runs/{r['id']}")
                    page.wait_for_function("document.body.dataset.ready === '1'",
                                           timeout=30_000)
                    page.screenshot(path=out / f"run{r['id']}-{name}.png")
                    page.screenshot(path=out / f"run{r['id']}-{name}-full.png", full_page=True)
                    page.close()
            b.close()
        if out:
            print(f"screenshots in {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="short runs (default 100)")
    ap.add_argument("--frames", type=int, default=1000, help="sampled steps per short run")
    ap.add_argument("--big", type=int, default=100_000, help="sampled steps of the long run")
    ap.add_argument("--repeat", type=int, default=5, help="timings per request (median)")
    ap.add_argument("--db", help="empty database URL (default: a temporary SQLite file)")
    ap.add_argument("--browser", metavar="SQLITE_FILE",
                    help="time the run pages of this database in Chromium instead")
    ap.add_argument("--shots", metavar="DIR", help="with --browser: save screenshots here")
    args = ap.parse_args()
    if args.browser:
        browser_bench(args.browser, args.repeat, args.shots)
        return

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        big = seed(db, args.runs, args.frames, args.big)
        with TestClient(create_app(Settings(db_url=db))) as c:
            base = f"/api/v1/runs/{big}"
            mid = args.big * 10 // 2
            compare = ",".join([str(big)] + [str(i) for i in range(1, min(args.runs, 4) + 1)])
            pages = {
                "runs page": [
                    ("baseline: /api/v1/runs (no sparklines)", "/api/v1/runs"),
                    ("dashboard/runs, first load (cold cache)", "/api/v1/dashboard/runs"),
                    ("dashboard/runs, refresh (warm cache)", "/api/v1/dashboard/runs"),
                    ("dashboard/runs?q=run-05", "/api/v1/dashboard/runs?q=run-05"),
                ],
                f"run page ({args.big} steps)": [
                    ("baseline: /series loss, full resolution",
                     f"{base}/series?name=loss&max_points=100000"),
                    ("run", base),
                    ("metrics", f"{base}/metrics"),
                    ("alerts", f"{base}/alerts"),
                    ("figure loss", f"{base}/figures/loss"),
                    ("figure grad_norm (+ clipped)", f"{base}/figures/grad_norm"),
                    ("figure lr", f"{base}/figures/series?name=lr"),
                    ("figure clip_rate (derived)", f"{base}/figures/clip_rate"),
                    ("figure final.hidden_rms", f"{base}/figures/series?name=final.hidden_rms"),
                    ("figure final.logz", f"{base}/figures/series?name=final.logz"),
                    ("figure heatmap (layer x head)", f"{base}/figures/heatmap"),
                    ("figure heads_time (per-layer envelope)", f"{base}/figures/heads_time"),
                    ("worst_heads", f"{base}/worst_heads"),
                ],
                "run page, interactions": [
                    ("zoom: figure loss, 2000 steps",
                     f"{base}/figures/loss?start={mid - 1000}&end={mid + 1000}"),
                    ("heads_time, one layer", f"{base}/figures/heads_time?layer=3"),
                    ("drill: one head over the envelope",
                     f"{base}/figures/series?name=attn.logit_max&layer=3&head=5"),
                ],
                "compare page (5 runs)": [
                    ("compare/metrics", f"/api/v1/compare/metrics?runs={compare}"),
                    ("compare/figure loss", f"/api/v1/compare/figure?runs={compare}&name=loss"),
                    ("compare/figure attn.logit_max",
                     f"/api/v1/compare/figure?runs={compare}&name=attn.logit_max"),
                ],
            }
            print(f"\nserver time per request, median of {args.repeat} (in process, no network)")
            for page, reqs in pages.items():
                print(f"\n{page}")
                baseline = None
                total = 0.0
                for label, url in reqs:
                    # The cold sparkline cache is measured once, on its own.
                    n = 1 if "cold" in label else args.repeat
                    t, size = measure(c, url, n)
                    if label.startswith("baseline"):
                        baseline = t
                    elif "warm" not in label and "?q=" not in label:
                        total += t
                    ratio = f"{t / baseline:6.2f}x" if baseline and baseline != t else "      "
                    print(f"  {label:<44} {t * 1000:8.1f} ms {size / 1024:9.1f} KiB {ratio}")
                line = f"  {'initial load, all requests':<44} {total * 1000:8.1f} ms"
                if baseline:
                    line += f"            {total / baseline:6.2f}x baseline"
                print(line)


if __name__ == "__main__":
    main()
