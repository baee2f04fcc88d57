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


def test_a_lead_counts_as_held_only_where_its_signal_still_fired_at_the_divergence() -> None:
    """The held lead: an early non-loss alert that came back in range before the divergence
    (a warm-up blip) is a signal, but not one held to the divergence; a loss rule's alert
    is neither."""
    from types import SimpleNamespace as A

    ba = load("bench_alerts")
    blip = A(rule="grad_blowup", fired_step=99, resolved_step=110)
    climb = A(rule="attn_logit_departure", fired_step=270, resolved_step=None)
    late = A(rule="grad_spike", fired_step=380, resolved_step=None)
    loss = A(rule="loss_jump", fired_step=60, resolved_step=None)
    assert ba._held_signal([blip, climb, late, loss], 364) == 270
    assert ba._held_signal([blip, loss], 364) is None
    assert ba._held_signal([A(rule="grad_blowup", fired_step=300, resolved_step=364)],
                           364) == 300
    assert ba._held_signal([climb], None) is None
    rows = [dict(_row("paged_ahead", "diverging", 400, None), signal=99, signal_held=270),
            dict(_row("paged_late", "diverging", 495, None), signal=99, signal_held=None),
            dict(_row("held_late", "diverging", 495, None), signal=300, signal_held=300)]
    lw = ba.summaries(rows)[0]
    # three runs where a signal led; two where it held, one of them paged 50 steps ahead
    assert (lw["lead>=50"], lw["lead>=50 held"]) == ("1/3", "1/2")
