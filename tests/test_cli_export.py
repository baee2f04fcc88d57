"""``logitwatch runs export``: a stored run back out, losslessly. A run recorded by the real
hooks on a tiny real model through a real collector, exported, replayed by the real
``logitwatch replay`` into a fresh store: every frame row (rank, seq, step, time), every
stored value (bit for bit, NaN and infinities included) and every series' shape come back
the same. Then the shapes the hooks do not make on demand (a restarted job, several ranks,
nulls, saturated values, history that no frame can carry, thinned matrices), the csv
format, the filters, paging, memory, progress and the errors."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import struct
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import logitwatch._cli_progress as progress_module
from logitwatch.cli import main
from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.store import export as export_module
from logitwatch.server.store.ingest import ENVELOPE
from tests.test_cli_audit_ux import one_line_error


def lw(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def ok(*args: str) -> Result:
    r = lw(*args)
    assert r.exit_code == 0, (r.output, r.exception)
    return r


# --- what a store holds of a run, all of it -------------------------------------------------


def stored(url: str, name: str, project: str = "default") -> dict[str, Any]:
    """Every frame row of run ``name`` with its values (the stored float32 bytes, by metric
    name, envelopes included), the run's metric shapes and the run fields that follow from
    its frames, read straight from the tables."""
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            run = c.execute(select(Run).where(Run.project == project, Run.name == name)).one()
            names = {m.id: (m.name, m.layers, m.heads) for m in c.execute(
                select(Metric.id, Metric.name, Metric.layers, Metric.heads)
                .where(Metric.run_id == run.id))}
            values: dict[int, dict[str, bytes]] = defaultdict(dict)
            for p in c.execute(select(Point.frame_id, Point.metric_id, Point.data)
                               .where(Point.metric_id.in_(list(names)))):
                values[p.frame_id][names[p.metric_id][0]] = bytes(p.data)
            frames = sorted(
                (f.rank, f.seq, f.step, f.time, tuple(sorted(values.pop(f.id, {}).items())))
                for f in c.execute(select(Frame.id, Frame.rank, Frame.seq, Frame.step,
                                          Frame.time).where(Frame.run_id == run.id)))
    finally:
        engine.dispose()
    assert not values  # every value belongs to a frame of the run
    return {
        "frames": frames,
        "metrics": sorted(names.values()),
        "run": {k: getattr(run, k) for k in ("project", "name", "last_step", "last_time",
                                               "status", "ended_at", "end_step", "end_seq",
                                               "time_min", "time_max")},
    }


def floats(run: dict[str, Any]) -> list[float]:
    """Every stored value of ``run`` (:func:`stored`), decoded."""
    out: list[float] = []
    for *_, values in run["frames"]:
        for _, blob in values:
            out += [x for (x,) in struct.iter_unpack("<f", blob)]
    return out


def round_trip(src: str, name: str, tmp_path: Path, *args: str,
               project: str = "default") -> tuple[dict[str, Any], Path, Result]:
    """Export ``name`` from ``src`` (with ``args``), replay the file into a fresh store with
    ``logitwatch replay``; what that store holds of the run, the file, the export's result."""
    out = tmp_path / f"{name}.jsonl.gz"
    r = ok("runs", "export", name, "--db", src, "-o", str(out), "--project", project, *args)
    dst = f"sqlite:///{tmp_path / f'{name}-copy.db'}"
    ok("replay", str(out), "--db", dst)
    return stored(dst, name, project), out, r


def lines(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:  # type: ignore[operator]
        return [json.loads(line) for line in fh]


# --- runs recorded by the real hooks -------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, one_torch_thread: None) -> str:
    """A store with two runs the real hooks sent through a real collector: ``tiny`` (one
    rank, a config, a tag, finished) and ``ranks`` (ranks 0 and 1; rank 1 logs infinite
    losses, then an infinite bias makes its loss, gradients and weights NaN)."""
    torch = pytest.importorskip("torch")
    import logitwatch
    from logitwatch.demo.runner import Collector
    from tests.hooks_tiny import TinyLM, batches, train_tiny

    url = f"sqlite:///{tmp_path_factory.mktemp('hooks') / 'recorded.db'}"
    with Collector(url) as col:
        torch.manual_seed(0)
        model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        mon = logitwatch.attach(model, opt, run="tiny", url=col.url, sample_every=4,
                                overhead_budget=None, config={"lr": 3e-3, "model": "TinyLM"})
        train_tiny(model, opt, mon, batches(30))
        mon.close(timeout=30)
        for rank in (0, 1):
            torch.manual_seed(rank)
            model = TinyLM()
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            mon = logitwatch.attach(model, opt, run="ranks", url=col.url, rank=rank,
                                    sample_every=3, overhead_budget=None)

            def inject(i: int, mon: Any = mon, model: Any = model, rank: int = rank) -> None:
                if rank != 1:
                    return
                if i in (4, 5):  # infinite losses of both signs (history or frame)
                    mon.log(loss=float("inf") if i == 4 else float("-inf"))
                if i == 13:  # the next forward is NaN, and everything after it
                    with torch.no_grad():
                        model.blocks[1].q.bias.fill_(float("inf"))

            train_tiny(model, opt, mon, batches(24, seed=rank), hook=inject)
            mon.close(timeout=30)
    ok("runs", "tag", "tiny", "bug-1234", "--db", url)
    return url


@pytest.mark.slow
def test_a_run_the_hooks_recorded_comes_back_identical(recorded: str, tmp_path: Path) -> None:
    before = stored(recorded, "tiny")
    seqs = [f[1] for f in before["frames"]]
    assert min(seqs) < 0 <= max(seqs)  # history rows and sampled frames: both must travel
    assert any(layers for _, layers, _ in before["metrics"])  # per-head matrices too
    assert before["run"]["status"] == "finished"
    after, out, r = round_trip(recorded, "tiny", tmp_path)
    assert after == before
    head, *frames = lines(out)
    assert head["config"] == {"lr": 3e-3, "model": "TinyLM"} and head["tags"] == ["bug-1234"]
    assert head["frames"] == len(frames) - 1 and frames[-1]["end"] == "finished"
    assert any("history" in f for f in frames)
    assert "and its end frame" in r.stderr and "warning" not in r.stderr


@pytest.mark.slow
def test_several_ranks_and_non_finite_values_come_back_identical(recorded: str,
                                                                 tmp_path: Path) -> None:
    before = stored(recorded, "ranks")
    assert {f[0] for f in before["frames"]} == {0, 1}
    values = floats(before)
    assert any(math.isnan(x) for x in values)
    assert math.inf in values and -math.inf in values
    nan_matrix = [blob for *_, vals in before["frames"] for name, blob in vals
                  if name.startswith("attn.") and not name.endswith(ENVELOPE) and len(blob) > 4
                  and any(math.isnan(x) for (x,) in struct.iter_unpack("<f", blob))]
    assert nan_matrix  # NaN inside a per-head matrix, not only in the scalars
    after, _, r = round_trip(recorded, "ranks", tmp_path)
    assert after == before
    assert "(ranks 0, 1), and its end frame" in r.stderr and "warning" not in r.stderr


@pytest.mark.slow
def test_one_rank_and_some_series_come_back_as_they_are_stored(recorded: str,
                                                               tmp_path: Path) -> None:
    """``--rank 1 --metrics loss,attn.logit_max``: rank 1's frame rows with those values
    only (the envelope of the matrix comes back with it: ingest computes it)."""
    keep = {"loss", "attn.logit_max", "attn.logit_max" + ENVELOPE}
    before = stored(recorded, "ranks")
    want = [(rank, seq, step, t, tuple(v for v in vals if v[0] in keep))
            for rank, seq, step, t, vals in before["frames"] if rank == 1]
    want = [f for f in want if f[1] >= 0 or f[4]]  # a history step without a value: no row
    after, _, _ = round_trip(recorded, "ranks", tmp_path, "--rank", "1",
                             "--metrics", "loss,attn.logit_max")
    assert after["frames"] == want
    assert [m[0] for m in after["metrics"]] == sorted(keep)


# --- shapes made on demand, through the real ingest path ------------------------------------


T0 = time.time() - 7 * 86400


def frame(step: int, seq: int, t: float, *, rank: int = 0, history: range | None = None,
          **values: Any) -> dict[str, Any]:
    """A wire frame of run p/made with ``values``: scalars (numbers or the wire's strings)
    and matrices (lists), a ``.`` in a name written ``_``; ``history``: its steps, each
    with a loss (NaN at step 13, +inf at 14, null at 15) and, every third step, an lr."""
    f: dict[str, Any] = {"run": "made", "project": "p", "rank": rank, "seq": seq, "step": step,
                         "time": t, "scalars": {k: v for k, v in values.items()
                                                if not isinstance(v, list)},
                         "heads": {k: v for k, v in values.items() if isinstance(v, list)}}
    f["scalars"] = {k.replace("_", "."): v for k, v in f["scalars"].items()}
    f["heads"] = {k.replace("_", "."): v for k, v in f["heads"].items()}
    if history is not None:
        steps = list(history)
        loss = {13: "NaN", 14: "Infinity", 15: None}
        f["history"] = {"steps": steps, "scalars": {
            "loss": [loss.get(s, 3.0 - s / 100) for s in steps],
            "lr": [1e-3 * s if s % 3 == 0 else None for s in steps]}}
    return f


def made_frames() -> list[dict[str, Any]]:
    """Rank 0 samples every 10 steps to step 40, is restarted from step 20 and samples at
    25, 35, 45 (new seqs; history of steps already stored, and of steps 30 and 40, where
    the first life has its sampled frames), and ends at step 45; rank 2 sends a frame
    without values, a value past float32's range, a subnormal and non-finite matrices."""
    odd = [[1.5, "NaN"], ["-Infinity", "Infinity"], [1e39, 1e-45]]
    out = [frame(0, 0, T0, loss=3.0, attn_logit_max=[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])]
    for i, step in enumerate(range(10, 50, 10), 1):
        out.append(frame(step, i, T0 + step, history=range(step - 9, step), loss=0.1 * i,
                         grad_norm="Infinity" if step == 30 else 1.0,
                         attn_logit_max=[[float(step)] * 2] * 3))
    for i, step in enumerate(range(25, 55, 10)):  # restarted from step 20, sampling at 5s
        out.append(frame(step, 100 + i, T0 + 1000 + step,
                         history=range(step - 9 if i else 21, step), loss=2.0,
                         attn_logit_max=[[-1.0, 0.0]] * 3))
    out.append(frame(3, 0, T0 + 3, rank=2))
    out.append(frame(7, 1, T0 + 7, rank=2, history=range(4, 7), probe=-0.0,
                     tiny=1e-45, big=-1e39, attn_logit_max=odd))
    out.append({"run": "made", "project": "p", "rank": 0, "seq": 200, "step": 45,
                "time": T0 + 1100, "end": "finished"})
    return out


def store_made(url: str, tmp_path: Path) -> str:
    """Run p/made (:func:`made_frames`) stored at ``url`` by ``logitwatch replay``."""
    src = tmp_path / "made.jsonl"
    src.write_text("".join(json.dumps(f) + "\n" for f in made_frames()))
    ok("replay", str(src), "--db", url)
    return url


@pytest.fixture
def made(tmp_path: Path) -> str:
    """A SQLite store holding run p/made (:func:`store_made`)."""
    return store_made(f"sqlite:///{tmp_path / 'made.db'}", tmp_path)


def test_a_restarted_job_several_ranks_and_odd_values_come_back_identical(
        db_url: str, tmp_path: Path) -> None:
    """On SQLite and on PostgreSQL (partitioned by time: each page's values are read from
    its days' partitions), into a SQLite copy."""
    made = store_made(db_url, tmp_path)
    before = stored(made, "made", "p")
    assert before["run"]["end_seq"] == 200 and before["run"]["status"] == "finished"
    by_step = defaultdict(list)
    for rank, seq, step, *_ in before["frames"]:
        by_step[(rank, step)].append(seq)
    assert by_step[(0, 30)] == [-31, 3]  # life 2's history row and life 1's frame
    assert None not in floats(before) and any(math.isnan(x) for x in floats(before))
    after, out, _ = round_trip(made, "made", tmp_path, project="p")
    assert after == before
    # and the copy exports to the same frames, line for line: nothing drifts
    again = tmp_path / "again.jsonl"
    ok("runs", "export", "made", "--db", f"sqlite:///{tmp_path / 'made-copy.db'}",
       "-o", str(again))
    assert lines(again)[1:] == lines(out)[1:]


def test_paging_does_not_change_what_is_written(db_url: str, tmp_path: Path) -> None:
    """Pages of 1, 2 and 3 frames cut between the frames of a step and between history
    rows and their carrier: the same frames as one page."""
    engine = make_engine(store_made(db_url, tmp_path))
    try:
        with session_scope(sessionmaker(engine)) as s:
            rid = s.scalar(select(Run.id).where(Run.name == "made"))
            assert rid is not None

            def frames(chunk: int | None) -> list[dict[str, Any]]:
                return list(export_module.wire_frames(
                    s, export_module.prepare(s, rid), chunk=chunk))

            whole = frames(None)
            assert len(whole) == 11  # 10 sampled frames and the end frame
            for chunk in (1, 2, 3):
                assert frames(chunk) == whole
    finally:
        engine.dispose()


def test_csv_has_every_stored_value(made: str, tmp_path: Path) -> None:
    out = tmp_path / "made.csv.gz"
    r = ok("runs", "export", "made", "--db", made, "-o", str(out))
    assert "as csv" in r.stderr  # from the name
    with gzip.open(out, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["step", "rank", "metric", "layer", "head", "value"]
    got: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for step, rank, metric, layer, head, value in rows[1:]:
        got[(int(rank), int(step), metric, layer, head)].append(float(value))
    want: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    shapes = {name: (layers, heads) for name, layers, heads in stored(made, "made", "p")[
        "metrics"]}
    for rank, _, step, _, values in stored(made, "made", "p")["frames"]:
        for name, blob in values:
            if name.endswith(ENVELOPE):
                continue
            xs = [x for (x,) in struct.iter_unpack("<f", blob)]
            layers, heads = shapes[name]
            if not layers:
                want[(rank, step, name, "", "")].append(xs[0])
            for i, x in enumerate(xs if layers else []):
                want[(rank, step, name, str(i // heads), str(i % heads))].append(x)
    assert got.keys() == want.keys()
    for k, xs in want.items():  # NaN == NaN here: compare the bits
        assert [struct.pack("<f", x) for x in got[k]] == [struct.pack("<f", x) for x in xs], k
    assert {"NaN", "Infinity", "-Infinity"} <= {row[5] for row in rows}


def test_csv_to_stdout_with_filters(made: str) -> None:
    r = ok("runs", "export", "made", "--db", made, "--format", "csv", "--rank", "2",
           "--metrics", "big,probe")
    rows = list(csv.reader(io.StringIO(r.stdout)))
    # -1e39 was stored saturated to float32's largest; -0.0 keeps its sign
    assert rows[1:] == [["7", "2", "big", "", "", "-3.4028234663852886e+38"],
                        ["7", "2", "probe", "", "", "-0.0"]]


# --- what the wire cannot carry, said --------------------------------------------------------


def test_history_no_frame_can_carry_is_said_and_kept_in_csv(tmp_path: Path) -> None:
    """A frame stored once without history, then resent with a history and another time
    (as a collector that kept no history did): the history rows have their sender's time,
    which no stored frame has. The jsonl export leaves them out and says so."""
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    first = frame(10, 1, T0 + 10, loss=1.0)
    again = frame(10, 1, T0 + 99, history=range(5, 10), loss=1.0)
    for i, f in enumerate(([frame(0, 0, T0, loss=1.0), first], [again])):
        path = tmp_path / f"part{i}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in f))
        ok("replay", str(path), "--db", url)
    hist = [f for f in stored(url, "made", "p")["frames"] if f[1] < 0]
    assert sorted(f[2] for f in hist) == [5, 6, 7, 8, 9]
    r = ok("runs", "export", "made", "--db", url, "-o", str(tmp_path / "odd.jsonl"))
    assert "warning: 5 history step(s) left out" in r.stderr
    assert not any("history" in f for f in lines(tmp_path / "odd.jsonl")[1:])
    r = ok("runs", "export", "made", "--db", url, "--format", "csv")
    assert {5, 6, 7, 8, 9} <= {int(row[0]) for row in csv.reader(io.StringIO(r.stdout))
                               if row[0] != "step"}


def test_matrices_thinned_by_retention_are_said(made: str, tmp_path: Path) -> None:
    ok("retention", "--older-than", "1", "--bucket-steps", "1000", "--yes", "--db", made)
    r = ok("runs", "export", "made", "--db", made, "-o", str(tmp_path / "thin.jsonl"))
    # rank 0 keeps one of its 8 matrices, rank 2 its one
    assert "warning: 7 per-head matrices were thinned by retention" in r.stderr


# --- memory, progress, errors ----------------------------------------------------------------


def seed_long_run(url: str, n: int) -> None:
    """Run ``long``: ``n`` frames of a 16 x 16 matrix and two scalars, stored by ingest."""
    from logitwatch.server.schemas import FrameIn
    from logitwatch.server.store import lifecycle

    engine = make_engine(url)
    migrate(engine)
    row = [float(i) for i in range(16)]
    try:
        for start in range(0, n, 500):
            fs = [FrameIn.model_validate({
                "run": "long", "seq": i, "step": i, "time": T0 + i,
                "scalars": {"loss": 1.0 + i, "lr": 1e-3},
                "heads": {"attn.logit_max": [row] * 16}})
                for i in range(start, min(n, start + 500))]
            with session_scope(sessionmaker(engine)) as s:
                lifecycle.ingest(s, fs)
    finally:
        engine.dispose()


def test_memory_stays_bounded_by_a_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6,000 frames written a page of 200 at a time: the export's peak of Python memory is a
    small part of the run's stored bytes (as wire objects they take several times more),
    and does not grow with the run (about the same peak for 2,000 frames)."""
    monkeypatch.setattr(export_module, "MAX_CHUNK", 200)
    peaks = {}
    for n in (2000, 6000):
        url = f"sqlite:///{tmp_path / f'long{n}.db'}"
        seed_long_run(url, n)
        engine = make_engine(url)
        try:
            with Session(engine) as s:
                ex = export_module.prepare(s, 1)
                tracemalloc.start()
                written = sum(1 for _ in export_module.wire_frames(s, ex))
                peaks[n] = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
        finally:
            engine.dispose()
        assert written == n
    matrices = 6000 * 16 * 16 * 4  # the run's stored matrix bytes alone: 6 MB
    assert peaks[6000] < matrices / 3, peaks  # (about 1 MB: a page and its frames)
    assert peaks[6000] < 1.5 * peaks[2000], peaks


def test_progress_is_replays_a_line_a_second(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.25
        return now[0]

    monkeypatch.setattr(progress_module, "_clock", clock)
    monkeypatch.setattr(export_module, "MAX_CHUNK", 50)
    url = f"sqlite:///{tmp_path / 'long.db'}"
    seed_long_run(url, 400)
    r = ok("runs", "export", "long", "--db", url, "-o", str(tmp_path / "long.jsonl"))
    progress = [line for line in r.stderr.splitlines() if line.endswith("%)")]
    assert 80 <= len(progress) <= 110, r.stderr  # a line every 4 frames of 400
    assert progress[0].strip().startswith("4/400 frames")
    assert "exported 400 frames" in r.stderr
    now[0] = 0.0
    monkeypatch.setattr(progress_module, "_clock", lambda: 0.0)  # a quick export: no line
    r = ok("runs", "export", "long", "--db", url, "-o", str(tmp_path / "long.jsonl"))
    assert not [line for line in r.stderr.splitlines() if line.endswith("%)")]


def test_errors_are_one_line(made: str, tmp_path: Path) -> None:
    out = str(tmp_path / "x.jsonl")
    cases = {
        ("nope",): "no run named 'nope'",
        ("made", "--rank", "5"): "has no frame of rank 5 (its ranks: 0, 2)",
        ("made", "--metrics", "loss,los"): "has no metric 'los' (its metrics: ",
        ("made", "-o", str(tmp_path / "no" / "such" / "dir.jsonl")):
            "cannot write " + str(tmp_path / "no" / "such" / "dir.jsonl"),
        ("made", "-o", str(tmp_path)): "it is a directory",
    }
    for args, want in cases.items():
        r = lw("runs", "export", *args, "--db", made, *(() if "-o" in args else ("-o", out)))
        assert want in one_line_error(r), (args, r.stderr)
        assert not Path(out).exists()
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    assert "no store at" in one_line_error(lw("runs", "export", "made", "--db", missing))
    assert not (tmp_path / "missing.db").exists()  # reading never creates a store
    assert "LOGITWATCH_DB_URL" in one_line_error(lw("runs", "export", "made", "--db",
                                                    str(tmp_path / "made.db")))
    assert list(tmp_path.glob(".*.part")) == []  # no half file left behind


def test_the_default_store_is_the_one_the_other_runs_commands_use(
        made: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGITWATCH_DB_URL", made)
    r = ok("runs", "export", "made")
    head, *frames = [json.loads(line) for line in r.stdout.splitlines()]
    assert head["run"] == "made" and head["project"] == "p" and len(frames) == 11


def test_help_has_an_example() -> None:
    r = ok("runs", "export", "--help")
    assert "logitwatch runs export my-run -o my-run.jsonl.gz" in r.output
    assert "logitwatch replay" in r.output
