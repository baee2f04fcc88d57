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
    rows_only = tmp_path / "rows.json"  # JSON, but no summaries to pool
    rows_only.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as e:
        pr.main([str(rows_only)])
    assert e.value.code == 2 and "rows.json: not a bench_alerts.py --json output (no " \
        "summaries in it)" in capsys.readouterr().err


def test_reads_made_with_different_rules_are_not_pooled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pr = load("pool_reads")
    files = []
    for name, rules in (("a.json", "aaaa"), ("b.json", "bbbb"), ("c.json", "aaaa")):
        doc = {**_doc(name[0], ("1/1", "0/2", "0/2"), ("0/1", "0/2", "0/2")), "rules": rules}
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    with pytest.raises(SystemExit) as e:
        pr.main(files)
    assert e.value.code == 2
    assert "made with different rules" in capsys.readouterr().err
    assert pr.main([files[0], files[2]]) == 0
    assert "rules aaaa (not the defaults now)" in capsys.readouterr().out


def test_the_kept_reads_pool_as_one_rule_set(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/reads``: the held-out reads kept in the repository, each of every run of one
    recorded set at the five intervals with the defaults of one round (its fingerprint in
    every file; ``pool_reads.py`` says whether that is the defaults now). The round that
    read them is named in ``bench/reads/README.md``."""
    pr, rec = load("pool_reads"), load("scenario_sets")
    kept = sorted(pr.READS.glob("*.json"))
    assert kept, "no reads kept in bench/reads"
    for p in kept:
        doc = json.loads(p.read_text())
        assert doc["split"] == p.stem and doc["runs"] == len(rec.HELD_OUT[p.stem]), p.name
        assert doc["rules_file"] is None, p.name  # the defaults, no rules file over them
        assert set(doc["summary"]) == {f"{p.stem}@{k}" for k in (1, 10, 25, 40, 50)}, p.name
    assert pr.main([]) == 0
    out = capsys.readouterr().out
    assert f"{len(kept)} sets pooled" in out
    fingerprint = json.loads(kept[0].read_text())["rules"]
    assert f"rules {fingerprint}" in out
    assert fingerprint in (pr.READS / "README.md").read_text()


@pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / "bench" / "scenarios"
                         / "attn_growth_s1.jsonl.gz").exists(), reason="no recorded scenarios")
def test_a_summary_written_by_bench_alerts_pools(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``bench_alerts.py --summary`` on two recorded runs: the summaries alone, with the
    fingerprint of the rules replayed, which ``pool_reads.py`` reads."""
    ba, pr = load("bench_alerts"), load("pool_reads")
    out = tmp_path / "holdout.json"
    assert ba.main(["--split", "holdout", "--names", "attn_growth_s1", "gpt2_bad_data_random",
                    "--intervals", "50", "--jobs", "1", "--summary", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["split"], doc["runs"], doc["intervals"]) == ("holdout", 2, [50])
    assert doc["rules"] == ba.rules_fingerprint() and doc["rules_file"] is None
    ours = next(r for r in doc["summary"]["holdout@50"] if r["detector"] == "logitwatch")
    assert (ours["recall"], ours["healthy_paged"]) == ("1/1", "0/1")
    capsys.readouterr()
    assert pr.main([str(out)]) == 0
    got = capsys.readouterr().out
    assert "1 sets pooled: holdout" in got and "(the defaults now)" in got


def test_each_rounds_kept_reads_are_of_one_rule_set_named_in_the_readme() -> None:
    """``bench/reads/roundN/``: a later round's held-out reads, each of every run of one
    recorded set at the five intervals with that round's defaults; one fingerprint a folder,
    named in ``bench/reads/README.md``, and the newest folder's is the defaults now."""
    pr, rec = load("pool_reads"), load("scenario_sets")
    readme = (pr.READS / "README.md").read_text()
    folders = sorted((p for p in pr.READS.glob("round*") if p.is_dir()),
                     key=lambda p: int(p.name.removeprefix("round")))
    assert folders, "no round folders in bench/reads"
    named = {w.strip("`(),;:") for w in readme.split()}
    prints = {}
    for folder in folders:
        docs = {p: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
        assert docs, folder
        for p, doc in docs.items():
            assert doc["split"] == p.stem and doc["runs"] == len(rec.HELD_OUT[p.stem]), p
            assert doc["rules_file"] is None, p
        rule_sets = {doc["rules"] for doc in docs.values()}
        assert len(rule_sets) == 1, (folder, rule_sets)
        prints[folder.name] = rule_sets.pop()
        assert prints[folder.name] in named, folder
    newest = folders[-1].name
    assert prints[newest] == load("bench_alerts").rules_fingerprint(), newest
