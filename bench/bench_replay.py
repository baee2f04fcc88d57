"""``logitwatch replay`` of a large export: the old way (the whole file read into memory, then
stored in batches of 16 frames) against the new (read a line at a time, batches of 256), on
the same synthetic export in the same run.

The export is what ``logitwatch runs export`` writes for a run the hooks recorded: a header
line (config, tags), then one sampled frame a line with its scalars and per-head matrices,
carrying the every-step scalars of the steps between samples in its ``history``, then the
run's end frame. Each way runs in a process of its own (its peak RSS is its own) on a fresh
SQLite file, under the default rules, and reports its time, frames and steps a second, peak
RSS (and its growth over the process's RSS once imported), the alerts it fired and a digest
of every stored row (rank, seq, step, time and each value's bytes): the ways must agree on
both, or the script says so and exits 1.

``--old-module FILE`` runs the old way with another ``replay`` module (one that has
``read_frame_lines`` and ``replay``), e.g. the code before streaming::

    git show <commit>:server/alerts/replay.py > /tmp/replay_old.py
    python bench/bench_replay.py --old-module /tmp/replay_old.py

``--old-tree DIR`` runs the old way with the whole package of another checkout, the alert
engine included, e.g. to time an engine change at the same batch size::

    git worktree add /tmp/lw-old <commit>
    python bench/bench_replay.py --old-tree /tmp/lw-old --old-batch 256 --frames 1000

``--profile`` prints where the new way's time goes (cProfile, top 15 by cumulative time).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: the per-head statistics the hooks send (a subset), and the scalars
HEADS = ("attn.logit_max", "attn.logit_p99", "attn.entropy_mean", "qk.q_weight_norm")
HISTORY = ("loss", "lr", "grad.norm", "grad.clipped", "grad.max_norm")


def write_export(path: Path, frames: int, every: int, layers: int, heads: int,
                 seed: int = 0) -> int:
    """A ``runs export`` file of run default/bench: ``frames`` sampled frames, one every
    ``every`` steps, each carrying the ``every - 1`` steps before it; returns the steps in
    all. A healthy run: a loss falling with noise, a cosine learning rate, steady heads."""
    rnd = random.Random(seed)
    t0 = time.time() - 86_400.0
    last = (frames - 1) * every

    def scalars(step: int) -> dict[str, float]:
        return {"loss": round(3.0 - step / (2 * max(last, 1)) + rnd.gauss(0, 0.02), 5),
                "lr": round(1e-3 * (0.5 + 0.5 * math.cos(math.pi * step / max(last, 1))), 9),
                "grad.norm": round(0.8 + rnd.gauss(0, 0.05), 5), "grad.clipped": 0.0,
                "grad.max_norm": 1.0}

    header = {"logitwatch_export": 1, "project": "default", "run": "bench", "run_id": 1,
              "status": "finished", "created_at": t0, "last_step": last, "end_step": last,
              "diverged_step": None, "config": {"lr": 1e-3, "model": "synthetic",
                                                "layers": layers, "heads": heads},
              "tags": ["bench", "synthetic"], "ranks": [0],
              "metrics": sorted({*HISTORY, "final.logz", *HEADS}), "frames": frames,
              "exported_at": time.time()}
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(header) + "\n")
        for i in range(frames):
            step = i * every
            f: dict[str, Any] = {
                "run": "bench", "project": "default", "rank": 0, "seq": i, "step": step,
                "time": t0 + step * 0.5,
                "scalars": {**scalars(step), "final.logz": round(5 + rnd.gauss(0, 0.01), 5)},
                "heads": {k: [[round(5 + rnd.gauss(0, 0.1), 4) for _ in range(heads)]
                              for _ in range(layers)] for k in HEADS}}
            steps = list(range(step - every + 1, step)) if i else []
            if steps:
                rows = [scalars(s) for s in steps]
                f["history"] = {"steps": steps,
                                "scalars": {k: [r[k] for r in rows] for k in HISTORY}}
            fh.write(json.dumps(f) + "\n")
        fh.write(json.dumps({"run": "bench", "project": "default", "rank": 0, "seq": frames,
                             "step": last, "time": t0 + last * 0.5 + 1, "end": "finished"})
                 + "\n")
    return last + 1


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _digest(url: str) -> tuple[str, int, dict[str, Any]]:
    """A digest of every stored frame row with its values (as ``tests/test_cli_export.py``
    reads them), the rows' count, and the run's config and tags."""
    from sqlalchemy import select

    from logitwatch.server.db.models import Frame, Metric, Point, Run, RunTag
    from logitwatch.server.db.session import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as c:
            run = c.execute(select(Run.id, Run.config).where(Run.name == "bench")).one()
            names = dict(c.execute(select(Metric.id, Metric.name)
                                   .where(Metric.run_id == run.id)).all())
            values: dict[int, list[tuple[str, bytes]]] = {}
            for fid, mid, data in c.execute(select(Point.frame_id, Point.metric_id,
                                                   Point.data)
                                            .where(Point.metric_id.in_(list(names)))):
                values.setdefault(fid, []).append((names[mid], bytes(data)))
            rows = sorted((f.rank, f.seq, f.step, f.time, tuple(sorted(values.get(f.id, []))))
                          for f in c.execute(select(Frame.id, Frame.rank, Frame.seq,
                                                    Frame.step, Frame.time)
                                             .where(Frame.run_id == run.id)))
            tags = sorted(c.scalars(select(RunTag.tag).where(RunTag.run_id == run.id)))
    finally:
        engine.dispose()
    h = hashlib.sha256()
    for r in rows:
        h.update(repr(r).encode())
    return h.hexdigest()[:16], len(rows), {"config": run.config, "tags": tags}


def child(way: str, path: str, batch: int, db: str, old_module: str | None,
          profile: bool, no_rules: bool) -> dict[str, Any]:
    """One replay of ``path`` in this process; what it measured."""
    rules: list[Any] | None = [] if no_rules else None  # none: the storing alone
    from logitwatch.server.alerts import replay as mod

    if way == "old" and old_module:
        import importlib.util

        spec = importlib.util.spec_from_file_location("replay_old", old_module)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["replay_old"] = mod  # (dataclasses look their module up)
        spec.loader.exec_module(mod)
    base = _rss_mb()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t, cpu = time.perf_counter(), time.process_time()
    if way == "old":  # what `logitwatch replay` did: the whole file, then batches of 16
        _, frames, lines = mod.read_frame_lines(path)
        res = mod.replay(frames, db_url=db, batch=batch, lines=lines, rules=rules)
    else:
        with mod.FrameFile(path) as src:
            res = mod.replay(src, db_url=db, batch=batch, rules=rules,
                             header=mod.export_header(src.header, path))
    took, cpu = time.perf_counter() - t, time.process_time() - cpu
    peak = _rss_mb()  # before the digest below, which reads every row back
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(15)
    digest, rows, run = _digest(db)
    return {"way": way, "batch": batch, "s": took, "cpu": cpu, "frames": res.frames, "rows": rows,
            "peak_mb": peak, "base_mb": base, "digest": digest, "run": run,
            "alerts": sorted([a.rule, a.rank, a.layer, a.head, a.fired_step, a.severity,
                              a.state, a.resolved_step, a.suppressed] for a in res.alerts)}


def fresh_store(way: str, tmp: Path, pg: str | None) -> tuple[str, Any]:
    """A URL of an empty store for one replay (a SQLite file, or a new database on the
    PostgreSQL server ``pg``), and how to remove it."""
    if pg is None:
        db = tmp / f"{way}.db"
        db.unlink(missing_ok=True)
        return f"sqlite:///{db}", lambda: None
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"bench_replay_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(pg).set(database=name).render_as_string(hide_password=False), drop


def run_child(way: str, path: Path, batch: int, tmp: Path, args: argparse.Namespace
              ) -> dict[str, Any]:
    url, drop = fresh_store(way, tmp, args.pg)
    try:
        return _run_child(way, path, batch, url, args)
    finally:
        drop()


#: where each folder of a checkout goes in the installed package (pyproject's package-dir)
PACKAGE_DIRS = ("server", "hooks", "client", "web", "migrations")


def package_of(tree: Path, tmp: Path) -> Path:
    """A folder to put on ``PYTHONPATH`` that imports ``logitwatch`` from the checkout
    ``tree`` as the installed package lays it out (``logitwatch/`` with ``server/``,
    ``hooks/`` ... inside), by symbolic links; made once under ``tmp``."""
    root = tmp / "old-package"
    pkg = root / "logitwatch"
    if pkg.exists():
        return root
    if not (tree / "logitwatch" / "__init__.py").is_file():
        sys.exit(f"--old-tree {tree}: not a checkout of this project (no logitwatch/)")
    pkg.mkdir(parents=True)
    for item in (tree / "logitwatch").iterdir():
        (pkg / item.name).symlink_to(item.resolve())
    for d in PACKAGE_DIRS:
        (pkg / d).symlink_to((tree / d).resolve())
    return root


def _run_child(way: str, path: Path, batch: int, url: str, args: argparse.Namespace
               ) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", way, "--file", str(path), "--batch",
           str(batch), "--db", url]
    if args.old_module:
        cmd += ["--old-module", args.old_module]
    if args.no_rules:
        cmd.append("--no-rules")
    if args.profile and way == "new":
        cmd.append("--profile")
    code = str(ROOT)
    if way == "old" and args.old_tree:
        code = str(package_of(Path(args.old_tree), path.parent))
    out = subprocess.run(cmd, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": code}, cwd=ROOT)
    if out.returncode:
        sys.exit(f"the {way} way failed:\n{out.stderr[-4000:]}")
    if args.profile and way == "new":
        print(out.stderr[-6000:], file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=2000, help="sampled frames (default 2000)")
    p.add_argument("--every", type=int, default=10,
                   help="a frame every N steps, carrying the N-1 before it (default 10)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--old-batch", type=int, default=16)
    p.add_argument("--new-batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds, the two ways alternating (default 3): medians are shown")
    p.add_argument("--no-rules", action="store_true",
                   help="an empty rule set: the storing alone, without the alert engine")
    p.add_argument("--old-module", default=None, metavar="FILE",
                   help="the replay module the old way runs (default: today's)")
    p.add_argument("--old-tree", default=None, metavar="DIR",
                   help="a checkout of another commit (git worktree add DIR REV): the old "
                   "way runs its whole package, the alert engine included")
    p.add_argument("--pg", default=None, metavar="URL",
                   help="replay into a new database on this PostgreSQL server each time "
                   "(default: a SQLite file)")
    p.add_argument("--profile", action="store_true", help="profile the new way")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.file, args.batch, args.db, args.old_module,
                               args.profile, args.no_rules)))
        return 0
    ways = {"old": args.old_batch, "new": args.new_batch}
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as d:
        tmp = Path(d)
        path = tmp / "bench.jsonl.gz"
        steps = write_export(path, args.frames, args.every, args.layers, args.heads)
        mb = path.stat().st_size / 1e6
        print(f"export: {args.frames} frames ({steps} steps, {args.layers}x{args.heads} "
              f"heads x {len(HEADS)}), {mb:.1f} MB gzip'd; "
              f"{'no rules' if args.no_rules else 'the default rules'}; "
              f"{'PostgreSQL' if args.pg else 'SQLite'}", flush=True)
        for i in range(args.rounds):
            for way in (("old", "new") if i % 2 == 0 else ("new", "old")):  # alternating
                r = run_child(way, path, ways[way], tmp, args)
                runs[way].append(r)
                print(f"  round {i + 1} {way}: {r['s']:.1f} s wall, {r['cpu']:.1f} s CPU, "
                      f"peak RSS {r['peak_mb']:.0f} MB", flush=True)
    med = {w: {k: statistics.median(r[k] for r in rs) for k in ("s", "cpu", "peak_mb",
                                                                "base_mb")}
           for w, rs in runs.items()}
    for way, m in med.items():
        r = runs[way][-1]
        print(f"{way:>3}: batch {ways[way]:>4}  {m['s']:7.1f} s ({m['cpu']:.1f} s CPU)  "
              f"{r['frames'] / m['cpu']:7.1f} frames/s  {steps / m['cpu']:8.1f} steps/s (CPU) "
              f" peak RSS {m['peak_mb']:5.0f} MB (+{m['peak_mb'] - m['base_mb']:.0f} over "
              f"imports)  {len(r['alerts'])} alerts  {r['rows']} rows {r['digest']}")
    old, new = med["old"], med["new"]
    print(f"new/old (medians of {args.rounds}): {old['cpu'] / new['cpu']:.2f}x the frames a "
          f"CPU second ({old['s'] / new['s']:.2f}x wall), peak RSS x"
          f"{new['peak_mb'] / old['peak_mb']:.2f} (its growth over imports x"
          f"{(new['peak_mb'] - new['base_mb']) / max(old['peak_mb'] - old['base_mb'], 1):.2f})")
    every = [r for rs in runs.values() for r in rs]
    same = all(r["alerts"] == every[0]["alerts"] and r["digest"] == every[0]["digest"]
               for r in every)
    print("alerts and stored rows: " + ("identical" if same else "DIFFERENT"))
    print(f"the new way's run: config {runs['new'][-1]['run']['config']}, tags "
          f"{runs['new'][-1]['run']['tags']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs,
                                               "medians": med}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
