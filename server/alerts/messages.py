"""How an alert speaks: its one-line message, what a downgrade or a page hold adds to it,
and the values it shows, as text (:func:`_fmt`) and as JSON evidence (:func:`_json`,
:func:`_finite`: a non-finite number is stored as its string, or not at all).

Pure functions of a rule, its transition and the run; the alert engine
(:mod:`~logitwatch.server.alerts.engine`) and its lifecycle
(:mod:`~logitwatch.server.alerts.lifecycle`) call them.
"""

from __future__ import annotations

import math

from logitwatch.server.alerts.rules import RuleSpec, Transition
from logitwatch.server.db.models import Run


def _page_text(why: dict[str, object], severity: str, loss_over: object = None) -> str:
    """What an alert held back by its page policy adds to its message; ``loss_over``: the
    rule's ``aftershock_loss`` (nats the loss must still be over its median for damage)."""
    conds = []
    if why.get("after") is not None:
        conds.append(f"if it persists {why['after']} steps")
        if why.get("recover_within") is not None:
            conds.append(f"if {why['after']} steps after it started the {why.get('metric')}'s "
                         f"level (the median of its last {why.get('recover_steps')} steps) is "
                         f"not back within {_fmt(why['recover_within'])} of its level before")
    if why.get("eta_within") is not None:
        conds.append(f"once the crossing is within {why['eta_within']} steps")
    if why.get("with_rules"):
        also = (f" and the event lasts past {why['confirm_steps']} step(s)"
                if why.get("confirm_steps") else "")
        if also and why.get("confirm_adaptive"):
            also += " (the loss's own steps under an adaptive optimizer, unclipped)"
        if also and why.get("at_once_above") is not None:
            also += f" (at once {_fmt(why['at_once_above'])} above its baseline"
            if why.get("at_once_adaptive_above") is not None:
                also += (f"; under an adaptive optimizer, unclipped, after an update of "
                         f"{_fmt(why['at_once_adaptive_above'])}x the gradient's median")
            also += ")"
        if why.get("precursor_above") is not None:
            also += (f", after a precursor (the gradient norm already "
                     f"{_fmt(why['precursor_above'])}x its median in the steps before the "
                     "loss jump)")
            if why.get("aftershock_above") is not None:
                also += (f" or after damage (the gradient norm still "
                         f"{_fmt(why['aftershock_above'])}x its median on the batch after "
                         "the jump, the loss still "
                         + (f"{_fmt(loss_over)} nats over its median)"
                            if isinstance(loss_over, (int, float)) and loss_over > 0
                            else "out of range)"))
            if why.get("climb_above") is not None:
                also += (f" or climbing (the loss {_fmt(why['climb_above'])} nats over the "
                         "earlier jumps of its run)")
        conds.append("if " + " or ".join(str(r) for r in why["with_rules"])  # type: ignore[attr-defined]
                     + " breaches with it" + also)
    if why.get("repeats"):
        built = (f" ({why['repeats_built']} after a precursor, unclipped)"
                 if why.get("repeats_built") else "")
        after = (f", not counting a jump under {_fmt(100 * float(why['repeats_aftershock']))} % "
                 "of an earlier one (its aftershock)" if why.get("repeats_aftershock") else "")
        conds.append(f"if it comes back {why['repeats']} times{built} within "
                     f"{why.get('repeats_within')} steps{after}")
    cond = " or ".join(conds)
    note = why.get("note")
    return f" Info for now: it becomes a {severity} {cond}." + (f" {note}" if note else "")


def _lr_kept_text(why: dict[str, object]) -> str:
    """Why a wide-dtype alert kept its severity: a plain optimizer's LR still climbing."""
    return (f"the learning rate of a plain optimizer is still climbing "
            f"({_fmt(100 * float(why['lr_climb']))} % over its last {why['loss_window']} "
            f"steps), and its logits climb with it")


def _downgrade_text(why: dict[str, object]) -> str:
    """What a downgraded alert adds to its message."""
    text = (f" {str(why['to']).capitalize()}, not {why['from']}: {why['metric']} = "
            f"{_fmt(why['value'])}")
    if why.get("loss_recovering"):
        text += (f" and the loss, {_fmt(why['loss_rise'])} nats above its best, is winning "
                 f"it back (its level, the median of its newest {why['recover_span']} steps, "
                 f"has come down by {_fmt(100 * float(why['recover_share']))}% or more of its "
                 f"peak's height: a bump the loss rules judge; a rise that holds makes it a "
                 f"{why['from']})")
    elif why.get("loss_before"):
        text += (f" and the loss, {_fmt(why['loss_rise'])} nats above its best, was up "
                 f"already when the episode started at step {why['started_step']} (its level, "
                 f"the median of its newest {why['recover_span']} steps, is "
                 f"{_fmt(why['loss_since_start'])} nats from where it was then: another "
                 f"cause's bump, which the loss rules judge; "
                 + _start_rise_text(float(why['start_rise'])) + f" makes it a {why['from']})")
    elif "loss_rise" in why:
        text += (f" and the loss is {_fmt(why['loss_rise'])} nats above its best (a "
                 f"{_fmt(why['loss_rise_limit'])}-nat rise makes it a {why['from']})")
    note = why.get("note")
    return text + (f". {note}" if note else ".")


def _start_rise_text(r: float) -> str:
    """What lifts a downgrade held by ``Downgrade.start_rise`` ``r``."""
    if r > 0:
        return f"a further {_fmt(r)}-nat climb"
    if r < 0:
        return f"its level back within {_fmt(-r)} nats of that"
    return "a climb past that level"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _json(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (list, tuple)):
        return [_json(i) for i in x]
    return x


def _fmt(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _message(run: Run | None, rule: RuleSpec, rank: int, layer: int | None,
             heads: list[int], t: Transition) -> str:
    """One line: where, what, since when, the evidence, what it means."""
    name = run.name if run else "?"
    where = f"rank {rank}"
    ev0 = t.verdict.evidence
    if layer is None and "at_layer" in ev0:
        where += f" (worst head: layer {ev0['at_layer']}, head {ev0['at_head']})"
    if layer is not None:
        hs = ", ".join(str(h) for h in heads)
        where += f", layer {layer}, head{'s' if len(heads) > 1 else ''} {hs}"
    v, ev = t.verdict, t.verdict.evidence
    what = f"{ev.get('judged_metric', rule.metric)} = {_fmt(v.value)}"
    if rule.kind == "departure" and ("above_baseline" in ev or "below_baseline" in ev):
        # an additive margin, above the baseline or (``below``) under it
        side, way = ("below", "down") if "below_baseline" in ev else ("above", "up")
        what += (f" is {_fmt(ev[side + '_baseline'])} {side} its baseline {v.baseline:.3g}"
                 if math.isfinite(v.value) else " (non-finite)")
        if ev.get("running_away"):
            what += (f" (its {rule.param('climb_window')}-step level judged: a ramp, {way} "
                     f"{_fmt(rule.param('fast_climb'))} or more in each half of the last "
                     f"{rule.param('climb_span')} steps)")
        moved = ev.get("fell" if way == "down" else "climbed")
        if moved is not None:
            what += (f", its {rule.param('climb_window')}-step level {way} "
                     f"{_fmt(moved)} on {rule.param('climb_span')} steps before")
    elif rule.kind in ("departure", "baseline") and v.baseline:
        what += (f" is {v.value / v.baseline:.1f}x its baseline {v.baseline:.3g}"
                 if math.isfinite(v.value) else " (non-finite)")
    elif rule.kind == "forecast" and ev.get("eta_steps") is not None:
        what += (f", on course to cross {_fmt(ev.get('critical'))} in ~{ev['eta_steps']} steps "
                 f"(around step {ev.get('crosses_at_step')})")
    elif rule.kind == "trend":
        what += (f", x{_fmt(ev.get('growth_over_window'))} since step "
                 f"{ev.get('window_from_step')} (Kendall tau {_fmt(ev.get('kendall_tau'))})")
    elif rule.kind in ("spike", "loss_jump") and "median" in ev:
        what += f" vs a recent median of {_fmt(ev['median'])}"
        if ev.get("robust_z") is not None:
            what += f" (robust z {_fmt(ev['robust_z'])})"
    elif rule.kind == "level_rise" and (ev.get("above_lowest") is not None
                                        or ev.get("lowest_level")):
        # a margin rule (the loss's level in nats above its lowest) in its own unit
        rise = (f"{_fmt(ev['above_lowest'])} above" if ev.get("above_lowest") is not None
                else f"{_fmt(ev.get('level') / ev['lowest_level'])}x")
        what = (f"{rule.metric} level (median of {ev.get('window')} steps) = "
                f"{_fmt(ev.get('level'))}, {rise} the lowest it settled to "
                f"({_fmt(ev.get('lowest_level'))})")
        climb = ev.get("climb")
        if isinstance(climb, list) and climb:
            what += (f", still climbing: x{' then x'.join(_fmt(c) for c in reversed(climb))} "
                     f"over its last {len(climb)} spans of {rule.param('climb_span')} steps")
        if ev.get("noise") is not None and ev.get("margin") is not None:
            what += (f", past a margin of {_fmt(ev['margin'])} (at least "
                     f"{_fmt(ev.get('noise_margin'))}x its step-to-step noise of "
                     f"{_fmt(ev['noise'])})")
    elif rule.kind == "above_peak" and ev.get("settled_peak"):
        what += (f", {_fmt(ev.get('ratio'))}x the peak of {_fmt(ev['settled_peak'])} it had "
                 f"settled at (step {ev.get('settled_at_step')})")
    elif rule.kind == "lr_jump":
        what += f", was {_fmt(ev.get('previous'))} at step {ev.get('previous_step')}"
    causes = ev.get("causes")
    if causes:
        what += "; " + "; ".join(str(c) for c in causes)  # type: ignore[union-attr]
    meaning = rule.summary or rule.name
    return (f"{name}: {where}: {meaning}: {what}; left its range at step {t.started_step}, "
            f"fired at step {t.step}.")
