"""The recorded alert scenarios: their labels, the split, and the default rules' results on
a small fixed subset.

The suite in ``bench/scenarios`` is the evidence for the default rules (docs/ALERTS.md,
*Evidence*). These tests keep the labels honest (they follow the stated rule on every step's
loss, and a wrong label fails), keep the split as it was fixed before tuning, and keep the
default rules to what they score on a few held-out runs at intervals 1 and 40 (the whole
suite: ``python bench/bench_alerts.py``). The frames derived for an interval ``k``:
``tests/test_scenario_frames.py``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.scenario_tools import BENCH, FILES, load

NAN = math.nan


@pytest.fixture(scope="module")
def rec() -> ModuleType:
    return load("record_scenarios")


@pytest.fixture(scope="module")
def reg() -> ModuleType:
    return load("scenario_sets")


@pytest.fixture(scope="module")
def lab() -> ModuleType:
    return load("scenario_labels")


def _header(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        return json.loads(fh.readline())


# -- labels ----------------------------------------------------------------------------------


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


def test_the_suites_qk_clip_scales_the_biases_only_when_asked() -> None:
    """``RunSpec.qk_clip_biases``: a clipped head's q and k biases scale with its weights
    (the remedy, as the project's fuse does); without it they stay (the bias refuge). The v
    columns and bias never move."""
    models = load("scenario_models")
    moved = {}
    for biases in (False, True):
        spec = models.RunSpec(family="gpt2", init_std=0.05, qk_clip=1e-3,
                              qk_clip_biases=biases, seq_len=16, batch_size=2, seed=3)
        torch.manual_seed(spec.seed)
        model = models.build_model(spec)
        c_attn = model.transformer.h[0].attn.c_attn
        with torch.no_grad():
            c_attn.bias.normal_(0, 0.3)
        w0, b0 = c_attn.weight.detach().clone(), c_attn.bias.detach().clone()
        clip = models.QKClip(model, spec, spec.qk_clip)
        x, _ = models.make_data(spec).batch()
        model(input_ids=x)
        clip.apply()
        e = c_attn.weight.shape[1] // 3
        w, b = c_attn.weight.detach(), c_attn.bias.detach()
        assert clip.clipped == spec.n_layer * spec.n_head  # every head passed tau 1e-3
        assert (w[:, :2 * e].norm() < 0.5 * w0[:, :2 * e].norm())
        assert torch.equal(w[:, 2 * e:], w0[:, 2 * e:]) and torch.equal(b[2 * e:], b0[2 * e:])
        moved[biases] = float(b[:2 * e].norm() / b0[:2 * e].norm())
    assert moved[False] == 1.0 and moved[True] < 0.5, moved


def test_a_bpe_vocabulary_is_fixed_and_its_bad_batches_are_its_tokens() -> None:
    pytest.importorskip("tokenizers")
    models = load("scenario_models")
    spec = models.RunSpec(vocab=2048, seq_len=32, batch_size=4, seed=7)
    a = models.make_data(spec)
    models.bpe_tokenizer.cache_clear()  # a tokenizer trained again: the same ids
    b = models.make_data(spec)
    assert a.tokenizer is not b.tokenizer
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    xa, ya = a.batch()
    xb, yb = b.batch()
    assert torch.equal(xa, xb) and torch.equal(ya, yb)  # same seed, same tokens
    assert torch.equal(xa[:, 1:], ya[:, :-1]) and int(xa.max()) < 2048
    assert int(xa.max()) >= 256  # merged tokens, not bytes
    text = a.tokenizer.decode(xa[0].tolist())
    assert text.isascii() and len(text) > 32  # about 3 bytes a token
    gen = torch.Generator().manual_seed(0)
    for kind in ("random", "shuffle", "zeros", "upper"):
        x, y = models.bad_batch(kind, xa, ya, gen, a)
        assert x.shape == xa.shape and torch.equal(x[:, 1:], y[:, :-1]), kind
        assert int(x.min()) >= 0 and int(x.max()) < 2048, kind
    up, _ = models.bad_batch("upper", xa, ya, gen, a)
    assert a.tokenizer.decode(up[0].tolist()) == a.tokenizer.decode(up[0].tolist()).upper()
    assert not torch.equal(up, xa)
    # bytes are untouched by the option: the default sampler is the demo's, and a bad batch
    # of bytes is the same with or without the data handed in
    from logitwatch.demo.data import ByteData

    byte = models.make_data(models.RunSpec(seq_len=32, batch_size=4, seed=7))
    assert type(byte) is ByteData
    x, y = byte.batch()
    assert torch.equal(x, ByteData(32, 4, seed=7).batch()[0])
    for kind in ("random", "shuffle", "zeros", "upper"):
        one = models.bad_batch(kind, x, y, torch.Generator().manual_seed(3), byte)
        two = models.bad_batch(kind, x, y, torch.Generator().manual_seed(3))
        assert all(torch.equal(p, q) for p, q in zip(one, two, strict=True)), kind
        assert int(one[0].max()) < 256, kind


def test_split_is_stratified_and_stable(reg: ModuleType) -> None:
    sets = {"fresh": reg.FRESH, "fresh2": reg.FRESH2, "fresh3": reg.FRESH3,
            "fresh4": reg.FRESH4, "fresh5": reg.FRESH5, "fresh6": reg.FRESH6,
            "fresh7": reg.FRESH7, "fresh8": reg.FRESH8, "fresh9": reg.FRESH9,
            "fresh10": reg.FRESH10, "fresh11": reg.FRESH11,
            "fresh12": reg.FRESH12, "fresh13": reg.FRESH13,
            "fresh14": reg.FRESH14, "fresh15": reg.FRESH15,
            "fresh16": reg.FRESH16, "fresh17": reg.FRESH17,
            "fresh18": reg.FRESH18, "fresh19": reg.FRESH19,
            "fresh20": reg.FRESH20, "fresh21": reg.FRESH21, "fresh22": reg.FRESH22,
            "fresh23": reg.FRESH23, "fresh24": reg.FRESH24, "fresh25": reg.FRESH25,
            "fresh26": reg.FRESH26, "fresh27": reg.FRESH27,
            "fresh28": reg.FRESH28, "fresh29": reg.FRESH29,
            "fresh30": reg.FRESH30, "fresh31": reg.FRESH31,
            "fresh32": reg.FRESH32, "fresh33": reg.FRESH33,
            "fresh34": reg.FRESH34, "fresh35": reg.FRESH35,
            "fresh36": reg.FRESH36, "fresh37": reg.FRESH37,
            "fresh38": reg.FRESH38, "fresh39": reg.FRESH39,
            "fresh40": reg.FRESH40, "fresh41": reg.FRESH41,
            "fresh42": reg.FRESH42, "fresh43": reg.FRESH43,
            "fresh44": reg.FRESH44, "fresh45": reg.FRESH45,
            "fresh46": reg.FRESH46, "fresh47": reg.FRESH47,
            "fresh48": reg.FRESH48, "fresh49": reg.FRESH49,
            "fresh50": reg.FRESH50, "fresh51": reg.FRESH51,
            "fresh52": reg.FRESH52, "long1": reg.LONG1,
            "long2": reg.LONG2, "fresh53": reg.FRESH53,
            "fresh54": reg.FRESH54, "fresh55": reg.FRESH55,
            "fresh56": reg.FRESH56, "fresh57": reg.FRESH57,
            "fresh58": reg.FRESH58, "fresh59": reg.FRESH59,
            "fresh60": reg.FRESH60, "fresh61": reg.FRESH61,
            "fresh62": reg.FRESH62, "fresh63": reg.FRESH63,
            "fresh64": reg.FRESH64, "fresh65": reg.FRESH65,
            "fresh66": reg.FRESH66, "fresh67": reg.FRESH67,
            "fresh68": reg.FRESH68, "fresh69": reg.FRESH69,
            "fresh70": reg.FRESH70, "fresh71": reg.FRESH71,
            "fresh72": reg.FRESH72, "fresh73": reg.FRESH73,
            "fresh74": reg.FRESH74, "fresh75": reg.FRESH75,
            "fresh76": reg.FRESH76, "fresh77": reg.FRESH77,
            "fresh78": reg.FRESH78, "fresh79": reg.FRESH79,
            "qkclip1": reg.QKCLIP1, "qkclip2": reg.QKCLIP2,
            "fresh80": reg.FRESH80, "fresh81": reg.FRESH81,
            "qkclip3": reg.QKCLIP3, "fresh82": reg.FRESH82, "fresh83": reg.FRESH83,
            "fresh84": reg.FRESH84, "fresh85": reg.FRESH85,
            "fresh86": reg.FRESH86, "fresh87": reg.FRESH87,
            "fresh88": reg.FRESH88}
    splits = {n: h for n, h in reg.SPLITS.items() if h not in sets}
    assert set(splits.values()) == {"tune", "holdout"}
    assert set(splits) == {s.name for s in reg.SCENARIOS}
    # each held-out set is its own split, every run of it, and nothing else
    for split, runs in sets.items():
        assert {n for n, h in reg.SPLITS.items() if h == split} == {s.name for s in runs}
    assert set(reg.SPLIT_NAMES) == {"tune", "holdout", *sets}
    # the bench replays exactly the recorded sets, in the order they were fixed, and each
    # read split reads through its own set
    bench = load("bench_alerts")
    assert bench.SETS == reg.SPLIT_NAMES
    # readN: every set fixed before fresh{N+1}, the set that holds its round out (the long
    # runs with read52, the first two QK-clip probes with read79, the third with read81)
    for i in range(6, bench.NEWEST):
        assert bench.sets_of(f"read{i}") == bench.SETS[:bench.SETS.index(f"fresh{i + 1}")], i
    assert bench.sets_of("read79")[-3:] == ("fresh79", "qkclip1", "qkclip2")
    assert bench.sets_of("read80")[-2:] == ("qkclip2", "fresh80")
    assert bench.sets_of("read81")[-2:] == ("fresh81", "qkclip3")
    assert bench.sets_of("read52")[-3:] == ("fresh52", "long1", "long2")
    assert len(reg.BY_NAME) == len(reg.ALL)  # no name twice
    assert not {s.name for s in reg.FRESH} & set(splits)
    assert splits == reg.assign_splits(list(reversed(reg.SCENARIOS)))  # order-free
    halves = sorted(sum(v == h for v in splits.values()) for h in ("tune", "holdout"))
    assert halves[1] - halves[0] <= 1
    by_group: dict[str, list[str]] = {}
    for s in reg.SCENARIOS:
        by_group.setdefault(s.group, []).append(splits[s.name])
    for group, got in by_group.items():  # each half has about half of every group
        tune = got.count("tune")
        assert abs(2 * tune - len(got)) <= max(2, len(got) // 3), (group, got)


# -- the recorded suite ---------------------------------------------------------------------


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_recorded_labels_follow_the_rule(reg: ModuleType, lab: ModuleType) -> None:
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
        assert h["split"] == reg.SPLITS[h["scenario"]], path.name  # fixed before tuning
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
    ba = load("bench_alerts")
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
    ba = load("bench_alerts")
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
@pytest.mark.parametrize("split", ["fresh56", "fresh57", "fresh60", "fresh71", "fresh72",
                                   "fresh74", "fresh78", "fresh62", "fresh67", "fresh79",
                                   "qkclip1", "fresh80", "fresh81", "qkclip3",
                                   "fresh82", "fresh83", "fresh84", "fresh85", "fresh86",
                                   "fresh87", "fresh88"])
def test_a_one_field_sets_recorded_runs_are_what_its_spec_builds(split: str) -> None:
    """The sets made by changing one field of a set's runs (the shapes: ``on_depth``,
    ``on_heads``, ``on_width``, ``on_field``, ``only=`` the usual value or every run; the
    clip threshold: ``on_clip``; the initial scale: ``on_init``; the batch: ``on_batch``;
    the context: ``on_context``; Adam's betas: ``on_betas``)
    and the ``qkclip1`` and ``qkclip3`` probes: each recorded run's header holds
    the spec that ``record_scenarios`` builds for its name today, so a spec edited after
    recording shows."""
    runs = load("scenario_sets").HELD_OUT[split]
    for s in runs:
        with gzip.open(BENCH / "scenarios" / f"{s.name}.jsonl.gz", "rt") as f:
            header = json.loads(f.readline())
        built = json.loads(json.dumps(dataclasses.asdict(s.spec)))
        # a RunSpec field added after the recording is absent from its header: at its
        # default, which is what the run trained with
        defaults = json.loads(json.dumps({f.name: f.default
                                          for f in dataclasses.fields(s.spec)}, default=str))
        added = {k: v for k, v in built.items() if k not in header["spec"]}
        assert all(v == defaults[k] for k, v in added.items()), (s.name, added)
        assert header["spec"] == {k: v for k, v in built.items() if k not in added}, s.name
        assert header["mechanism"] == s.mechanism, s.name
