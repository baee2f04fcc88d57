"""``bench/pool_reads.py``: held-out reads pooled per detector and interval, and the verdict
against every peer at once on the pooled counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scenario_tools import load


def _doc(split: str, ours: tuple[str, str, str], peer: tuple[str, str, str]) -> dict:
    def row(det: str, f: tuple[str, str, str]) -> dict[str, str]:
        return {"detector": det, "recall": f[0], "healthy_paged": f[1], "unwanted_paged": f[2]}
    return {"rows": [], "summary": {f"{split}@{k}": [row("logitwatch", ours),
                                                     row("fixed max-logit > 100", peer)]
                                    for k in (1, 50)}}


def test_reads_pool_into_one_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    """Two sets: on each alone the detector ties the peer on healthy runs paged (1 each,
    then 2 against 1); pooled it catches 40 to 12 and pages 3 to 2 of every healthy run
    (not better) but 1 to 2 with nothing to warn of (better)."""
    pr = load("pool_reads")
    a = _doc("freshA", ("21/21", "1/42", "0/41"), ("6/21", "1/42", "1/41"))
    b = _doc("freshB", ("19/21", "2/42", "1/41"), ("6/21", "1/42", "1/41"))
    tot = pr.pool([a, b])
    assert tot[("logitwatch", 1)] == [40, 42, 3, 84, 1, 82]
    assert tot[("fixed max-logit > 100", 50)] == [12, 42, 2, 84, 2, 82]
    assert pr.better_than_all(tot, 1, 2) == ["fixed max-logit > 100"]
    assert pr.better_than_all(tot, 1, 4) == []
    files = []
    for name, doc in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    assert pr.main(files) == 0
    out = capsys.readouterr().out
    assert "2 sets pooled: freshA, freshB" in out
    assert ("@50: every healthy run: not better than fixed max-logit > 100 | nothing to warn "
            "of: better than every peer") in out


def test_a_file_that_is_no_read_is_named(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pr = load("pool_reads")
    bad = tmp_path / "notes.txt"
    bad.write_text("caught 21/21")
    with pytest.raises(SystemExit) as e:
        pr.main([str(bad)])
    assert e.value.code == 2
    assert "notes.txt: not a bench_alerts.py --json output" in capsys.readouterr().err
