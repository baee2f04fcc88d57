"""``bench/watch_cost.py``, what the hooks' spike watch costs a job, on recorded runs: a
blow-up's steps before its divergence ask for samples and flushes, a steady healthy run's
ask for none, and the table says so per label; an empty split is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.scenario_tools import BENCH, FILES, load

SCENARIOS = BENCH / "scenarios"


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_the_watch_flags_a_blowups_precursor_and_not_a_steady_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = load("watch_cost")
    blowup = m.one(str(SCENARIOS / "f72_postln_sgd_blowup.jsonl.gz"))
    # its precursor at 201-203 and the loss at 204 before the divergence at 205
    assert blowup["label"] == "diverging" and blowup["steps"] == 205
    assert blowup["asked"] == 3 and blowup["flagged"] >= 4, blowup
    steady = m.one(str(SCENARIOS / "f72_llama_lr_bump.jsonl.gz"))
    assert steady["label"] == "healthy" and steady["steps"] > 500
    assert steady["flagged"] <= 2 and steady["asked"] <= steady["flagged"], steady
    for name in ("f72_postln_sgd_blowup", "f72_llama_lr_bump"):
        shutil.copy(SCENARIOS / f"{name}.jsonl.gz", tmp_path)
    assert m.main(["--split", "fresh72", "--jobs", "1", "--scenarios", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert set(rows) == {"diverging", "healthy"}
    assert rows["diverging"][1:3] == ["1", "205"]
    with pytest.raises(SystemExit) as e:
        m.main(["--split", "fresh71", "--jobs", "1", "--scenarios", str(tmp_path)])
    assert e.value.code == 2
