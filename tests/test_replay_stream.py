"""``logitwatch replay FILE`` on files of any size, and what ``runs export`` wrote restored.

The file is read a line at a time and stored a batch at a time: Python's peak memory does
not grow with the file; the progress says the frames done, with a percentage where the
total is known without reading the file twice. The batch size changes nothing: the alerts
fired and every stored row are those of a replay one frame at a time, on the shapes where
the engine judged differently by batch before (a job restarted from an earlier checkpoint,
another rank outliving rank 0's end frame, in live order and as exported). A batch keeps to
what one ingest request may carry (history steps). An export's header gives the copy its
run's config and tags; a header of another run or of a newer export version is refused
before anything is stored. All through the real CLI and store (SQLite)."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

import logitwatch._cli_progress as progress_module
from logitwatch.server.alerts.replay import read_frames, replay
from logitwatch.server.db.models import RuleMemory, Run, RunTag
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.store.run_edits import set_config
from tests.test_cli_audit_ux import one_line_error
from tests.test_cli_export import lw, made_frames, ok, stored

T0 = time.time() - 7 * 86400


def write(path: Path, frames: Iterable[dict[str, Any]],
          header: dict[str, Any] | None = None) -> int:
    """``frames`` a line each (gzip'd for a ``.gz`` name) after ``header``; the bytes of
    JSON written."""
    lines = ([json.dumps(header)] if header is not None else []) + [json.dumps(f)
                                                                    for f in frames]
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), compresslevel=1))
    else:
        path.write_text(text)
    return len(text)


def sampled(n: int, *, run: str = "big", every: int = 4, side: int = 16,
            matrix: str = "attn.logit_max", history: bool = True) -> Iterable[dict[str, Any]]:
    """``n`` frames of a healthy run, one every ``every`` steps carrying the steps between
    in its history, each with a ``side`` x ``side`` per-head ``matrix`` (what makes a file
    big)."""
    for i in range(n):
        step = i * every
        f: dict[str, Any] = {
            "run": run, "rank": 0, "seq": i, "step": step, "time": T0 + step,
            "scalars": {"loss": 3.0 - step * 1e-4, "grad.norm": 1.0},
            "heads": {matrix: [[round(5.0 + (i * 7 + h * 3 + layer) % 97 * 1e-3, 4)
                                for h in range(side)] for layer in range(side)]}}
        if history and i:
            steps = list(range(step - every + 1, step))
            f["history"] = {"steps": steps, "scalars": {"loss": [3.0 - s * 1e-4
                                                                 for s in steps]}}
        yield f


# --- 1. memory -----------------------------------------------------------------------------


def test_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """Files of 300 and 1,200 frames of a 32 x 32 matrix (a statistic no rule reads: the
    engine's memory of per-head cells is bounded on its own, and judging them is slow):
    the replay's peak of Python memory is about the same for both; the 900 more frames
    (6.6 MB of JSON, several times that as Python objects, which the old replay held all
    of) add a fraction of their JSON (what grows is the engine's memory of the loss, up to
    its 1,024 samples)."""
    write(tmp_path / "warm.jsonl", sampled(3))  # the imports, out of the measure
    ok("replay", str(tmp_path / "warm.jsonl"), "--db", f"sqlite:///{tmp_path / 'w.db'}")
    peaks, sizes = {}, {}
    for n in (300, 1200):
        path = tmp_path / f"big{n}.jsonl.gz"
        sizes[n] = write(path, sampled(n, every=1, side=32, matrix="probe.act_rms"))
        url = f"sqlite:///{tmp_path / f'big{n}.db'}"
        tracemalloc.start()
        try:
            r = ok("replay", str(path), "--db", url)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert f"replayed {n} frames of 1 run" in r.stderr
        assert len(stored(url, "big")["frames"]) == n
    assert peaks[1200] < 1.3 * peaks[300], peaks
    assert peaks[1200] - peaks[300] < (sizes[1200] - sizes[300]) / 3, (peaks, sizes)


# --- 2. progress ---------------------------------------------------------------------------


def progress(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines()
            if line.startswith("  ") and line.strip().split(" ")[1:2] == ["frames"]
            or line.strip().endswith("%)")]


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that moves a second each time it is read: every progress call prints."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(progress_module, "_clock", clock)


def test_progress_of_a_gzip_file_says_the_frames_done_without_a_total(
        tmp_path: Path, ticking: None) -> None:
    """A gzip'd file is not decompressed twice to count its frames: the lines say how many
    are done; a plain file's lines are counted first (a scan of its bytes) and a gzip'd
    export's header says how many it holds: those lines have a percentage."""
    frames = list(sampled(40, history=False))
    write(tmp_path / "f.jsonl.gz", frames)
    r = ok("replay", str(tmp_path / "f.jsonl.gz"))
    lines = progress(r.stderr)
    assert lines[:2] == ["16 frames", "32 frames"], r.stderr  # judged 16 at a time
    assert "replaying the frames of" in r.stderr and "replayed 40 frames" in r.stderr

    write(tmp_path / "f.jsonl", frames)
    r = ok("replay", str(tmp_path / "f.jsonl"))
    assert progress(r.stderr) == ["16/40 frames (40 %)", "32/40 frames (80 %)"], r.stderr
    assert "replaying 40 frames of" in r.stderr

    header = {"logitwatch_export": 1, "project": "default", "run": "big", "config": {},
              "tags": [], "ranks": [0], "end_step": None, "frames": 40}
    write(tmp_path / "e.jsonl.gz", frames, header)
    r = ok("replay", str(tmp_path / "e.jsonl.gz"))
    assert progress(r.stderr) == ["16/40 frames (40 %)", "32/40 frames (80 %)"], r.stderr


# --- 3. the batch size changes nothing -----------------------------------------------------


def outlived() -> list[dict[str, Any]]:
    """Run p/outlived: ranks 0 and 1 step together to step 200, where rank 0 stops; rank 1
    goes on to step 300 and its loss turns NaN at step 250; rank 0's end frame (at step
    200) comes last, as from a job whose close took longer than rank 1's last steps."""
    out: list[dict[str, Any]] = []
    for i in range(31):
        for rank in (0, 1):
            if rank == 0 and i > 20:
                continue
            loss: Any = 3.0 - 0.001 * i if rank == 0 or i < 25 else "NaN"
            out.append({"run": "outlived", "project": "p", "rank": rank, "seq": i,
                        "step": 10 * i, "time": T0 + 10 * i + rank,
                        "scalars": {"loss": loss, "grad.norm": 1.0}})
    out.append({"run": "outlived", "project": "p", "rank": 0, "seq": 21, "step": 200,
                "time": T0 + 301, "end": "finished"})
    return out


def everything(url: str, name: str, project: str) -> dict[str, Any]:
    """What a store holds of a run: every frame row with its values and the run's fields
    (:func:`tests.test_cli_export.stored`), its alerts and the engine's rule memory."""
    from logitwatch.server.store.alerts import list_alerts

    engine = make_engine(url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            rid = s.scalar(select(Run.id).where(Run.project == project, Run.name == name))
            assert rid is not None
            alerts = [a.model_dump(exclude={"id", "run_id", "fired_at"})
                      for a in list_alerts(s, rid)]
            memory = sorted((r.rank, r.data) for r in s.execute(
                select(RuleMemory.rank, RuleMemory.data).where(RuleMemory.run_id == rid)))
    finally:
        engine.dispose()
    return {"rows": stored(url, name, project), "memory": memory,
            "alerts": sorted(alerts, key=lambda a: (a["rule"], a["rank"], a["fired_step"],
                                                   str(a["layer"]), str(a["head"])))}


def exported(frames: list[dict[str, Any]], name: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``frames`` stored by ``logitwatch replay``, then written out by ``runs export``: the
    file's frames (rank by rank, in step order, the end frame last)."""
    src, url = tmp_path / f"{name}.jsonl", f"sqlite:///{tmp_path / f'{name}-src.db'}"
    write(src, frames)
    ok("replay", str(src), "--db", url)
    out = tmp_path / f"{name}-export.jsonl.gz"
    ok("runs", "export", name, "--project", "p", "--db", url, "-o", str(out))
    return read_frames(out)[1]


@pytest.mark.parametrize("shape", ["restarted, live", "restarted, exported",
                                   "outlived, live", "outlived, exported"])
def test_alerts_and_stored_rows_do_not_depend_on_the_batch_size(tmp_path: Path,
                                                                 shape: str) -> None:
    """Batches of 1 (the reference: each frame judged as it came), 2, 16 (the old CLI's)
    and 256 (the new one's) store the same rows, fire the same alerts and leave the engine
    the same memory. Before, a restarted job's frame at a step its second life's history
    also held was judged or taken as late by what shared its batch (grad_nonfinite at step
    30 fired at 1 and 2, not at 16), and rank 1's NaN loss after rank 0's end frame fired
    unless the end frame shared its batch (at 16, not at 256)."""
    name = shape.split(",")[0]
    frames = made_frames() if name == "restarted" else outlived()
    run = "made" if name == "restarted" else "outlived"
    if "exported" in shape:
        frames = exported(frames, run, tmp_path)
    got = {}
    for batch in (1, 2, 16, 256):
        url = f"sqlite:///{tmp_path / f'b{batch}.db'}"
        replay(frames, db_url=url, batch=batch, rules=None)
        got[batch] = everything(url, run, "p")
    assert got[1]["alerts"], "the shapes fire alerts: there is something to compare"
    for batch in (2, 16, 256):
        assert got[batch] == got[1], batch


def test_a_batch_keeps_under_the_history_steps_one_request_may_carry(tmp_path: Path) -> None:
    """Six frames each carrying 4,000 history steps (the wire's most is 4,096 a frame):
    24,000 in all, more than one request may carry (20,000); the replay stores them in two
    batches, as a client must send them (the old replay sent all six at once, refused)."""
    frames = []
    for i in range(6):
        steps = list(range(i * 4001, i * 4001 + 4000))
        frames.append({"run": "long", "rank": 0, "seq": i, "step": i * 4001 + 4000,
                       "time": T0 + i, "scalars": {"loss": 2.0},
                       "history": {"steps": steps, "scalars": {"loss": [2.0] * 4000}}})
    write(tmp_path / "long.jsonl", frames)
    url = f"sqlite:///{tmp_path / 'long.db'}"
    r = ok("replay", str(tmp_path / "long.jsonl"), "--db", url)
    assert "replayed 6 frames" in r.stderr
    assert len(stored(url, "long")["frames"]) == 6 * 4001


# --- 4. the export header ------------------------------------------------------------------


def tags_and_config(url: str, name: str) -> tuple[list[str], Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            run = c.execute(select(Run.id, Run.config).where(Run.name == name)).one()
            tags = sorted(c.scalars(select(RunTag.tag).where(RunTag.run_id == run.id)))
    finally:
        engine.dispose()
    return tags, run.config


@pytest.fixture
def source(tmp_path: Path) -> str:
    """A store holding run p/made (a restarted job, two ranks, NaN and infinities) with a
    configuration, set as ``PUT /runs/{run}/config`` sets it, and two tags."""
    url = f"sqlite:///{tmp_path / 'src.db'}"
    write(tmp_path / "made.jsonl", made_frames())
    ok("replay", str(tmp_path / "made.jsonl"), "--db", url)
    engine = make_engine(url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            rid = s.scalar(select(Run.id).where(Run.name == "made"))
            assert rid is not None
            set_config(s, rid, {"lr": 3e-4, "model": {"layers": 12, "heads": [8, 8]},
                                "note": "ünïcode"})
    finally:
        engine.dispose()
    ok("runs", "tag", "made", "bug-1234", "keep:yes", "--db", url)
    return url


def test_an_export_comes_back_with_its_config_and_tags(source: str, tmp_path: Path) -> None:
    out = tmp_path / "made.jsonl.gz"
    ok("runs", "export", "made", "--db", source, "-o", str(out))
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    r = ok("replay", str(out), "--db", copy)
    assert "from the export header: p/made got 3 config keys and the tags bug-1234, keep:yes" \
        in r.stderr, r.stderr
    assert tags_and_config(copy, "made") == tags_and_config(source, "made") == (
        ["bug-1234", "keep:yes"], {"lr": 3e-4, "model": {"layers": 12, "heads": [8, 8]},
                                   "note": "ünïcode"})
    assert stored(copy, "made", "p") == stored(source, "made", "p")  # every series
    # --no-header: the frames alone
    bare = f"sqlite:///{tmp_path / 'bare.db'}"
    ok("replay", str(out), "--db", bare, "--no-header")
    assert tags_and_config(bare, "made")[0] == []
    assert not tags_and_config(bare, "made")[1]


def runs_in(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        migrate(engine)
        with engine.connect() as c:
            return list(c.scalars(select(Run.name)))
    finally:
        engine.dispose()


def test_a_header_of_another_run_or_a_newer_export_is_refused(source: str,
                                                              tmp_path: Path) -> None:
    """Each refused in one line before anything is stored; --no-header reads past it."""
    out = tmp_path / "made.jsonl"
    ok("runs", "export", "made", "--db", source, "-o", str(out))
    head, *rest = out.read_text().splitlines()
    cases = {
        "other": ({"run": "other"}, "line 2: a frame of run p/made, but the file's header "
                  "(line 1) is of run p/other: an export holds one run"),
        "newer": ({"logitwatch_export": 2}, f"{tmp_path / 'newer.jsonl'}:1: an export of "
                  "version 2 (logitwatch_export), newer than this logitwatch reads (version "
                  "1): upgrade logitwatch to replay it"),
        "tag": ({"tags": ["no spaces"]}, "line 1: the export header's tag 'no spaces': "
                "1-64 characters"),
        "config": ({"config": ["not", "an", "object"]}, "config: not a JSON object"),
    }
    for case, (change, want) in cases.items():
        path = tmp_path / f"{case}.jsonl"
        path.write_text("\n".join([json.dumps({**json.loads(head), **change}), *rest]) + "\n")
        url = f"sqlite:///{tmp_path / f'{case}.db'}"
        assert want in one_line_error(lw("replay", str(path), "--db", url)), case
        assert runs_in(url) == [], case
        if case in ("other", "newer"):
            ok("replay", str(path), "--db", url, "--no-header")
            assert runs_in(url) == ["made"]


# --- 5. a file that cannot be read to its end ------------------------------------------------


def test_a_truncated_file_keeps_the_frames_before_the_cut(tmp_path: Path) -> None:
    """An export cut off in a copy: the frames before the cut are stored (read and stored
    as they came, the batch under way too), the error says so and where, and the whole file
    replayed later adds the rest."""
    whole = tmp_path / "whole.jsonl.gz"
    write(whole, sampled(600, history=False))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    url = f"sqlite:///{tmp_path / 'cut.db'}"
    err = one_line_error(lw("replay", str(cut), "--db", url))
    assert "the gzip file ends early" in err and f"{cut}:" in err, err
    kept = len(stored(url, "big")["frames"])
    assert 256 < kept < 600, kept  # a batch stored, and the one under way
    assert f"{kept} frames were read before it; the {kept} frames before it are stored in " \
        f"{url}" in err, err
    ok("replay", str(whole), "--db", url)
    assert len(stored(url, "big")["frames"]) == 600
