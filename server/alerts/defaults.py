"""The zero-configuration rule set, and loading rules from YAML.

The defaults were chosen on the recorded scenario suite (``bench/scenarios``, replayed by
``bench/bench_alerts.py``; figures in ``bench/README.md``): every parameter below is the
one that caught every diverging scenario with the longest lead while staying quiet on the
healthy ones. Rules over series a job does not send simply never evaluate.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from logitwatch.server.alerts.default_scalar_rules import SCALAR_RULES
from logitwatch.server.alerts.rules import Downgrade, Page, RuleError, RuleSpec

__all__ = ["DEFAULT_RULES", "RULES_ENV", "load_rules_file", "merge_rules"]

RULES_ENV = "LOGITWATCH_ALERT_RULES"

DEFAULT_RULES: tuple[RuleSpec, ...] = (
    *SCALAR_RULES,
    # -- the leading signals: attention logits leaving their range -------------------------
    # off by default (enable in YAML): early in training every head's logits leave their
    # initial range, and on the suite's tuning half this fired on healthy runs of every
    # family; the settled departure below says it when it matters
    RuleSpec("attn_logit_rising", "departure", "attn.logit_max", for_steps=20,
             severity="info", enabled=False,
             params={"factor": 4.0, "floor": 30.0, "window": 200, "lag": 50},
             summary="a head's max attention logit left its own recent range"),
    # warning: the same, once the head has a settled baseline of 20 samples, above 50,
    # where the attention's dtype can overflow (float16, or a job that does not say);
    # info in a wide dtype (bf16/float32) until the loss has given back a quarter nat (its
    # 10-sample median 0.25 nat above its best; the scenarios' "degraded" margin): there
    # runaway logits saturate softmax and the run loses ground slowly (of the recorded
    # wide-dtype runs with a departure, 8 diverged, 7 ended 0.39-0.76 nat above their best,
    # 2 healthy ones rose at most 0.19: docs/ALERTS.md, Evidence). Round nineteen (--split
    # read21, 1,210 runs): a rise the loss is winning back does not count (recover_span: its
    # 20-step level down by half or more of the height its highest level within the 100
    # steps reached over its best): two healthy Llama runs under momentum SGD grew a head's
    # float32 logits past 50 after 10-18 garbage batches and paged 40-60 steps later, the
    # loss 0.5 nat up on its way back; a bump is the loss rules' to judge. No diverging run
    # read changes (the wide-dtype ones page on a loss still climbing). read21 @1: caught
    # 450/469 unchanged, healthy paged 36/718 -> 34/718. Round twenty-four (--split read29,
    # 1,720 runs): not lowered under a plain optimizer (the job's optim.adaptive = 0, SGD)
    # whose LR climbed 20 % or more over the last 100 steps (lr_climb): its step grows with
    # the LR, and momentum-SGD Llama runs warming up grew float32 logits 4x+ 30-180 steps
    # before they blew up, paged only 0-5 steps ahead by the gradient and the loss. Under
    # Adam the same climb is ordinary (18 healthy wide-dtype warm-ups would page); at 0.1 a
    # healthy SGD run 70 steps after its warm-up would. 23 runs it can act on @1: 19
    # diverging paged 5-173 steps earlier, no healthy run paged. Round twenty-nine (--split
    # read35, 2,104 runs): under a soft-cap it reads the capped scores (capped_metric), what
    # the softmax receives, as the forecast does; the raw logits of most soft-capped Gemma-2
    # runs ran 4x past their range behind the cap. The 376 soft-capped runs at intervals 1,
    # 10 and 50: healthy runs with any alert 204 -> 153 of 307 (-51, each an info departure),
    # the 67 diverging ones caught and first paged at the same step, one of two degraded runs
    # no longer warned (its loss 0.25 nat up at step 748 of 800). Round forty (--split read60,
    # 3,714 runs): a rise counts only once the loss's 20-step level is no lower than it was
    # when the logits left their range (start_rise 0): a loss already up from another cause
    # (an LR bump, garbage batches) that moved the logits, and no higher since, is that
    # cause's, which the loss rules judge. Five healthy fp32 runs (two AdamW LR bumps, a
    # batch of zeros and two garbage stretches under SGD) paged 50-145 steps after their
    # perturbation with the loss healing. Of the 599 wide-dtype runs whose logits passed 50
    # before any divergence, healthy paged at 1/10/50: 21/12/10 -> 16/8/8; diverging caught
    # unchanged (296/297 at 1); no first page moved at 1 or 10, and at 50 two diverging runs
    # and a degraded one paged one sample later (28-50 steps, 330+ ahead). At 0.1 nat 4, 4
    # and 9 diverging runs paged later at 1, 10 and 50 for no fewer healthy pages. Round
    # forty-one (--split read61): start_rise -0.05, a tolerance for the 20-step level's batch
    # noise; of the 8 runs whose first page differs between no start_rise and 0 (the only
    # ones a value between can change), the 5 healthy stay unpaged at 1, 10 and 50 and the
    # 3 that 0 delayed at 50 are paged a sample earlier again; at -0.1 a healthy LR bump
    # pages at 1
    RuleSpec("attn_logit_departure", "departure", "attn.logit_max", for_steps=20,
             params={"factor": 4.0, "floor": 50.0, "window": 200, "lag": 50,
                     "min_history": 200, "capped_metric": "attn.capped_logit_max"},
             downgrade=Downgrade(
                 to="info", metric="attn.dtype_max", above=65504.0, loss_rise=0.25,
                 loss_window=100, recover_span=20, lr_climb=0.2, start_rise=-0.05,
                 note="In a wide dtype logits leaving their range tend to saturate softmax "
                 "and stall learning rather than overflow: consider QK-norm or QK-clip."),
             summary="a head's max attention logit left its settled range"),
    # a straight line in log space over the last 200 steps, trusted at most 3x as far
    # ahead as it was observed: shown (info) with its horizon up to 1,000 steps ahead,
    # paged once the crossing is 300 steps away or less
    RuleSpec("attn_logit_forecast", "forecast", "attn.logit_max", over="max",
             for_steps=10, params={"critical": 65504.0, "window": 200, "min_samples": 6,
                                   "horizon": 1000.0, "trust": 3.0, "floor": 100.0},
             page=Page(eta_within=300.0, note="A forecast further ahead is shown with its "
                       "horizon: a straight line in log space drifts as training goes on."),
             summary="the max attention logit is on course to overflow float16 (65504)"),
    # off by default: a doubling p99 over 70 steps is ordinary early learning on the tuning
    # half (healthy runs of every family); the departure and the forecast carry the signal
    RuleSpec("attn_p99_trend", "trend", "attn.logit_p99", for_steps=10, severity="info",
             enabled=False,
             params={"window": 70, "min_tau": 0.7, "min_ratio": 2.0, "floor": 10.0},
             summary="a head's p99 attention logit keeps climbing"),
    # off by default: attention sharpens as a model learns; on the tuning half this fired on
    # healthy runs of three families within their first 300 steps
    RuleSpec("attn_entropy_collapse", "entropy_collapse", "attn.entropy_mean", severity="info",
             for_steps=20, params={"first_steps": 100, "fraction": 0.25}, enabled=False,
             summary="a head's attention entropy collapsed toward one-hot"),
    # -- output side ------------------------------------------------------------------------
    # final.* are per-sample statistics: their baseline and level are medians weighted by
    # the steps each sample stands for (a burst of samples the hooks took right after a loss
    # spike, e.g. on batches of padding whose hidden state is 0, counts for the steps it
    # covers; round three, from a held-out run of the first half at interval 40)
    # Round four: both count their 20 steps from the first of the newest raw samples above
    # the limit (at interval 50 a level crossing on the second sample out pages there, not
    # a sample later), and the level must clear the limit by one standard error of the
    # gap between the two medians (``noise_z``: at interval 50, 5 baseline samples and 2
    # in the level, a healthy log Z rising 1.1 nat over 300 steps crossed 1 nat by noise)
    RuleSpec("final_rms_departure", "departure", "final.hidden_rms", for_steps=20,
             params={"factor": 3.0, "floor": 0.0, "window": 200, "lag": 50, "smooth": 100,
                     "step_weighted": True, "noise_z": 1.0},
             summary="the final hidden RMS left its own recent range"),
    # log Z is already a logarithm: a fixed distance, 1 nat (Z grown e-fold over its recent
    # median), not a ratio, once settled (300 steps of history: log Z climbs a few nats
    # while a model first learns; an Adam-with-L2 GPT-2 of the suite rose 3 nats in its
    # first 200 steps and 0.6 more by 270); judged on its 100-step median: one sample of
    # log Z is noisy (a plain-SGD GPT-2 of the suite swings +-0.5 nat between samples).
    # Round thirty-four (--split read46, 2,808 runs): a nat out counts while log Z is still
    # climbing (its 20-step level 0.7 nat up on 50 steps before: climb), else only 1.25 nat
    # out (slow_margin). On BPE vocabularies a healthy LM head grown 2x over 200 steps, then
    # steady, takes log Z 1.008-1.014 nat over its range at a 50-step climb of 0.36-0.57
    # (f43_, f44_, f45_gemma2_logz_slow: paged on three of the four BPE sets read); the
    # heads that run away climb 1-6 nat in 50 steps when they cross. The 119 runs whose log
    # Z comes 0.9 nat out (recomputed from every step's log Z), at intervals 1 and 50: healthy
    # paged 6 -> 0 (those three at both), caught 222 -> 220 (f20_postln_head_drift: a head
    # drift whose log Z crept 1.09 nat out at a climb under 0.6 until it diverged at 536,
    # paged at 586 by the gradient), one paged 8 steps later (fresh_demo_head_drift, 99
    # steps ahead), none earlier.
    # Round thirty-five (--split read47, 2,872 runs): a ramp is judged on its 20-step level
    # (fast_margin 1.5 nat out, up fast_climb 0.75 nat in each half of the last 50 steps,
    # the newest sample on or over it, fast_for 5 steps in a row, the loss's 20-step level
    # not down 0.1 nat over them: fast_not_falling). The 100-step level lags a head that
    # runs away by 50 steps: post-LN heads growing from step 414 diverge at 462-468 and
    # were paged at 470. A garbage stretch lifts log Z at once and holds it (its short
    # levels straddle the jump for a step or two); a stretch of one repeated token lifts it
    # while the loss falls to 0. An offline mirror on every step's log Z of the 464 runs
    # whose 20-step level comes a nat out chose it (no healthy run fires anywhere in 1.0-2.0
    # x 0.5-1.0 x 1-8 steps); replayed at intervals 1 and 50 both ways: caught 782 -> 786
    # of 928 replays (f45_ and f47_postln_head_drift, at 462 and 458), 156 replays paged
    # 3-16 steps earlier (median 13), none later, healthy paged 2 -> 2 (the same runs),
    # healthy with any alert 42 -> 42
    RuleSpec("final_logz_departure", "departure", "final.logz", for_steps=20,
             params={"margin": 1.0, "floor": 0.0, "window": 200, "lag": 50,
                     "min_history": 300, "smooth": 100, "step_weighted": True,
                     "noise_z": 1.0, "climb": 0.7, "slow_margin": 1.25,
                     "fast_margin": 1.5, "fast_climb": 0.75, "fast_not_falling": "loss"},
             summary="the output log-normaliser log Z rose a nat (e-fold) above its recent "
             "range and is still climbing (or 1.25 nat)"),
    # Round thirty-seven (--split read54, 3,330 runs): log Z falling out of its range. A
    # head whose logits all sink as it grows (fresh54's post-LN head drift on batches of 8:
    # log Z 5.9 -> -32 while the loss climbed from 2.6, diverged at 566) is the same drift
    # downwards (z-loss pulls log Z to 0 from either side), and nothing paged it before 608.
    # final_logz_departure mirrored (``below``) with its fast path (a 20-step level 1.5 nat
    # under, down 0.75 nat in each half of the last 50 steps, the newest sample on or under
    # it, the loss's 20-step level not down 0.1, 5 steps in a row) and a 100-step level 1.5
    # nat under; not its climb path: a garbage stretch drops log Z at once, and a 20-step
    # level down 2 nat in 50 steps paged a healthy llama (f24_llama_sgd_bad_data_18, 1.18
    # nat under at 464; it paged the head drift at 522). Healthy runs' log Z comes at most
    # 1.23 nat under on its 100-step level (bad-data stretches; bench/screen_logz.py). The
    # 314 runs whose 100-step level comes 0.7 nat under or 20-step level 1.3, replayed at
    # intervals 1 and 50: no healthy or degraded run paged, or shown; f54_postln_head_drift
    # paged at 535, 31 ahead (608 before), a garbage run at 493 (509 before; it diverged at
    # 424), the 51 other runs where it fires (re-warms whose log Z also falls) paged where
    # they were. Read on fresh55: its head drift's log Z wandered before it fell, and the
    # rule fired after its divergence (ALERTS_EVIDENCE.md)
    RuleSpec("final_logz_fall", "departure", "final.logz", for_steps=20,
             params={"margin": 1.5, "floor": None, "window": 200, "lag": 50,
                     "min_history": 300, "smooth": 100, "step_weighted": True,
                     "noise_z": 1.0, "fast_margin": 1.5, "fast_climb": 0.75,
                     "fast_not_falling": "loss", "below": True},
             summary="the output log-normaliser log Z fell 1.5 nat below its recent range"),
    # -- slower, informational ----------------------------------------------------------------
    # off by default: late clipping on most steps is common in healthy runs, and a bad-data
    # run makes it too
    RuleSpec("clip_rate_rising", "clip_rate", "grad.clipped", severity="info", enabled=False,
             params={"window": 100, "rate": 0.9, "rise": 0.6},
             summary="gradient clipping went from rare to nearly every step"),
    # Round forty-two (--split read64, 4,034 runs): the bias must rise by 45 % (min_rise),
    # not 20 %. Of the read64 runs it fired on, the 68 QK-clip runs' biases had risen 0.49x
    # to 611x over the 100 steps when it fired (QK-clip shrinks W_q and W_k every step the
    # logits pass its threshold, and the bias takes the logit over); two post-LN runs whose
    # LR was bumped x5.7 for 53 steps under AdamW, with no clip, 0.21 and 0.40, and they
    # paged (f12_, f64_postln_lr_bump). bench/variants_round42.yaml at intervals 1, 10, 50:
    # 0.45 drops both and moves no QK-clip run's first page; 0.35 keeps f12's; 0.6 pages two
    # QK-clip runs 10 steps later.
    # Round forty-five (qkclip1 and the 86 QK-clip runs of --split read78): the breach must
    # last 30 steps (for_steps). A QK-clip that scales the biases with the weights, as the
    # project's fuse does, leaves no refuge, yet early in training the bias grows from its
    # zero init faster than the clip shrinks it: on 8 of qkclip1's 12 such runs the bias rose
    # 0.47-0.95x over 100 steps while the weight fell 20-34 %, its share 0.25-0.28, and
    # q_bias_refuge paged 5 of them. Those breaches last under 20 steps on a head; on every
    # QK-clip run that leaves the biases (86 of 86) a head breaches 40 steps in a row or
    # more, as each clip pushes the logit further into the bias (30: between, in log space;
    # an offline mirror of the rule on every step, and the engine on the 98 runs at
    # intervals 1-50). A share of 0.35 separated them too, but a smaller init raises the
    # share of a healthy run's bias; persistence is what a refuge is. No other recorded run
    # of read78 with q/k biases (1,906, GPT-2 and post-LN) breaches before its divergence
    # but one, f76_postln_rewarm, paged 118 steps earlier by other rules.
    # Round forty-six (--split read80: read78's QK-clip runs, fresh79, fresh80 and the
    # probes qkclip1 and qkclip2): the bias at least half the weight's norm (share 0.5), on
    # one sample, instead of a quarter held 30 steps. qkclip2's tau-3 run (a clip that
    # scales the biases) held its breach 50 steps, its bias's share peaking at 0.32 and then
    # falling as the clip and the bias settled; a refuge's share only climbs (past 1 on
    # every refuge recorded, 19 by step 760 at tau 3). The most any scaled run's breach
    # reached: 0.355 (qkclip2, tau 3, init 0.02; on qkclip3, held out, 0.41 under weight
    # decay, 0 of 16 paged: a fifth of margin). The engine on the 118 runs of read80 with
    # a q/k bias breach, a scaled clip or a refuge, at intervals 1, 10 and 50: no scaled run
    # paged (1 of 24 at 1 and 10 before), all 92 refuges paged by the refuge alone at every
    # interval, their first page earlier on 62 (median 20, 10 and 50 steps earlier at 1, 10,
    # 50) and later on 3-20 (up to 80 steps; at 50 one, f55_gpt2_qk_clip, 450: its early
    # breach on a layer-1 head peaked at a share of 0.44, its layer-0 refuge passed 0.5 at
    # 650); no other run's first page moved. An offline mirror on every step: 0.35 would
    # page the scaled run that reached 0.355; 0.4 pages every refuge by 9 steps after round
    # 45 with a margin of an eighth over it.
    RuleSpec("q_bias_refuge", "ratio", "qk.q_weight_norm", severity="warning",
             params={"other": "qk.q_bias_norm", "window": 100, "min_change": 0.2,
                     "min_rise": 0.45, "share": 0.5, "logit": "attn.logit_max",
                     "logit_floor": 1.0},
             summary="a head's W_q norm falls while its q bias norm rises (QK-clip's bias "
             "refuge)"),
    # k's bias keeps min_change as its rise: it never fired on a run without a QK-clip of
    # read64, and 0.45 here drops the k alert of a QK-clip run (gpt2_qk_clip_s1; its q
    # alert pages at the same step)
    # round forty-five: the same 30 steps (the same pathology); round forty-six: the same
    # share of 0.5 on one sample instead
    RuleSpec("k_bias_refuge", "ratio", "qk.k_weight_norm", severity="warning",
             params={"other": "qk.k_bias_norm", "window": 100, "min_change": 0.2,
                     "share": 0.5, "logit": "attn.logit_max", "logit_floor": 1.0},
             summary="a head's W_k norm falls while its k bias norm rises (QK-clip's bias "
             "refuge)"),
    # Round forty-three (--split read67, 4,162 runs): the attention wiped. A garbage batch
    # under unclipped momentum SGD that wrecks a post-LN run flattens every head's attention:
    # the max logit over all heads falls to ~0.0-0.3x its level and stays there on the clean
    # batches, the loss 1-3 nats up, and the run is dated diverging 2-9 steps after the
    # garbage, hours before loss_jump's "did not recover" (116 of read66's 135 such runs were
    # paged late). A model that shrugs the batch off has its attention back on the first
    # clean batch (0.56x at least, of 478); its dip during random garbage reached 0.35x.
    # Judged on every sampled frame (the 10-step fold's max hid the fall until ~10 steps
    # later). A batch of one repeated byte flattens a healthy model's attention too, with its
    # loss far up: without loss_up_max, 147 healthy runs paged at interval 1 (123 on such
    # batches); for_steps 5 kept 28 and dropped 24 of the 76 caught. The loss of a wiped
    # model's clean batches comes down to a nat or so up while the garbage's stays 3+ up:
    # loss_up_max 1.25. bench/variants_round43.yaml on the 280 runs where any variant paged
    # first (of the 546 the collapse screen flags), at 1/10/50: diverging caught +45/+34/+34,
    # healthy paged +4/+3/+4 (two post-LN single random batches, the one post-LN garbage
    # stretch that healed, a zero-byte stretch; at 50 three post-LN random stretches),
    # degraded paged earlier 8/5/4; 1.5: +47/+37/+36 for +5/+3/+6; 1.0: +40/+27/+27 for
    # +4/+3/+4
    # Round forty-eight (--split read83, 5,238 runs): only under a plain optimizer
    # (plain_only: the job's optim.adaptive = 0, or not sent), as loss_jump's damage test
    # since round fourteen: Adam's and RMSprop's step is normalised, so no one batch goes into
    # the weights whole. Under them it paged two healthy runs first, each 4 steps after 32
    # random batches under clipped AdamW, the attention back within 15 steps
    # (f83_postln_bad_data_random at 1, f46_ at 25), and was the first page of one
    # diverging run (f59_qknorm_high_lr, 297 steps ahead; loss_ramp pages it 17 steps
    # later). On the 48 adaptive runs where its test can breach (a widened screen of it,
    # 0.45x and 0.3-1.6 nats, and the rule alone at interval 1 on all 3,891 adaptive runs),
    # at 1/10/25/40/50: diverging caught 31/31 at each, unchanged; healthy paged (of 11)
    # 4/3/4/3/3 -> 3/3/3/3/3 (docs/ALERTS_EVIDENCE.md)
    RuleSpec("attn_wiped", "collapse", "attn.logit_max", over="max", severity="critical",
             params={"fraction": 0.3, "loss_up": 0.5, "loss_up_max": 1.25,
                     "plain_only": True},
             summary="every head's max attention logit fell under 0.3x its level with the "
             "loss up, under a plain optimizer: an update wiped the attention"),
    RuleSpec("no_data", "no_data", "*", severity="warning", params={"seconds": 600.0},
             summary="the run stopped reporting (hung or crashed)"),
)


def merge_rules(base: Iterable[RuleSpec], override: Iterable[RuleSpec]) -> list[RuleSpec]:
    """``base`` with every rule of ``override`` replacing the one of the same name."""
    out = {r.name: r for r in base}
    for r in override:
        out[r.name] = r
    return list(out.values())


def load_rules_file(path: str | os.PathLike[str]) -> list[RuleSpec]:
    """Rules from a YAML (or JSON) file: ``rules: [{name, kind, metric, params, ...}]``.

    A rule with the name of a default replaces it (``enabled: false`` turns it off).
    Raises :class:`RuleError` saying which rule and field are wrong.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise RuleError(f"{path}: cannot be read as a rules file ({why}); give a YAML file "
                        "of `rules: [...]`") from e
    try:
        import yaml
    except ImportError:  # pragma: no cover - yaml is a server dependency
        import json

        data = json.loads(text)
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise RuleError(f"{path}: not valid YAML: {e}") from e
    rules = data.get("rules") if isinstance(data, dict) else data
    if not isinstance(rules, list):
        raise RuleError(f"{path}: expected a list of rules under 'rules:'")
    out = []
    for i, d in enumerate(rules):
        try:
            out.append(RuleSpec.from_dict(d))
        except (RuleError, TypeError) as e:
            raise RuleError(f"{path}: rules[{i}]: {e}") from e
    return out
