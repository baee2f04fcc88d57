"""The default rules on the run's scalars: the loss, the learning rate and the gradient norm
(every step's, whatever the sampling interval), in the order the engine judges them.

Part of :data:`~logitwatch.server.alerts.defaults.DEFAULT_RULES` (the rules on the model's
insides, attention logits, the final layer and the query/key norms, are there); each rule's
comment says on which recorded runs it was chosen and what it measured there.
"""

from __future__ import annotations

from logitwatch.server.alerts.rules import Page, RuleSpec

__all__ = ["SCALAR_RULES"]

SCALAR_RULES: tuple[RuleSpec, ...] = (
    # -- run-level divergence: the loss itself (abrupt causes move it first) -------------
    RuleSpec("loss_nonfinite", "nonfinite", "loss", severity="critical", inhibits=True,
             summary="the loss is NaN or infinite: the run has diverged"),
    RuleSpec("loss_jump", "loss_jump", "loss", severity="critical", inhibits=True,
             params={"z": 8.0, "min_jump": 0.5, "window": 200, "center_window": 20,
                     "noise": "diff", "precursor_steps": 5, "precursor_wake": 40,
                     "aftershock_adaptive": False, "aftershock_loss": 1.9},
             # round five: the third jump within 20 steps pages (each of a warm-up's bumps
             # recovered until it diverged; bad-data runs of the read runs jump at most twice
             # in 20 steps, three times in 50). Round seven: with an unclipped gradient spike
             # it pages once the pair spans two steps (a healthy unclipped SGD run's one bad
             # batch spiked the gradient 79x and the loss 1.0 nat on one step, back the
             # next), or at once 2.5 nats up (the blow-ups of the runs read that jump on their
             # divergence step jump 6.3-15 nats; 2.5: between, in log space). Round nine
             # (chosen on --split read8, 488 runs): an unclipped pair pages only after a
             # precursor, the gradient 2.2x its calm median in the 5 steps before the jump (a
             # run of jumps leaving out its first three steps): the unclipped SGD blow-ups
             # read reach 2.8-196x there, the healthy runs' garbage batches, out of the
             # blue, 1.2-1.7x. Round ten (--split read10, 598 runs): or after damage, the
             # gradient 12x its calm median on a batch within two steps after the jump, the
             # loss still out of range: the garbage batches that wrecked an unclipped run
             # read 14.5-33x there, those the runs shrugged off 4.5-9.6x. Round eleven
             # (--split read11, 647 runs): the second jump within 20 steps pages when it
             # came after the precursor and went unclipped (two SGD blow-ups early in
             # warm-up bumped, the gradient built 3.7-4.7x, and bumped again at divergence;
             # on the clipped steps of a healthy LR bump and a bad-data run the same shape).
             # Round thirteen (--split read13, 749 runs): within 40 steps of a higher jump a
             # breach counts no precursor (a garbage batch's kick left the gradient 2-5x up
             # for tens of steps while the weights healed, and the loss jumped again, far
             # under the kick: three healthy runs paged that way, one SGD blow-up bumped
             # under its first bump and paged 5 steps later). Round fourteen (--split read14,
             # 801 runs): the damage test only under plain SGD (the job's optim.adaptive):
             # Adam's and RMSprop's step is normalised by the gradient's running RMS, so a
             # garbage batch's update is bounded and its 18-26x aftershock heals; four healthy
             # runs under unclipped RMSprop paged that way, no diverging run needed it. Round
             # fifteen (--split read15, 857 runs): the damage test only while the batch after
             # the jump is still 1.9 nats over the loss's median: on the garbage batches that
             # wrecked an unclipped SGD run the next batch read 1.99-5.5 nats up, on those the
             # runs healed from 1.22-1.82 (four healthy SGD runs paged that way); 1.9: between.
             # Round eighteen (--split read20, 1,148 runs): the pair's two steps are the
             # loss's own under an adaptive optimizer, unclipped (confirm_adaptive): two
             # healthy runs under unclipped RMSprop paged early in training, where a blip,
             # then one batch spiked the gradient 135-151x with the loss 1.5-2.2 nats up and
             # back on the next step, the gradient still up there; the pair spanned two
             # steps through the gradient only. The one diverging run under an unclipped
             # adaptive optimizer read (AdamW with eps 1) jumps 15 nats at once. read20 @1:
             # caught 431/448 unchanged, healthy paged 36/678 -> 34/678. Round twenty
             # (--split read22, 1,272 runs): there, at once only after the update that did it
             # (at_once_adaptive_above: the step before the jump put a gradient 12x its median
             # into the weights, as the damage test reads the batch after): of the 91 runs
             # read under an unclipped adaptive optimizer, the 51 healthy ones with a jump of
             # 2.5 nats or more had 0.8-2.2x there (one, a single garbage batch under Adam
             # with the gradient 2.3x five steps before, paged), the one divergence 11,146x.
             # read22 @1 on those 91 runs: caught 1/1 at the same step, healthy paged 1 -> 0.
             # Round twenty-one (--split read23, 1,336 runs): no page after damage (round
             # ten's aftershock_above dropped, here and on grad_blowup). Of the 21 unclipped
             # SGD runs it paged at a garbage batch, 15 sat 0.1-1.3 nats up 2-12 steps after
             # the last bad batch, alike whether labelled healed (6) or not (9: the label only
             # said whether the loss came back within half a nat of its best in the next 100
             # steps); 6 blew up 4-17 steps later (4.9-24 nats up), and the precursor pages
             # those 1-7 steps into the blow-up. One batch's damage is a single-sample event:
             # shown (the aftershock stays in the evidence), paged if it persists.
             # Round twenty-three (--split read28, 1,656 runs): also with loss_clip_ramp
             # breaching (the loss's level 0.3 nat up with the gradient clipped on most steps
             # while the LR climbs), still after a precursor or a climb: a QK-norm warm-up
             # ramped too far takes its first big jump as its divergence, clipped, and
             # loss_clip_ramp's 10-step hold paged 3 of them 2-6 steps after. On the 650 runs where
             # the change can act (loss_jump fired on a healthy or degraded run, or with
             # loss_clip_ramp on a diverging one): caught 173/177 -> 176/177, 13 pages 1-10
             # steps earlier, healthy paged 12/467 unchanged.
             # Round twenty-five (--split read30, 1,784 runs): "recovered" means the loss's
             # level (median of its last 20 steps, over the steps since the jump) is back
             # within half a nat of its level before (recover_within; half a nat is what the
             # labels call recovered). The episode used to resolve on its first step under the
             # detector's limit, 0.4-0.7 nat over the newest losses: 15 unclipped SGD runs that
             # garbage left 0.55-0.66 nat worse for good cleared that way, were reported
             # "Recovered" and never paged. Held open instead, they page 100 steps after the
             # jump (after: 68-93 steps after their divergence, a late page, not a catch).
             # On the 1,049 read30 runs with an injected event or no clipping @1: diverging
             # runs never paged 15 -> 0 (first pages otherwise unchanged, none later), healthy
             # paged 13/717 unchanged (same runs, same steps), degraded paged 6/6 (1 before);
             # on the 521 of them where an episode waited or that were never paged, the same
             # at intervals 10 and 50.
             # Round thirty (--split read38, 2,296 runs): a jump under half of an earlier one
             # within 20 steps is its aftershock and does not count toward repeats
             # (repeats_aftershock). One garbage batch under unclipped momentum SGD kicks a
             # post-LN run's loss 5.2-5.5 nats up; it is back within a nat the next step and
             # jumps again 0.6-1.4 nats while the weights heal, the third jump within 20 steps
             # paged: three healthy runs so (f13_, f37_, f38_postln_sgd_outlier_random) and
             # one that stayed 0.5-0.7 nat worse for good (f21_, dated 429, paged at 410,
             # never after). On read37's 60 runs a repeats page touched and all 64 of fresh38
             # at intervals 1, 10 and 50: healthy paged 18 -> 9 replays, caught
             # 225 -> 222.
             page=Page(after=100, with_rules=("grad_blowup", "grad_nonfinite", "loss_clip_ramp"),
                       repeats=3, repeats_aftershock=0.5,
                       repeats_within=20, repeats_built=2, confirm_steps=1,
                       at_once_above=2.5, precursor_above=2.2, climb_above=2.5,
                       confirm_adaptive=True, at_once_adaptive_above=12.0,
                       recover_within=0.5,
                       note="A loss bump that recovers within 100 steps (a bad batch or data "
                       "shard) is shown, not paged."),
             summary="the loss jumped far out of its recent range"),
    # a non-finite gradient alone can be a loss scaler's skipped step (fp16 AMP); with the
    # loss moving too, or lasting 10 steps, it is not
    RuleSpec("grad_nonfinite", "nonfinite", "grad.norm", severity="critical",
             page=Page(after=10, with_rules=("loss_jump", "loss_nonfinite")),
             summary="the gradient norm is NaN or infinite"),
    RuleSpec("lr_jump", "lr_jump", "lr", severity="warning", params={"factor": 10.0},
             summary="the learning rate jumped tenfold or more between two samples"),
    RuleSpec("lr_above_peak", "above_peak", "lr", severity="warning",
             params={"factor": 10.0, "settle": 100},
             summary="the learning rate rose tenfold above the peak its schedule had settled "
             "at (a re-warm or ramp too far)"),
    RuleSpec("lr_change", "lr_jump", "lr", severity="info", params={"factor": 2.0},
             summary="the learning rate changed abruptly between two samples"),
    # z 10 (round five tried 8: an SGD blow-up paged a step earlier, and a healthy
    # unclipped SGD run whose loss spiked once in warm-up, of the fifth held-out set, paged).
    # Round seven: corroborated over two steps, as loss_jump; an episode ends 10 calm steps
    # after its last breach (the kind's 100 joined two one-step blips 48 steps apart of a
    # healthy run into one episode that "persisted" 48 steps and paged). Round nine: with
    # loss_jump's precursor; alone it pages after 30 steps, not 10 (a garbage batch left a
    # healthy unclipped SGD run's gradient 2-6x up for 15 steps; no blow-up read paged
    # through persistence before its divergence)
    # Round thirty-one (--split read39, 2,360 runs): judged once the gradient norm has 50 steps
    # behind it (min_history), as the departures. Its first steps' range is no range: an
    # unclipped run's gradient norm leaves its initial value as the weights leave their
    # init or a warm-up climbs, and the spike fired on 83 healthy runs before step 60 at
    # interval 1 (and on 66 diverging runs, most of them hundreds of steps before their
    # divergence). On the 141 runs where it fired that early, at intervals 1, 10 and 50:
    # healthy replays with an alert before step 50 195 -> 15 (with any alert 231 -> 165),
    # caught 147 -> 147, healthy paged 6 -> 6, one early blow-up paged a step later (51, its
    # divergence) and one 4 steps earlier
    RuleSpec("grad_blowup", "spike", "grad.norm", severity="warning", keep_firing_for=10,
             params={"z": 10.0, "window": 200, "min_scale": 0.05, "only_unclipped": True,
                     "min_history": 50},
             # Round sixteen (--split read16, 913 runs): alone after 60 steps, not 30 (two
             # healthy unclipped SGD runs whose garbage stretch left the gradient up past 30
             # steps while the weights healed paged that way; no diverging run read needed
             # persistence under 60 steps to be caught by its divergence). Round eighteen:
             # confirm_adaptive, as loss_jump's. Round twenty-one: no page after damage, as
             # loss_jump's
             page=Page(after=60, with_rules=("loss_jump",), confirm_steps=1,
                       precursor_above=2.2, climb_above=2.5, confirm_adaptive=True),
             summary="an unclipped gradient spike went straight into the weights"),
    RuleSpec("grad_spike", "spike", "grad.norm", severity="warning", for_steps=10,
             params={"z": 10.0, "window": 200, "min_scale": 0.05},
             page=Page(after=100, note="Gradient norms far up for less than 100 steps (a bad "
                       "batch run that clipping bounded) are shown, not paged."),
             summary="the gradient norm stayed far above its recent median"),
    # the level (100-step median) against the lowest it settled to from step 100 on: a
    # warm-up ramping the LR too far raises it 5x while the loss still looks flat (the
    # suite's healthy byte-level runs stay under 5x, QK-norm at a high LR reaching 4.7x).
    # Round thirty-two (--split read41 and fresh43, the first set on another vocabulary, a
    # BPE of 2,048 tokens): shown, not paged (info), as grad_norm_ramp below. On that
    # vocabulary healthy QK-norm warm-ups to LR 0.2-0.24 raise the level 6.7-8.5x (9.6x
    # over 50 steps) with the loss flat, as the byte runs that diverge do: the level alone
    # cannot tell them apart. The warm-ups it led are paged by the loss rules below
    # (loss_clip_ramp, loss_grad_ramp, loss_ramp) before they diverge, the output drift by
    # final_logz_departure (one tuning run, postln_head_drift_s0, is then paged only after
    # it diverged)
    RuleSpec("grad_norm_rising", "level_rise", "grad.norm", severity="info", for_steps=20,
             params={"window": 100, "factor": 5.0, "min_history": 100},
             summary="the gradient norm's level rose fivefold above the lowest it had settled "
             "to"),
    # the same while the learning rate is still climbing (a warm-up ramping too far): a
    # 50-step level 6x the lowest while the LR is 5 % above its value 50 steps before (held
    # for 10 steps until round twenty-eight, below). Round three, chosen on the 180 runs
    # read so far: it pages the three first warm-ups that ramp past what QK-norm holds 5-51
    # steps before they diverge; healthy QK-norm runs warming up to 0.3 reach 4.1-5.0x.
    # Round twenty-eight (--split read33, 1,976 runs): no 10-step hold, as loss_clip_ramp and
    # loss_grad_ramp (a 50-step median already). Recomputed from every step's gradient norm
    # and LR, the condition holds on no step of the 1,227 healthy and 37 degraded runs (the
    # nearest healthy level while the LR climbs: 5.2x, QK-norm at LR 0.3). The 36 diverging
    # runs where it comes before the first page of their set's last replay and the 66
    # healthy or degraded runs whose level reaches 3x, at intervals 1, 10 and 50: 32 runs
    # paged earlier (median 10 steps, 1-18), none later; caught 36/36, no healthy run paged,
    # the 12 degraded warned as before. Round thirty-two: info (see grad_norm_rising)
    RuleSpec("grad_norm_ramp", "level_rise", "grad.norm", severity="info",
             params={"window": 50, "factor": 6.0, "min_history": 100, "while_rising": "lr",
                     "rising_span": 50, "rising_factor": 1.05},
             summary="the gradient norm's level rose sixfold while the learning rate is still "
             "climbing (a warm-up ramping too far)"),
    # the level (20-step median) 10x the lowest 100-step level it settled to AND still
    # climbing, 2.5x over each of its last two spans of 30 steps: a growth feeding itself (an
    # LM head running away under a flat loss), not a jump that holds (a stretch of bad
    # batches: one span), nor a level that rose and settled (a warm-up's). Round
    # thirty-eight, chosen on --split read55 (3,394 runs) from every step's gradient norm
    # (bench/screen_grad_climb.py): the nearest healthy or degraded run comes to 0.70 of the
    # three conditions at once (f55_llama_sgd_bad_data_10, an SGD catapult and a garbage
    # stretch), 62 diverging runs meet them by their divergence. Replayed at intervals 1
    # and 50 on those 62 and the 6 healthy runs that come closest: none of those 6 gets an
    # alert from it; two runs missed are paged ahead of their divergence,
    # f55_postln_head_drift 595 -> 542 (568) and postln_head_drift_s0 502 -> 430 (462);
    # nothing else's first page moves
    RuleSpec("grad_norm_climb", "level_rise", "grad.norm", severity="warning",
             params={"window": 20, "factor": 10.0, "min_history": 200, "low_window": 100,
                     "climb_factor": 2.5, "climb_span": 30, "climbs": 2},
             summary="the gradient norm's level is 10x the lowest it settled to and still "
             "climbing"),
    # the loss's own level (20-step median) half a nat above the lowest it reached, for 10
    # steps, while the LR still climbs gradually (5 % to 4x above its value 50 steps before:
    # a warm-up, not a step, which lr_jump judges). Round six, chosen on the runs read
    # before the sixth held-out set (--split read5): it pages the warm-ups ramping too far
    # whose loss bumps and recovers before the gradient norm's ramp is 6x; at 0.4 a healthy
    # unclipped SGD run's one warm-up spike (3.1 -> 5.0, recovered in 20 steps) paged, at
    # 0.6 a ramp paged after its divergence
    RuleSpec("loss_ramp", "level_rise", "loss", severity="warning", for_steps=10,
             params={"window": 20, "margin": 0.5, "min_history": 50, "while_rising": "lr",
                     "rising_span": 50, "rising_factor": 1.05, "rising_max": 4.0},
             summary="the loss's level rose half a nat above its best while the learning "
             "rate is still climbing (a warm-up ramping too far)"),
    # both at once, earlier: the loss's level 0.3 nat above its best AND the gradient norm's
    # 50-step level 2.5x the lowest it settled to (from step 100), while the LR still climbs
    # gradually (held for 10 steps until round twenty-seven, below). Round eight, chosen on
    # the 411 runs read (--split read7): it pages all 20 warm-ups ramping too far before
    # their divergence (loss_ramp alone paged three 4-13 steps after it); of the 252
    # healthy runs the nearest reached 0.32 nat with the gradient 2.43x
    # (fresh_llama_wide_lr03, whose departure pages anyway), the next 0.24 nat with 4.6x
    # (QK-norm at LR 0.30); an unclipped SGD warm-up spike lifts the loss 0.4-0.6 nat with
    # the gradient's level flat (1.0-1.1x).
    # Round twenty-seven (--split read32, 1,912 runs): no 10-step hold, as loss_clip_ramp in
    # round twenty-six (its readings are 20- and 50-step windows already). No healthy run
    # of 1,185 meets the condition on any step; the 81 whose gradient level climbs 2.5x
    # while the LR climbs, replayed without the hold at intervals 1, 10, 50: none paged. The
    # 313 runs where it holds or fired, at 1 and 50: caught 291 -> 292 of 295 (an SGD
    # warm-up dated 157, paged at 155 instead of 162), 111 runs paged earlier (median 10
    # steps), none later; degraded 36/36 as before.
    # Round thirty-three (--split read44, 2,680 runs; the margin in nats was chosen on byte
    # vocabularies): the margin is at least twice the loss's own step-to-step noise over its
    # last 100 steps (noise_margin; loss_clip_ramp too). A loss on a 4,096-token BPE wanders
    # 0.17-0.21 nat a step against 0.06-0.10 on bytes, and a healthy QK-norm warm-up's
    # 20-step level touched 0.314 nat over its lowest (f44_demo_plain); on bytes 2x the
    # noise stays under 0.3 and nothing moves. The 164 runs whose level comes within 2.6x
    # their noise of the margin, at intervals 1 and 50: caught 298/298 both ways, healthy
    # paged 2 -> 0, degraded warned 20 -> 20, 7 diverging runs paged 2-30 steps later (all
    # on 4,096 tokens, the nearest 5 steps ahead of its divergence), none earlier.
    # Round thirty-six (--split read50 and long1, the first runs of 4,000 steps): past
    # rising_max while the LR rose on each of its last 5 steps (ramp_steps; loss_clip_ramp
    # too). A second warm-up begun late, from an LR a cosine had decayed to a quarter of
    # its peak, climbs x25 in 50 steps with no tenfold step and diverges before it is ten
    # times the settled peak: no rule paged it before it diverged (long_gpt2_rewarm, paged
    # at 3040 by lr_above_peak, divergence 3035). A step taken and held (an LR bump x5-x10
    # for 50 steps, 61 healthy runs read) rises on one step, and stays capped. On the
    # 3,068 runs the condition holds on no healthy or degraded run (bench/mirror_ramps.py
    # --maxima 4 --monotone); the 100 diverging runs where it holds, at intervals 1 and
    # 50: caught 99 -> 100, 3 paged earlier (3-22 steps), none later
    RuleSpec("loss_grad_ramp", "level_rise", "loss", severity="warning",
             params={"window": 20, "margin": 0.3, "min_history": 50, "while_rising": "lr",
                     "rising_span": 50, "rising_factor": 1.05, "rising_max": 4.0,
                     "ramp_steps": 5,
                     "also_metric": "grad.norm", "also_factor": 2.5, "also_window": 50,
                     "also_min_history": 100, "noise_margin": 2.0},
             summary="the loss's level rose 0.3 nat (or twice its batch noise) above its best "
             "and the gradient norm's "
             "2.5-fold above its lowest while the learning rate is still climbing (a warm-up "
             "ramping too far)"),
    # the same loss level with the gradient at the clip on most steps instead of its level
    # 2.5x up. Round seventeen (--split read17, 970 runs): a warm-up ramping too far within
    # its first 150 steps diverges before the gradient's level has settled (from step 100)
    # long enough to read 2.5x (four QK-norm ramps of the runs read were paged 2-15 steps
    # after their divergence); there the gradient was clipped on every step for tens of
    # steps. Of the 564 healthy runs read, none had the loss's level 0.3 nat up for 10
    # steps while the LR climbed with more than a third of its last 20 steps clipped (one,
    # a Llama at a high LR, with a fifth); the 13 fast ramps all reached 0.9.
    # read17 @1: caught 372/386 -> 375/386, healthy paged 29/564 -> 29/564
    # Round twenty-six (--split read31, 1,848 runs): no 10-step hold. The condition is
    # already three 20-step readings (the loss's median, the clip rate, the LR against 50
    # steps before); the hold only delayed the page, and two QK-norm ramps dated 105 and 137
    # paged 4 steps after their divergence. None of the 1,143 healthy runs read meets the
    # condition on any step (107 of them clip on most steps while the LR climbs, their loss
    # level under 0.3 nat up: none paged at intervals 1, 10, 50). The 104 QK-norm ramps:
    # caught 102 -> 104 at 1, 10 and 50 (on arrival 95 -> 102 at 10 and 50), 10 steps
    # earlier (median; 1-25), none later. Round thirty-three: at least twice the loss's step
    # noise (noise_margin; see loss_grad_ramp). Round thirty-nine (--split read59, 3,650
    # runs): clipped on 60 % of the last 20 steps, not 75 %. Under Adam's betas (0.9, 0.999)
    # (fresh59) QK-norm warm-ups ramped too far diverge by steps 104-117, the clipping still
    # intermittent (55-65 % of the steps) as the loss leaves: three were paged 1-2 steps
    # after their divergence. bench/mirror_ramps.py --rates: at 0.6 no healthy or degraded
    # run fires that did not at 0.75 (the nearest healthy reaches 0.4 where the rest holds:
    # fresh_llama_wide_lr03, f59_qknorm_lr24_s590), 4 diverging gained, 51 earlier, none
    # lost. Replayed at intervals 1 and 50 against 0.75: the 57 runs the mirror fires
    # earlier or gains, caught 53 -> 56 (f59_lr_ramp_s590 118 -> 114, divergence 117; _s591
    # 108 -> 105, 106; _s593 105 -> 102, 104), 31 paged earlier (median 3 steps, 1-13), none
    # later; a first replay of 44 (the nearest healthy and degraded runs, and those a
    # mirror without the loss_grad_ramp path gains): healthy and degraded pages unchanged.
    # Round forty-four (--split read68, 4,226 runs): clipped on half the last 20 steps. With
    # the clip at twice the norm (fresh67) the gradient reaches it on fewer steps as the
    # loss leaves: two QK-norm warm-ups ramped too far met 60 % 1-2 steps after their
    # divergence (f67_lr_ramp_s670 113 for 112, _s671 119 for 117). bench/mirror_ramps.py
    # --rates 0.6,0.5,0.45,0.4: no healthy run fires at 0.5 that did not at 0.6 (the nearest
    # still 0.4: fresh_llama_wide_lr03, f59_qknorm_lr24_s590). Replayed at intervals 1, 10
    # and 50 on the 76 runs where the mirror moves or a healthy or degraded run comes to 0.3
    # (bench/variants_round44.yaml): caught 27/29 -> 29/29 at each, 46 pages earlier (median
    # 2 steps, 1-33), none later; healthy paged 7/8 and degraded 39/39 unchanged (one
    # degraded run paged 7 steps earlier at 963). 0.45: the same catches, three degraded
    # runs paged earlier
    RuleSpec("loss_clip_ramp", "level_rise", "loss", severity="warning",
             params={"window": 20, "margin": 0.3, "min_history": 50, "while_rising": "lr",
                     "rising_span": 50, "rising_factor": 1.05, "rising_max": 4.0,
                     "ramp_steps": 5,
                     "also_metric": "grad.clipped", "also_window": 20, "also_rate": 0.5,
                     "noise_margin": 2.0},
             summary="the loss's level rose 0.3 nat (or twice its batch noise) above its best "
             "with the gradient at the "
             "clip on half the steps or more while the learning rate is still climbing (a warm-up "
             "ramping too far)"),
    RuleSpec("first_loss", "first_loss", "loss", severity="warning",
             summary="the first loss is far from ln(vocab)"),
)
