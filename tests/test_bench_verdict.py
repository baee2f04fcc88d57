"""``bench/bench_alerts.py``'s summary of healthy runs paged: every healthy run, and those
with nothing to warn of (no expected alert in their header), and the verdict against every
peer at once that the issue's target names (more runs caught and fewer healthy runs paged)."""

from __future__ import annotations

from typing import Any

from tests.scenario_tools import load


def _row(name: str, label: str, lw: int | None, peer: int | None, *,
         expect: str | None = None, rules: tuple[str, ...] = ()) -> dict[str, Any]:
    ba = load("bench_alerts")
    row: dict[str, Any] = {
        "scenario": name, "label": label, "divergence_step": 500 if label == "diverging" else None,
        "signal": None, "any_alert": lw, "rules_paged": list(rules),
        "logitwatch": {"first": lw, "from50": lw}}
    row[ba.ARRIVAL] = row["logitwatch"]
    for p in ba.PEERS:
        row[p] = {"first": peer, "from50": peer}
    if expect:
        row["expect_alert"] = expect
    return row


def test_a_refuge_page_is_counted_apart_and_the_verdict_says_who_is_not_beaten() -> None:
    ba = load("bench_alerts")
    rows = [_row("d1", "diverging", 450, None), _row("d2", "diverging", 480, 490),
            _row("refuge", "healthy", 300, None, expect="qk_bias_refuge",
                 rules=("q_bias_refuge",)),
            _row("calm", "healthy", None, 200), _row("calm2", "healthy", None, None)]
    summary = ba.summaries(rows)
    lw = summary[0]
    assert (lw["recall"], lw["healthy_paged"], lw["unwanted_paged"]) == ("2/2", "1/3", "0/2")
    peer = summary[2]
    assert (peer["recall"], peer["healthy_paged"], peer["unwanted_paged"]) == ("1/2", "1/3",
                                                                               "1/2")
    # every healthy run counted: a tie on pages (1 and 1) is not better
    assert ba._at_once(summary, "healthy_paged").startswith("not better than Megatron-LM")
    assert "max-logit" in ba._at_once(summary, "healthy_paged")
    # the refuge's wanted warning left out: fewer pages and more caught than each peer
    assert ba._at_once(summary, "unwanted_paged") == "better than every peer"
    text = ba._side_by_side({("s", 1): summary}, ["s"], [1])
    assert "nothing to warn of" in text and "better than every peer" in text
