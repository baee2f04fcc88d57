"""The recorded alert scenarios: their labels, the split, the derived frames, and the
default rules' results on a small fixed subset.

The suite in ``bench/scenarios`` is the evidence for the default rules (docs/ALERTS.md,
*Evidence*). These tests keep the labels honest (they follow the stated rule on every step's
loss, and a wrong label fails), keep the split as it was fixed before tuning, check that the
frames derived for an interval ``k`` are what a job sampling one step in ``k`` sends, and
keep the default rules to what they score on a few held-out runs at intervals 1 and 40 (the
whole suite: ``python bench/bench_alerts.py``).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
FILES = sorted((BENCH / "scenarios").glob("*.jsonl.gz"))
NAN = math.nan


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the bench modules import each other
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rec() -> ModuleType:
    return _load("record_scenarios")


@pytest.fixture(scope="module")
def lab() -> ModuleType:
    return _load("scenario_labels")


def _header(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.loads(fh.readline())


# -- labels ----------------------------------------------------------------------------------


def _default(name: str) -> dict[str, Any]:
    """The default rule ``name`` as an entry of a rules YAML (a dict to edit)."""
    from logitwatch.server.alerts.defaults import DEFAULT_RULES

    return next(r for r in DEFAULT_RULES if r.name == name).to_dict()


def _over_defaults(tmp_path: Path, *rules: dict[str, Any]) -> list[Any]:
    """The default rules with ``rules`` replacing those of their names, written to a rules
    YAML and read back as ``bench_alerts.py --rules`` reads it: a change taken back."""
    import yaml

    path = tmp_path / f"rules{len(list(tmp_path.glob('rules*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"rules": list(rules)}))
    return _load("bench_alerts").rules_over_defaults(path)


def test_labels_on_constructed_losses(lab: ModuleType) -> None:
    flat = [3.0] * 300
    assert lab.excursions(flat) == (None, [])
    assert lab.label(flat) == "healthy"
    # a bump of 2 nats for 30 steps that comes all the way back: healthy, one bump listed
    bump = [2.0] * 200 + [4.0] * 30 + [2.0] * 170
    assert lab.excursions(bump) == (None, [[205, 237]])
    assert lab.label(bump) == "healthy"
    # the same bump, then a final excursion that never comes back: diverging at its start
    final = [2.0] * 200 + [4.0] * 30 + [2.0] * 100 + [3.6] * 150
    assert lab.excursions(final) == (336, [[205, 237]])
    assert lab.label(final) == "diverging"
    # back to 0.6 nat above the best, never within 0.5: not recovered, diverging
    partial = [2.0] * 200 + [3.5] * 40 + [2.6] * 160
    assert lab.divergence_step(partial) == 206 and lab.label(partial) == "diverging"
    # back within 0.5 (0.4 above): a recovered bump, but it ended 0.4 above its best
    within = [2.0] * 200 + [3.5] * 40 + [2.4] * 160
    assert lab.excursions(within) == (None, [[206, 249]])
    assert lab.regression(within) == pytest.approx(0.4)
    assert lab.label(within) == "degraded"

    # a non-finite loss that stays: diverging at the first NaN (not the first full window)
    assert lab.excursions([2.0] * 100 + [NAN] * 20) == (100, [])
    # a rise of just under 1 nat is no excursion; 0.2 above the best at the end is healthy
    assert lab.divergence_step([2.0] * 200 + [2.95] * 100) is None
    slight = [2.0] * 200 + [2.2] * 100
    assert lab.label(slight) == "healthy"  # 0.2 < 0.25
    assert lab.regression(flat[:50]) == 0.0  # shorter than the window
    assert lab.regression([*flat, NAN]) == 0.0


def test_losses_on_injected_bad_batches_never_set_the_best(lab: ModuleType) -> None:
    # 30 zero-byte batches are trivially predictable (loss near 0): taken as the best, the
    # clean data after them looked like a divergence (a recorded GPT-2 run was labelled so)
    zeros = [2.4] * 420 + [14.0] + [0.01] * 29 + [13.0] + [2.45] * 150
    bad = lab.injected_steps({"bad_data": [[420, 450, "zeros"]]})
    assert bad == set(range(420, 450))
    assert lab.divergence_step(zeros) == 450  # without knowing the injection
    assert lab.divergence_step(zeros, bad) is None
    assert lab.label(zeros, bad) == "healthy"
    assert lab.regression(zeros, ignore=bad) == pytest.approx(0.05, abs=1e-9)
    # a run that really breaks after bad data is still diverging, once the 10-step mean of
    # its own losses (the bad batches cut out) is more than 1 nat above the clean best: 7 of
    # its last 10 own losses at 4.0
    broken = [2.4] * 420 + [0.01] * 30 + [4.0] * 150
    assert lab.divergence_step(broken, bad) == 456
    assert lab.own_means(broken, bad)[419] == pytest.approx(2.4)
    assert math.isnan(lab.own_means(broken, bad)[430])  # a bad batch has no mean of its own
    # a garbage stretch inside the last 100 steps does not lift the run's final level
    late = [2.0] * 400 + [14.0] * 10 + [2.0] * 50
    assert lab.regression(late) > 1.0
    assert lab.regression(late, ignore=set(range(400, 410))) == 0.0


def test_a_garbage_batch_opens_no_excursion(lab: ModuleType) -> None:
    """Random tokens cost 10-14 nats on any model: that loss measures the garbage. Whether
    the run diverged is read on its own data around it."""
    one = lab.injected_steps({"bad_data": [[400, 401, "random"]]})
    # the run sits 0.7 nat up on its own data after one garbage batch: no excursion
    # (0.7 < 1 nat), so not diverging (it was, dated at the garbage batch, while that
    # batch's 14 nats counted), but it ended 0.7 above its best: degraded
    sits = [2.0] * 400 + [14.0] + [2.7] * 199
    assert lab.divergence_step(sits) == 400
    assert lab.divergence_step(sits, one) is None
    assert lab.label(sits, one) == "degraded"
    # the batch wrecked the model: dated where its own 10-step mean leaves the range
    # (4 of 10 own losses at 4.6: step 404), not at the garbage batch
    wrecked = [2.0] * 400 + [14.0] + [4.6] * 199
    assert lab.divergence_step(wrecked) == 400
    assert lab.divergence_step(wrecked, one) == 404
    # a bump that recovered: a garbage window below the limit never closes an excursion
    stretch = lab.injected_steps({"bad_data": [[420, 440, "zeros"]]})
    dips = [2.0] * 400 + [3.5] * 20 + [0.01] * 20 + [3.5] * 20 + [2.0] * 140
    assert lab.excursions(dips)[1][0][1] < 440  # the zeros' near-0 losses "recovered" it
    assert lab.excursions(dips, stretch) == (None, [[406, 466]])  # 7 of 10 own losses back
    # a non-finite loss opens an excursion even on a bad batch
    assert lab.divergence_step([2.0] * 400 + [NAN] * 20, one) == 400


def test_training_stops_when_the_run_is_gone(lab: ModuleType) -> None:
    assert lab.stop_reason([2.0] * 100 + [NAN] * 9) is None
    assert lab.stop_reason([2.0] * 100 + [NAN] * 10) == "nonfinite"
    # diverged at step 205: 100 steps later (checked every 10 steps) it stops
    up = [2.0] * 200 + [4.0] * 100
    assert lab.stop_reason(up) is None
    assert lab.stop_reason(up + [4.0] * 10) == "diverged"
    # a bump that recovered does not stop training
    assert lab.stop_reason([2.0] * 200 + [4.0] * 30 + [2.0] * 90) is None


def test_split_is_stratified_and_stable(rec: ModuleType) -> None:
    sets = {"fresh": rec.FRESH, "fresh2": rec.FRESH2, "fresh3": rec.FRESH3,
            "fresh4": rec.FRESH4, "fresh5": rec.FRESH5, "fresh6": rec.FRESH6,
            "fresh7": rec.FRESH7, "fresh8": rec.FRESH8, "fresh9": rec.FRESH9,
            "fresh10": rec.FRESH10, "fresh11": rec.FRESH11,
            "fresh12": rec.FRESH12, "fresh13": rec.FRESH13,
            "fresh14": rec.FRESH14, "fresh15": rec.FRESH15,
            "fresh16": rec.FRESH16, "fresh17": rec.FRESH17,
            "fresh18": rec.FRESH18, "fresh19": rec.FRESH19,
            "fresh20": rec.FRESH20, "fresh21": rec.FRESH21, "fresh22": rec.FRESH22,
            "fresh23": rec.FRESH23, "fresh24": rec.FRESH24, "fresh25": rec.FRESH25,
            "fresh26": rec.FRESH26, "fresh27": rec.FRESH27,
            "fresh28": rec.FRESH28, "fresh29": rec.FRESH29,
            "fresh30": rec.FRESH30, "fresh31": rec.FRESH31,
            "fresh32": rec.FRESH32, "fresh33": rec.FRESH33,
            "fresh34": rec.FRESH34, "fresh35": rec.FRESH35,
            "fresh36": rec.FRESH36}
    splits = {n: h for n, h in rec.SPLITS.items() if h not in sets}
    assert set(splits.values()) == {"tune", "holdout"}
    assert set(splits) == {s.name for s in rec.SCENARIOS}
    # each held-out set is its own split, every run of it, and nothing else
    for split, runs in sets.items():
        assert {n for n, h in rec.SPLITS.items() if h == split} == {s.name for s in runs}
    assert set(rec.SPLIT_NAMES) == {"tune", "holdout", *sets}
    # the bench replays exactly the recorded sets, in the order they were fixed, and each
    # read split reads through its own set
    bench = _load("bench_alerts")
    assert bench.SETS == rec.SPLIT_NAMES
    assert all(bench.READ_THROUGH[f"read{i}"] == f"fresh{i}" for i in range(6, bench.NEWEST))
    assert len(rec.BY_NAME) == len(rec.ALL)  # no name twice
    assert not {s.name for s in rec.FRESH} & set(splits)
    assert splits == rec.assign_splits(list(reversed(rec.SCENARIOS)))  # order-free
    halves = sorted(sum(v == h for v in splits.values()) for h in ("tune", "holdout"))
    assert halves[1] - halves[0] <= 1
    by_group: dict[str, list[str]] = {}
    for s in rec.SCENARIOS:
        by_group.setdefault(s.group, []).append(splits[s.name])
    for group, got in by_group.items():  # each half has about half of every group
        tune = got.count("tune")
        assert abs(2 * tune - len(got)) <= max(2, len(got) // 3), (group, got)


# -- derived frames ----------------------------------------------------------------------------


def _frame(step: int, clipped: float) -> dict[str, Any]:
    return {"run": "r", "project": "default", "rank": 0, "seq": step + 1, "step": step,
            "time": 1000.0 + step,
            "scalars": {"loss": 3.0 - step / 100, "grad.norm": 0.5 + step, "lr": 1e-3,
                        "grad.clipped": clipped, "grad.clip_rate": clipped,
                        "hooks.sample_every": 1.0, "hooks.overhead": 0.5},
            "heads": {"attn.logit_max": [[1.0, 2.0]]}}


def test_derive_is_what_a_job_sampling_every_k_sends() -> None:
    sf = _load("scenario_frames")
    frames = [_frame(s, 1.0 if s in (2, 4, 5) else 0.0) for s in range(8)]
    frames[5]["scalars"]["loss"] = "NaN"
    got = sf.derive(frames, 3)
    assert [f["step"] for f in got] == [0, 3, 6, 7]
    assert [f["seq"] for f in got] == [1, 2, 3, 4]
    assert "history" not in got[0]
    assert got[1]["history"] == {"steps": [1, 2], "scalars": {
        "loss": [2.99, 2.98], "grad.norm": [1.5, 2.5], "grad.clipped": [0.0, 1.0],
        "lr": [1e-3, 1e-3]}}
    assert got[2]["history"]["steps"] == [4, 5]
    assert got[2]["history"]["scalars"]["loss"] == [2.96, "NaN"]
    assert [f["scalars"]["grad.clip_rate"] for f in got[:3]] == [
        0.0, pytest.approx(1 / 3), pytest.approx(2 / 3)]
    assert all(f["scalars"]["hooks.sample_every"] == 3.0 for f in got[:3])
    assert all("hooks.overhead" not in f["scalars"] for f in got)
    assert got[1]["heads"] == frames[3]["heads"] and frames[3]["seq"] == 4  # input untouched
    no_history = sf.derive(frames, 3, history=False)
    assert [f["step"] for f in no_history] == [0, 3, 6]
    assert all("history" not in f for f in no_history)
    # the run ended at step 7, between two samples: the frame Monitor.close() sends
    tail = sf.derive(frames, 5, spike_watch=False)
    assert [f["step"] for f in tail] == [0, 5, 7]
    assert tail[2]["heads"] == {} and tail[2]["seq"] == 3
    assert tail[2]["scalars"] == {"loss": 2.93, "grad.norm": 7.5, "grad.clipped": 0.0,
                                  "lr": 1e-3, "hooks.closing": 1.0,
                                  "hooks.sample_every": 5.0}
    assert tail[2]["history"]["steps"] == [6]
    one = sf.derive(frames, 1)
    assert [f["step"] for f in one] == list(range(8)) and all("history" not in f for f in one)
    # the NaN loss of step 5 makes the hooks sample step 6 (logitwatch.hooks._stepwatch)
    assert [f["step"] for f in sf.derive(frames, 5)] == [0, 5, 6, 7]


def test_a_spike_is_sampled_at_once_and_a_steady_run_never() -> None:
    from logitwatch.hooks._stepwatch import BURST, REARM, StepWatch

    w = StepWatch()
    steady = [w.step(s, 3.0 - 0.001 * s + 0.01 * (s % 3), 0.5 + 0.05 * (s % 4))
              for s in range(300)]
    assert not any(steady)
    assert w.step(300, 3.0, 8.0)  # the gradient norm 16x its median
    # the steps after it are sampled too while they stay anomalous (the collector decides
    # a jump on it and the two steps after), then no more than BURST within REARM steps
    assert BURST == 3
    assert w.step(301, 3.0, 8.0) and w.step(302, 3.0, 8.0)
    assert not w.step(303, 3.0, 8.0) and not w.step(300 + REARM - 1, 3.0, 8.0)
    assert w.step(300 + REARM, 9.0, 0.5)  # a loss 6 nats above its median
    assert w.step(320, float("nan"), 0.5)  # the first non-finite step
    assert not w.step(340, float("nan"), 0.5)  # the run of NaN goes on: once is enough


def test_derived_frames_pass_the_collectors_schema() -> None:
    sf = _load("scenario_frames")
    if not sf.history_supported():
        pytest.skip("this collector's FrameIn has no history")
    from logitwatch.server.schemas import IngestIn

    frames = [_frame(s, 0.0) for s in range(100)]
    body = IngestIn.model_validate({"frames": sf.derive(frames, 40, flush_every=None)})
    assert [f.step for f in body.frames] == [0, 40, 80, 99]  # 99: the closing frame
    assert body.frames[1].history is not None and body.frames[1].history.steps[0] == 1
    # the hooks' history flush: the kept steps every 10 unsampled steps, ahead of the frame
    body = IngestIn.model_validate({"frames": sf.derive(frames, 40)})
    assert [f.step for f in body.frames] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99]
    flush = body.frames[1]
    assert flush.heads == {} and flush.scalars["hooks.history_flush"] == 1.0
    assert flush.history is not None and flush.history.steps == list(range(1, 10))
    assert body.frames[4].history is not None and body.frames[4].history.steps == list(
        range(31, 40))  # the sampled frame carries only the steps since the flush


def test_derived_flushes_keep_every_step_and_do_not_move_the_samples() -> None:
    sf = _load("scenario_frames")
    frames = [_frame(s, 0.0) for s in range(137)]
    for k in (1, 7, 25, 50):
        plain = sf.derive(frames, k, flush_every=None)
        flushed = sf.derive(frames, k)
        heads = [f["step"] for f in flushed if f["heads"]]
        assert heads == [f["step"] for f in plain if f["heads"]], k
        told = sorted(s for f in flushed for s in [*f.get("history", {}).get("steps", []),
                                                   f["step"]])
        assert told == list(range(137)), k  # each step exactly once
        # a frame at least every 10 steps, whatever the interval
        assert max(f["step"] - e["step"] for e, f in zip(flushed, flushed[1:],
                                                         strict=False)) <= min(k, 10), k


# -- the recorded suite ---------------------------------------------------------------------


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_recorded_labels_follow_the_rule(rec: ModuleType, lab: ModuleType) -> None:
    from logitwatch.wire import decode_float

    headers = []
    for path in FILES:
        h = _header(path)
        losses = [decode_float(x) for x in h["losses"]]
        bad = lab.injected_steps(h["spec"])  # the injected bad batches set no best
        div, bumps = lab.excursions(losses, bad)
        assert h["divergence_step"] == div, path.name
        assert h["bumps"] == bumps, path.name
        assert h["label"] == lab.label(losses, bad), path.name
        assert h["regression"] == round(lab.regression(losses, ignore=bad), 4), path.name
        assert h["split"] == rec.SPLITS[h["scenario"]], path.name  # fixed before tuning
        assert len(h["grad_norms"]) == len(h["clipped"]) == len(h["lrs"]) == len(losses)
        headers.append(h)
    labels = [h["label"] for h in headers]
    assert len(headers) >= 120
    assert labels.count("diverging") >= 45 and labels.count("healthy") >= 55
    assert len({h["family"] for h in headers}) >= 4
    assert {h["spec"]["optimizer"] for h in headers} >= {"adamw", "sgd", "adam", "rmsprop"}
    assert {h["spec"]["autocast"] for h in headers} >= {None, "bfloat16"}
    assert any(h["spec"]["attn_dtype"] == "float16" for h in headers)
    assert any(h.get("expect_alert") == "qk_bias_refuge" for h in headers)


#: A few held-out runs of each label (fixed: changing them changes what the test asserts).
SUBSET = ("attn_growth_s1", "gpt2_lr_jump_s1", "llama_sgd_blowup_s1", "postln_rewarm_rms",
          "gpt2_bad_data_random", "postln_outlier_zeros", "gemma2_softcap_s1",
          "gpt2_qk_clip_s1", "bf16_growth")
INTERVALS = (1, 40)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_default_rules_on_a_heldout_subset() -> None:
    ba = _load("bench_alerts")
    paths = {p.name.split(".")[0]: p for p in FILES}
    missing = [n for n in SUBSET if n not in paths]
    assert not missing, missing
    for name in SUBSET:
        assert _header(paths[name])["split"] == "holdout", name
    for k in INTERVALS:
        rows = [ba.bench_one(str(paths[n]), k) for n in SUBSET]
        s = ba.summarize("logitwatch", rows, any_alert=lambda r: r["any_alert"])
        got = {key: s[key] for key in ("recall", "healthy_paged", "degraded_warned",
                                       "lead>=50", "expect_alert")}
        assert got == TARGETS[k], (k, got, s["missed"], s["false_alarms"], s["late"])


#: What the current default rules score on SUBSET (a regression guard, not a goal: raise
#: these when the rules get better).
TARGETS: dict[int, dict[str, str]] = {
    1: {"recall": "4/4",
         "healthy_paged": "1/4",
         "degraded_warned": "1/1",
         "lead>=50": "2/2",  # 1/2 before round twenty-four (llama_sgd_blowup_s1)
         "expect_alert": "1/1 (1 paged)"},
    40: {"recall": "4/4",
         "healthy_paged": "1/4",
         "degraded_warned": "1/1",
         "lead>=50": "1/1",
         "expect_alert": "1/1 (1 paged)"},
}


#: The first held-out half's misses and false alarms, read once and fixed after (docs/ALERTS.md,
#: *Evidence*): a warm-up ramping the LR too far; biased q/k without QK-clip (weights shrunk by
#: L2 decay; an early transient), and the QK-clip runs whose refuge warning is meant.
FIXED = {"lr_ramp": "paged", "gpt2_plain_adam": "quiet", "postln_early_transient": "quiet",
         "gpt2_qk_clip_s0": "refuge"}


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
@pytest.mark.parametrize("k", INTERVALS)
def test_what_the_first_heldout_reading_fixed(k: int) -> None:
    ba = _load("bench_alerts")
    paths = {p.name.split(".")[0]: p for p in FILES}
    for name, want in FIXED.items():
        row = ba.bench_one(str(paths[name]), k)
        page = row["logitwatch"]["from50"]
        if want == "paged":
            assert page is not None and page <= row["divergence_step"], (name, k, row)
        elif want == "quiet":
            assert row["logitwatch"]["first"] is None, (name, k, row["rules_paged"])
        else:
            assert row["rules_paged"] and set(row["rules_paged"]) <= {
                "q_bias_refuge", "k_bias_refuge"}, (name, k, row["rules_paged"])


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_the_bench_replays_a_rules_file_over_the_defaults(tmp_path: Path) -> None:
    """``--rules``: a change measured, or taken back, as ``serve`` would apply it. Round
    twenty taken back (``at_once_adaptive_above: null``) pages the held-out run it was read
    on (one garbage batch under unclipped Adam) at once again; the defaults do not."""
    ba = _load("bench_alerts")
    path = str(BENCH / "scenarios" / "f22_gpt2_adam_outlier_random.jsonl.gz")
    jump = _default("loss_jump")
    jump["page"]["at_once_adaptive_above"] = None
    assert ba.bench_one(path, 1)["logitwatch"]["from50"] is None
    assert ba.bench_one(path, 1, rules=_over_defaults(tmp_path, jump))["logitwatch"][
        "from50"] == 420
    with pytest.raises(SystemExit):
        ba.main(["--split", "fresh22", "--rules", str(tmp_path / "missing.yaml")])


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_healed_sgd_garbage_batch_pages_only_under_the_damage_test(tmp_path: Path) -> None:
    """Round twenty-one on recorded runs. ``f23_llama_sgd_bad_data_8`` (eight garbage
    batches under unclipped momentum SGD, healed) paged at 431 on its aftershock under round
    ten's damage test; the defaults leave it shown. ``f18_postln_sgd_outlier_zeros`` (one
    zero-byte batch at 380, then a blow-up from 384) still pages, once it blows up."""
    ba = _load("bench_alerts")
    damage = [dict(r, page={**r["page"], "aftershock_above": 12.0})
              for r in (_default("loss_jump"), _default("grad_blowup"))]
    round20 = _over_defaults(tmp_path, *damage)
    healed = str(BENCH / "scenarios" / "f23_llama_sgd_bad_data_8.jsonl.gz")
    assert ba.bench_one(healed, 1)["logitwatch"]["from50"] is None
    assert ba.bench_one(healed, 1, rules=round20)["logitwatch"]["from50"] == 431
    wrecked = str(BENCH / "scenarios" / "f18_postln_sgd_outlier_zeros.jsonl.gz")
    assert ba.bench_one(wrecked, 1, rules=round20)["logitwatch"]["from50"] == 381
    assert ba.bench_one(wrecked, 1)["logitwatch"]["from50"] == 385


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_an_sgd_blow_up_that_climbs_in_its_first_steps_pages_by_its_divergence(
        tmp_path: Path) -> None:
    """Round twenty-two on recorded runs: two unclipped momentum-SGD blow-ups of the
    twenty-seventh set, the loss a nat up on the first step, up on the second, 11-13 nats up
    on the third (the divergence), paged there by the climb; with ``climb_above`` taken back
    they paged one and two steps late (the precursor leaves a run's first three steps out)."""
    ba = _load("bench_alerts")
    back = [dict(r, page={**r["page"], "climb_above": None})
            for r in (_default("loss_jump"), _default("grad_blowup"))]
    round21 = _over_defaults(tmp_path, *back)
    for name, now, before in (("f26_gpt2_sgd_blowup", 261, 263),
                              ("f26_postln_sgd_blowup", 236, 238)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        row = ba.bench_one(path, 1)
        assert row["logitwatch"]["from50"] == now <= row["divergence_step"], (name, row)
        assert ba.bench_one(path, 1, rules=round21)["logitwatch"]["from50"] == before, name


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_warm_up_ramped_too_far_pages_its_first_big_jump(tmp_path: Path) -> None:
    """Round twenty-three on recorded runs: QK-norm warm-ups ramped too far whose first big
    loss jump, clipped, is their divergence page there, the jump corroborated by
    ``loss_clip_ramp``'s breach; without it (round twenty-two) they paged 2-6 steps late,
    when ``loss_clip_ramp`` had held 10 steps."""
    ba = _load("bench_alerts")
    # loss_clip_ramp with its 10-step hold (through round twenty-five), in both rule sets:
    # without the hold (the defaults since round twenty-six) it pages these runs itself, as
    # early or earlier (asserted last)
    held = dict(_default("loss_clip_ramp"), for_steps=10)
    jump = _default("loss_jump")
    jump["page"]["with_rules"] = ["grad_blowup", "grad_nonfinite"]
    round25 = _over_defaults(tmp_path, held)
    round22 = _over_defaults(tmp_path, held, jump)
    for name, now, before, today in (("f22_lr_ramp_s223", 101, 111, 101),
                                     ("f17_lr_ramp_s171", 134, 137, 125)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        row = ba.bench_one(path, 1, rules=round25)
        assert row["logitwatch"]["from50"] == now <= row["divergence_step"], (name, row)
        assert row["logitwatch_rules"] == ["loss_jump"], (name, row)
        assert ba.bench_one(path, 1, rules=round22)["logitwatch"]["from50"] == before, name
        assert ba.bench_one(path, 1)["logitwatch"]["from50"] == today <= now, name


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_warm_up_ramped_too_far_pages_when_its_loss_climbs_at_the_clip(
        tmp_path: Path) -> None:
    """Round twenty-six on recorded runs: ``loss_clip_ramp`` pages on the first step its
    condition holds (the loss's 20-step level 0.3 nat up, the gradient clipped on 75 % of
    the last 20 steps, the LR still climbing), at intervals 1, 10 and 50. Two QK-norm
    warm-ups ramped too far are caught before their divergence; with the 10-step hold the
    rule had through round twenty-five, both paged 4 steps after it."""
    ba = _load("bench_alerts")
    round25 = _over_defaults(tmp_path, dict(_default("loss_clip_ramp"), for_steps=10))
    for name, now, before in (("f20_lr_ramp_s201", 101, 109), ("f31_lr_ramp_s310", 133, 141)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        for k in (1, 10, 50):
            row = ba.bench_one(path, k)
            assert row["logitwatch"]["from50"] == now <= row["divergence_step"], (name, k, row)
            assert row["logitwatch_rules"] == ["loss_clip_ramp"], (name, k, row)
        old = ba.bench_one(path, 1, rules=round25)["logitwatch"]["from50"]
        assert old == before > row["divergence_step"], name


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_warm_up_whose_loss_and_gradient_climb_pages_when_both_have(tmp_path: Path) -> None:
    """Round twenty-seven on a recorded run: ``loss_grad_ramp`` pages on the first step its
    condition holds (the loss's 20-step level 0.3 nat up and the gradient norm's 50-step
    level 2.5x its lowest, the LR still climbing). A Llama momentum-SGD warm-up dated 157 is
    caught at 155, at intervals 1 and 50; with the 10-step hold the rule had through round
    twenty-six it paged at 162."""
    ba = _load("bench_alerts")
    round26 = _over_defaults(tmp_path, dict(_default("loss_grad_ramp"), for_steps=10))
    path = str(BENCH / "scenarios" / "f11_llama_sgd_blowup.jsonl.gz")
    for k in (1, 50):
        row = ba.bench_one(path, k)
        assert row["logitwatch"]["from50"] == 155 <= row["divergence_step"], (k, row)
        assert row["logitwatch_rules"] == ["loss_grad_ramp"], (k, row)
    old = ba.bench_one(path, 1, rules=round26)["logitwatch"]["from50"]
    assert old == 162 > row["divergence_step"]


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_warm_up_whose_gradient_level_climbs_sixfold_pages_when_it_has(
        tmp_path: Path) -> None:
    """Round twenty-eight on recorded runs: ``grad_norm_ramp`` pages on the first step its
    condition holds (the gradient norm's 50-step level 6x its lowest while the LR climbs).
    Two QK-norm warm-ups ramped too far are paged 10 and 14 steps earlier than with the
    10-step hold the rule had through round twenty-seven, at intervals 1 and 50, ninety
    steps or more before their divergence."""
    ba = _load("bench_alerts")
    round27 = _over_defaults(tmp_path, dict(_default("grad_norm_ramp"), for_steps=10))
    for name, now, before in (("f21_qknorm_high_lr", 405, 415),
                              ("f16_qknorm_high_lr", 542, 556)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        for k in (1, 50):
            row = ba.bench_one(path, k)
            assert row["logitwatch"]["from50"] == now, (name, k, row)
            assert row["logitwatch_rules"] == ["grad_norm_ramp"], (name, k, row)
            assert row["divergence_step"] - now >= 90, (name, row)
        assert ba.bench_one(path, 1, rules=round27)["logitwatch"]["from50"] == before, name


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_an_sgd_warm_up_pages_on_its_logits_not_its_blow_up(tmp_path: Path) -> None:
    """Round twenty-four on recorded runs: momentum-SGD Llama runs warming up grow a head's
    float32 logits past 4x their range well before they blow up; with the LR still climbing
    20 % a hundred steps the departure pages when it fires, at interval 1 and 10 (at 40 the
    departure itself fires later on these runs); without ``lr_climb`` (round twenty-three)
    it stayed info and the gradient and loss paged 2-4 steps before the divergence."""
    ba = _load("bench_alerts")
    dep = _default("attn_logit_departure")
    dep["downgrade"]["lr_climb"] = None
    round23 = _over_defaults(tmp_path, dep)
    for name, before in (("llama_sgd_blowup_s1", 373), ("f24_llama_sgd_blowup", 339)):
        path = str(BENCH / "scenarios" / f"{name}.jsonl.gz")
        for k in (1, 10):
            row = ba.bench_one(path, k)
            assert row["divergence_step"] - row["logitwatch"]["from50"] >= 50, (name, k, row)
            assert row["logitwatch_rules"] == ["attn_logit_departure"], (name, k, row)
        old = ba.bench_one(path, 1, rules=round23)
        assert old["logitwatch"]["from50"] == before, (name, old)


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_a_garbage_stretch_that_left_the_run_worse_is_not_reported_recovered() -> None:
    """Round twenty-five on recorded runs: twenty garbage batches left an unclipped post-LN
    SGD run 0.6 nat worse for good, just under the jump detector's limit; the jump alert
    used to resolve at step 431 as "Recovered" and never page. Now it pages 100 steps after
    the jump, saying the loss did not recover. A garbage batch a Llama run shrugs off still
    resolves as recovered, once the loss's level is back."""
    from logitwatch.server.alerts.replay import replay

    frames_mod = _load("scenario_frames")
    for name, pages in (("f13_postln_sgd_bad_data", True), ("f30_llama_outlier_random", False)):
        _, frames = frames_mod.read_run(BENCH / "scenarios" / f"{name}.jsonl.gz")
        jumps = [a for a in replay(frames_mod.derive(frames, 1), batch=64).alerts
                 if a.rule == "loss_jump"]
        assert jumps, name
        a = jumps[0]
        if pages:
            assert a.paged_step == a.started_step + 100 == 480, (name, a.evidence)
            assert a.evidence["escalated_because"].startswith("it did not recover"), name
            assert not a.evidence.get("recovered")
        else:
            assert a.paged_step is None and a.evidence.get("recovered") is True, name
            assert "back within" in a.message
