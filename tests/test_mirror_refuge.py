"""``bench/mirror_refuge.py``, the offline mirror of the QK-clip bias refuge rules, on
recorded runs: round forty-five's rule (a quarter of the weight's norm, held 30 steps) pages
``qkclip2``'s tau-3 run whose clip scales the biases and round forty-six's (half, on one
step) does not, while both page a refuge; the run whose scaled bias came nearest (0.355)
breaches under neither."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenario_tools import BENCH, FILES, load

SCENARIOS = BENCH / "scenarios"
SETS = frozenset({"qkclip2"})


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_round_forty_six_spares_the_scaled_clip_that_round_forty_five_paged() -> None:
    m = load("mirror_refuge")
    scaled = m.breach_row(SCENARIOS / "q2_gpt2_qk_clip_scaled_t3_lo_i5.jsonl.gz", SETS)
    nearest = m.breach_row(SCENARIOS / "q2_gpt2_qk_clip_scaled_t3_hi_i2.jsonl.gz", SETS)
    refuge = m.breach_row(SCENARIOS / "q2_gpt2_qk_clip_s0.jsonl.gz", SETS)
    assert scaled is not None and nearest is not None and refuge is not None
    assert (scaled["scaled"], nearest["scaled"], refuge["scaled"]) == (True, True, False)
    assert refuge["expect"] == "qk_bias_refuge"
    # the scaled run's bias peaks at a third of the weight's norm, held past 30 steps
    assert max(s for seq in scaled["breaches"].values() for _, s in seq) < 0.35
    assert m.first_page(scaled, 0.25, 30) == 270 and m.first_page(scaled, 0.5, 0) is None
    assert max(s for seq in nearest["breaches"].values() for _, s in seq) < 0.36
    assert m.first_page(nearest, 0.25, 30) is None and m.first_page(nearest, 0.5, 0) is None
    # the refuge's bias passes the weight's norm: paged under both, earlier under 0.5
    assert max(s for seq in refuge["breaches"].values() for _, s in seq) > 1.0
    assert m.first_page(refuge, 0.5, 0) < m.first_page(refuge, 0.25, 30)
    got = m.judge([scaled, nearest, refuge], m.GRID)
    assert [j["scaled"] for j in got] == [["q2_gpt2_qk_clip_scaled_t3_lo_i5"], []]
    assert [j["refuges"] for j in got] == [(1, 1), (1, 1)]
    assert got[1]["shift"][0] < 0 and not got[0]["shift"][0]
    # a run of another set, or with no q/k biases, is no row
    assert m.breach_row(SCENARIOS / "q2_gpt2_qk_clip_s0.jsonl.gz", frozenset({"qkclip1"})) \
        is None
    assert m.breach_row(SCENARIOS / "f80_llama_lr_jump.jsonl.gz", frozenset({"fresh80"})) \
        is None


def test_mirror_refuge_says_what_is_wrong(tmp_path: Path) -> None:
    m = load("mirror_refuge")
    for argv in (["--grid", "0.5"], ["--grid", "0.1:0"],
                 ["--split", "qkclip2", "--jobs", "1", "--scenarios", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            m.main(argv)
        assert e.value.code == 2, argv
