"""``bench/mirror_sgd.py``, the offline mirrors of two momentum-SGD limits (docs/ALERTS.md,
*Known limits*), on recorded runs: after a garbage stretch a run it wrecked and one that
heals read alike at the garbage's end; a softer corroboration pages fresh77's soft
blow-ups by their divergence and leaves a healthy plain SGD run alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scenario_tools import BENCH, FILES, load

SCENARIOS = BENCH / "scenarios"


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_wrecked_and_a_healing_garbage_run_read_alike_at_the_garbages_end() -> None:
    m = load("mirror_sgd")
    sets = frozenset({"fresh73"})
    wrecked = m.garbage_row(SCENARIOS / "f73_postln_sgd_bad_data_11.jsonl.gz", sets)
    healed = m.garbage_row(SCENARIOS / "f73_llama_sgd_bad_data_10.jsonl.gz", sets)
    assert wrecked is not None and healed is not None
    assert (wrecked["label"], healed["label"]) == ("diverging", "healthy")
    assert wrecked["div"] - wrecked["end"] == 9  # dated 9 steps after the garbage ended
    # at the end the healing run is further up (1.14 nat) than the wrecked one (0.83) ...
    assert healed["excess"][0] > wrecked["excess"][0] > 0.5
    # ... and every rule of the grid but the strictest fires on both at once
    for key in ("0.8/5.0", "1.0/3.0", "1.0/5.0", "1.5/5.0", "2.0/5.0"):
        assert wrecked["fires"][key] == 419 and healed["fires"][key] == 424, key
    # 50 steps on, only the wrecked one is still more than half a nat up
    assert wrecked["excess"][-1] > 0.5 > healed["excess"][-1]
    # a run of another set, or not of SGD with bad batches, is no row
    assert m.garbage_row(SCENARIOS / "f73_postln_sgd_bad_data_11.jsonl.gz",
                         frozenset({"fresh72"})) is None
    assert m.garbage_row(SCENARIOS / "f73_gpt2_plain_sgd.jsonl.gz", sets) is None


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_softer_corroboration_pages_fresh77s_soft_blowups_by_their_divergence(
        tmp_path: Path) -> None:
    m = load("mirror_sgd")
    sets = frozenset({"fresh77"})
    blowup = m.soft_row(SCENARIOS / "f77_postln_sgd_blowup.jsonl.gz", sets)
    warm = m.soft_row(SCENARIOS / "f77_postln_plain_sgd_warm.jsonl.gz", sets)
    plain = m.soft_row(SCENARIOS / "f77_gpt2_plain_sgd.jsonl.gz", sets)
    assert blowup is not None and warm is not None and plain is not None
    assert all(v == 77 for v in blowup["fires"].values())  # divergence at 78
    assert warm["fires"]["2.5/4.0"] == 94 and warm["fires"]["2.5/5.0"] == 114  # at 95
    assert all(v is None for v in plain["fires"].values())
    assert m.tally([blowup, warm, plain], "2.5/4.0") == (0, 2)
    assert m.tally([blowup, warm, plain], "2.5/5.0") == (0, 1)

    # --paged: a healthy run the rule fires on that nothing pages now, and a late blow-up
    paged = {"rows": [
        {"interval": 1, "scenario": "f77_postln_sgd_blowup", "label": "diverging",
         "divergence_step": 78, "logitwatch": {"first": 88}},
        {"interval": 1, "scenario": "f77_postln_plain_sgd_warm", "label": "diverging",
         "divergence_step": 95, "logitwatch": {"first": 104}},
        {"interval": 10, "scenario": "f77_gpt2_plain_sgd", "label": "healthy",
         "divergence_step": None, "logitwatch": {"first": 70}}]}
    (tmp_path / "paged.json").write_text(json.dumps(paged))
    got = m.load_paged([tmp_path / "paged.json"])
    assert set(got) == {"f77_postln_sgd_blowup", "f77_postln_plain_sgd_warm"}  # interval 1
    out = tmp_path / "runs.txt"
    assert m.main(["soft", "--split", "fresh77", "--jobs", "1", "--candidates", str(out),
                   "--paged", str(tmp_path / "paged.json")]) == 0
    names = out.read_text().split()
    assert {"f77_postln_sgd_blowup", "f77_postln_plain_sgd_warm"} <= set(names)
    assert "f77_gpt2_plain_sgd" not in names


def test_mirror_sgd_says_when_a_split_holds_no_such_runs(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    m = load("mirror_sgd")
    with pytest.raises(SystemExit) as e:
        m.main(["garbage", "--split", "fresh77", "--jobs", "1", "--scenarios", str(tmp_path)])
    assert e.value.code == 2
    assert "no recorded runs of that kind in --split fresh77" in capsys.readouterr().err


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_harder_surge_pages_fresh78s_soft_blowup_at_8x_not_16x(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--grid``: the gradient asked to surge 8x its calm median catches
    ``f78_gpt2_sgd_blowup`` on its divergence step (71), 16x only at 80; a grid that is no
    NATS:GRAD list is refused."""
    m = load("mirror_sgd")
    grid = ((2.0, 8.0), (2.0, 16.0))
    row = m.soft_row(SCENARIOS / "f78_gpt2_sgd_blowup.jsonl.gz", frozenset({"fresh78"}), grid)
    assert row is not None and row["div"] == 71
    assert row["fires"] == {"2.0/8.0": 71, "2.0/16.0": 80}
    assert m.main(["soft", "--split", "fresh78", "--jobs", "1", "--grid", "2:8,2:16"]) == 0
    assert "gradient 16.0x" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        m.main(["soft", "--split", "fresh78", "--grid", "2:eight"])
    assert e.value.code == 2 and "give NATS:GRAD pairs" in capsys.readouterr().err
