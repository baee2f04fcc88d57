"""Record the alert scenario suite: real tiny-model training runs on the CPU.

Each scenario trains the demo GPT (``logitwatch.demo.train``) with the REAL hooks attached
(``logitwatch.attach``), handing frames to a recorder that stands for the client and keeps
each one exactly as the client would put it on the wire. One file per scenario,
``bench/scenarios/<name>.jsonl``: the first line is a header object
``{"scenario": ..., "label": "diverging"|"healthy", "divergence_step": N|null, ...}``,
every other line is one frame in the wire format of :mod:`logitwatch.wire`.

The label is measured on the per-step loss of the run (not the sampled one), never by a
detector under test (:func:`outcome`):

* ``diverging``: the demo's own :func:`~logitwatch.demo.train.divergence_step` found a step
  (a NaN/Inf loss, or a 10-step mean 1 nat above the best earlier one);
* ``degraded``: it did not, but the run ended at least 0.25 nat above its best: the mean of
  its last 100 losses exceeds the lowest 100-step mean of the run by ``DEGRADED_NATS``.
  The run lost ground it had won and did not win it back. A monitor should warn about such a
  run, so bench_alerts.py counts it neither as a catch nor as a false alarm and reports it
  apart;
* ``healthy``: neither.

On the recorded suite the healthy runs end within 0.03 nat of their best (a bump that
recovers included) and the degraded ones 0.6-0.8 nat above it, so any limit between 0.05
and 0.5 labels them alike. ``--relabel`` rewrites the headers of recorded files after a
change of this rule, without training again.

Usage::

    python bench/record_scenarios.py                 # all scenarios, 2 processes
    python bench/record_scenarios.py lr_jump healthy_s0 --jobs 1
    python bench/record_scenarios.py fp32_high_lr --out /tmp/try   # elsewhere
    python bench/record_scenarios.py --list
    python bench/record_scenarios.py --relabel       # recompute the labels of the files

Each run uses ``torch.set_num_threads(1)``; the suite takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "scenarios"
SAMPLE_EVERY = 10
DEGRADED_WINDOW = 100
DEGRADED_NATS = 0.25


def regression(losses: list[float], window: int = DEGRADED_WINDOW) -> float:
    """How far (nats) the mean of the last ``window`` losses is above the lowest
    ``window``-step mean of the run; 0.0 for a run shorter than ``window``."""
    if len(losses) < window or not all(math.isfinite(x) for x in losses):
        return 0.0
    total = sum(losses[:window])
    best = last = total / window
    for i in range(window, len(losses)):
        total += losses[i] - losses[i - window]
        last = total / window
        best = min(best, last)
    return last - best


def outcome(losses: list[float], divergence: int | None) -> str:
    """``diverging``, ``degraded`` or ``healthy`` (see the module docstring)."""
    if divergence is not None:
        return "diverging"
    return "degraded" if regression(losses) >= DEGRADED_NATS else "healthy"


@dataclass(frozen=True)
class Scenario:
    """One recorded run: a demo setting, changes to it, and an optional injection."""

    name: str
    mechanism: str
    base: str = "unstable"  # a key of logitwatch.demo.train.SETTINGS
    changes: dict[str, Any] = field(default_factory=dict)
    # piecewise learning-rate multipliers: ((from_step, factor), ...), applied on top of
    # the setting's own schedule (a jump, or a bump that ends)
    lr_steps: tuple[tuple[int, float], ...] = ()
    # (step, factor): multiply every gradient by factor on that one step (a gradient spike)
    grad_spike: tuple[int, float] | None = None
    # (from_step, rate): multiply the LM head weight by (1 + rate) after every step from
    # from_step (a slow drift of the output logits)
    head_drift: tuple[int, float] | None = None
    # run the forward (loss included) under torch.autocast("cpu", dtype=...), as mixed-
    # precision jobs do: with "bfloat16" the attention gets bf16 q/k/v and runs in bf16
    # (the hooks send attn.dtype_max = finfo(bfloat16).max); backward outside it
    autocast: str | None = None
    steps: int | None = None
    expect: str = ""  # what the scenario is meant to be (the recorded label is measured)


L4 = {"n_layer": 4, "d_model": 128, "n_head": 8}

SCENARIOS: list[Scenario] = [
    # -- attention-logit growth toward the float16 overflow (the demo's mechanism) --------
    Scenario("attn_growth_s0", "attention-logit growth, fp16 overflow", expect="diverging"),
    Scenario("attn_growth_s1", "attention-logit growth, fp16 overflow",
             changes={"seed": 1}, expect="diverging"),
    Scenario("attn_growth_s2", "attention-logit growth, fp16 overflow",
             changes={"seed": 2}, expect="diverging"),
    Scenario("attn_growth_slow", "attention-logit growth, slower warm-up",
             changes={"seed": 3, "lr": 0.12, "warmup": 1200}, steps=1500, expect="diverging"),
    # -- abrupt causes: learning-rate jump and ramp, gradient spike -----------------------
    Scenario("lr_jump", "learning-rate jump x50 at step 500 (QK-norm model)", base="healthy",
             changes={"lr": 0.01, "warmup": 100}, lr_steps=((500, 50.0),), steps=800,
             expect="diverging"),
    Scenario("lr_ramp", "learning rate ramping to 1.5 over 1000 steps (QK-norm model)",
             base="healthy", changes={"lr": 1.5, "warmup": 1000}, steps=1000,
             expect="diverging"),
    Scenario("grad_spike_sgd", "gradient spike x1e4 at step 600, SGD-like AdamW (eps 1), "
             "no clipping", base="healthy",
             changes={"lr": 1.0, "warmup": 100, "eps": 1.0, "max_norm": 1e9},
             grad_spike=(600, 1e4), steps=800, expect="diverging"),
    Scenario("head_drift", "output-logit drift: LM head grows 3%/step from step 300",
             base="healthy", changes={"lr": 0.01, "warmup": 100}, head_drift=(300, 0.03),
             steps=900, expect="diverging"),
    Scenario("qknorm_high_lr", "QK-norm does not save peak lr 0.5: diverges late",
             base="healthy", changes={"lr": 0.5, "seed": 2}, expect="diverging"),
    # -- wide-dtype attention that diverges without overflowing (no QK-norm, peak lr 0.4:
    #    logits grow, the loss climbs slowly until it diverges; with QK-norm, fp32, seed 0, lr
    #    0.4 trained 1,300 steps without diverging)
    Scenario("fp32_high_lr", "no QK-norm, fp32 attention, peak lr 0.4: logits grow, loss "
             "climbs and diverges without overflow", changes={"attn_dtype": "float32",
                                                             "lr": 0.4},
             expect="diverging"),
    Scenario("fp32_high_lr_s1", "no QK-norm, fp32 attention, peak lr 0.4, seed 1: logits "
             "grow, loss climbs and diverges without overflow",
             changes={"attn_dtype": "float32", "lr": 0.4, "seed": 1}, expect="diverging"),
    Scenario("bf16_high_lr", "no QK-norm, bf16 autocast forward (bf16 attention), peak lr "
             "0.4: logits grow, loss climbs and diverges without overflow",
             changes={"attn_dtype": "float32", "lr": 0.4}, autocast="bfloat16",
             expect="diverging"),
    # recorded after the default rules were set (held out): other seeds of the runs above
    Scenario("bf16_high_lr_s1", "no QK-norm, bf16 attention, peak lr 0.4, seed 1 (held out)",
             changes={"attn_dtype": "float32", "lr": 0.4, "seed": 1}, autocast="bfloat16",
             expect="diverging"),
    Scenario("fp32_high_lr_s2", "no QK-norm, fp32 attention, peak lr 0.4, seed 2 (held out)",
             changes={"attn_dtype": "float32", "lr": 0.4, "seed": 2}, expect="diverging"),
    # -- healthy, including hard negatives ------------------------------------------------
    Scenario("healthy_s0", "QK-norm, peak lr 0.2", base="healthy", expect="healthy"),
    Scenario("healthy_s1", "QK-norm, peak lr 0.2", base="healthy", changes={"seed": 1},
             expect="healthy"),
    Scenario("qknorm_lr03", "QK-norm, peak lr 0.3 (high LR)", base="healthy",
             changes={"lr": 0.3, "seed": 2}, expect="healthy"),
    Scenario("benign_bump", "QK-norm, lr x8 for steps 500-540 then back: a bump that "
             "recovers", base="healthy", changes={"lr": 0.02, "warmup": 100},
             lr_steps=((500, 8.0), (540, 1.0)), steps=900, expect="healthy"),
    Scenario("fp32_high_flat", "no QK-norm, fp32 attention, moderate lr: logits high, "
             "no overflow", changes={"attn_dtype": "float32", "lr": 0.03, "warmup": 200},
             steps=1200, expect="healthy"),
    Scenario("fp32_growth", "no QK-norm, fp32 attention, peak lr 0.2: logits grow, no "
             "overflow", changes={"attn_dtype": "float32"}, expect="degraded"),
    Scenario("bf16_growth", "no QK-norm, bf16 autocast forward (bf16 attention), peak lr "
             "0.2: logits grow, the loss drifts up, no divergence",
             changes={"attn_dtype": "float32"}, autocast="bfloat16", expect="degraded"),
    # -- held out (recorded after the default rules were set) -----------------------------
    Scenario("fp32_growth_s1", "no QK-norm, fp32 attention, peak lr 0.2, seed 1 (held out)",
             changes={"attn_dtype": "float32", "seed": 1}, expect="degraded"),
    Scenario("bf16_growth_s2", "no QK-norm, bf16 attention, peak lr 0.2, seed 2 (held out)",
             changes={"attn_dtype": "float32", "seed": 2}, autocast="bfloat16",
             expect="degraded"),
    Scenario("fp32_mid_lr", "no QK-norm, fp32 attention, peak lr 0.1 (held out)",
             changes={"attn_dtype": "float32", "lr": 0.1}, expect="healthy"),
    Scenario("bf16_mid_lr_s1", "no QK-norm, bf16 attention, peak lr 0.1, seed 1 (held out)",
             changes={"attn_dtype": "float32", "lr": 0.1, "seed": 1}, autocast="bfloat16",
             expect="healthy"),
    Scenario("qknorm_lr03_s3", "QK-norm, peak lr 0.3, seed 3 (held out)", base="healthy",
             changes={"lr": 0.3, "seed": 3}, expect="healthy"),
    Scenario("lowlr_noqk", "no QK-norm, fp16 attention, low lr 0.01",
             changes={"lr": 0.01, "warmup": 200}, steps=1200, expect="healthy"),
    Scenario("grad_spike_clipped", "gradient spike x1e4 at step 600, clipped at 1.0 "
             "(AdamW): a spike that does no harm", base="healthy",
             changes={"lr": 0.02, "warmup": 100}, grad_spike=(600, 1e4), steps=900,
             expect="healthy"),
    # -- a larger model (4 layers, d_model 128, 8 heads of 16): less stable at the same LR;
    #    the first five were recorded with the 0.5-nat corroboration and then used to set
    #    0.25, the rest after that (held out) -------------------------------------------------
    Scenario("l4_attn_growth", "4 layers d 128: attention-logit growth, fp16",
             changes=L4, expect="diverging"),
    Scenario("l4_bf16_high_lr", "4 layers d 128: no QK-norm, bf16 attention, peak lr 0.4",
             changes={**L4, "attn_dtype": "float32", "lr": 0.4}, autocast="bfloat16",
             expect="diverging"),
    Scenario("l4_fp32_growth", "4 layers d 128: no QK-norm, fp32 attention, peak lr 0.2",
             changes={**L4, "attn_dtype": "float32"}, expect="degraded"),
    Scenario("l4_qknorm_lr02", "4 layers d 128: QK-norm, peak lr 0.2 (diverges late)",
             base="healthy", changes=L4, expect="diverging"),
    Scenario("l4_qknorm_lr03", "4 layers d 128: QK-norm, peak lr 0.3 (the loss drifts up)",
             base="healthy", changes={**L4, "lr": 0.3}, expect="degraded"),
    Scenario("l4_attn_growth_s1", "4 layers d 128: attention-logit growth, fp16, seed 1 "
             "(held out)", changes={**L4, "seed": 1}, expect="diverging"),
    Scenario("l4_bf16_high_lr_s1", "4 layers d 128: no QK-norm, bf16 attention, peak lr 0.4, "
             "seed 1 (held out)", changes={**L4, "attn_dtype": "float32", "lr": 0.4, "seed": 1},
             autocast="bfloat16", expect="diverging"),
    Scenario("l4_fp32_high_lr", "4 layers d 128: no QK-norm, fp32 attention, peak lr 0.4 "
             "(held out)", changes={**L4, "attn_dtype": "float32", "lr": 0.4},
             expect="diverging"),
    Scenario("l4_qknorm_lr01", "4 layers d 128: QK-norm, peak lr 0.1 (held out)",
             base="healthy", changes={**L4, "lr": 0.1}, expect="healthy"),
    Scenario("l4_qknorm_lr005_s1", "4 layers d 128: QK-norm, peak lr 0.05, seed 1 (held out)",
             base="healthy", changes={**L4, "lr": 0.05, "seed": 1}, expect="healthy"),
    Scenario("l4_fp32_lr005", "4 layers d 128: no QK-norm, fp32 attention, peak lr 0.05 "
             "(held out)", changes={**L4, "attn_dtype": "float32", "lr": 0.05},
             expect="healthy"),
    Scenario("l4_bf16_lr005_s1", "4 layers d 128: no QK-norm, bf16 attention, peak lr 0.05, "
             "seed 1 (held out)", changes={**L4, "attn_dtype": "float32", "lr": 0.05, "seed": 1},
             autocast="bfloat16", expect="healthy"),
]
BY_NAME = {s.name: s for s in SCENARIOS}


def _setting(sc: Scenario) -> Any:
    from logitwatch.demo.train import SETTINGS, DemoSetting

    base = dataclasses.replace(SETTINGS[sc.base], name=sc.name, description=sc.mechanism,
                               **sc.changes)
    if not sc.lr_steps:
        return base

    @dataclass(frozen=True)
    class Scheduled(DemoSetting):
        lr_steps: tuple[tuple[int, float], ...] = ()

        def lr_at(self, step: int, total: int | None = None) -> float:
            factor = 1.0
            for start, f in self.lr_steps:
                if step >= start:
                    factor = f
            return super().lr_at(step, total) * factor

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return Scheduled(**fields, lr_steps=sc.lr_steps)


class _Recorder:
    """Stands where a :class:`logitwatch.Client` stands for the hooks and keeps each frame
    exactly as the client would put it on the wire (``logitwatch.wire``)."""

    project = "default"
    rank = 0

    def __init__(self, run: str) -> None:
        self.run = run
        self.frames: list[dict[str, Any]] = []
        self.control: dict[str, Any] = {}

    def send(self, step: int, scalars: Any, heads: Any, time: float | None = None,
             history: Any = None) -> None:
        from logitwatch.wire import encode_float

        self.frames.append({
            "run": self.run, "project": self.project, "rank": self.rank,
            "seq": len(self.frames) + 1, "step": int(step),
            "time": float(time if time is not None else _time_now()),
            "scalars": {str(k): encode_float(float(v)) for k, v in scalars.items()},
            "heads": {str(k): [[encode_float(float(x)) for x in row] for row in m]
                      for k, m in heads.items()},
        })
        if history is not None:  # the steps since the previous frame (logitwatch.wire)
            self.frames[-1]["history"] = {
                "steps": [int(s) for s in history["steps"]],
                "scalars": {str(k): [None if v is None else encode_float(float(v)) for v in vs]
                            for k, vs in history["scalars"].items()}}

    def on_alert(self, callback: Any) -> Any:
        return callback

    def flush(self, timeout: float) -> bool:
        return True

    def shutdown(self, timeout: float = 10.0) -> None:
        pass


def _time_now() -> float:
    return time.time()


def _autocast_forward(model: Any, dtype: Any) -> None:
    """Run ``model``'s forward (and so its loss) under ``torch.autocast("cpu", dtype)``.

    The demo's ``train`` calls ``model(x, y)`` then ``loss.backward()``, so this is the usual
    mixed-precision recipe: forward in autocast, backward outside it. Under CPU autocast the
    linear layers and ``scaled_dot_product_attention`` run in ``dtype``.
    """
    import torch

    forward = model.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast_forward


def record(name: str, out: Path = OUT) -> dict[str, Any]:
    """Train scenario ``name`` with the real hooks; write ``out/<name>.jsonl``; return its
    header."""
    import torch

    import logitwatch
    from logitwatch.demo.train import train

    sc = BY_NAME[name]
    torch.set_num_threads(1)
    client = _Recorder(name)
    frames = client.frames
    setting = _setting(sc)
    state: dict[str, Any] = {}

    def on_model(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        state["model"] = model
        if sc.autocast is not None:
            _autocast_forward(model, getattr(torch, sc.autocast))
        extra: dict[str, Any] = {}
        if "overhead_budget" in inspect.signature(logitwatch.attach).parameters:
            extra["overhead_budget"] = None  # a fixed 1-in-10 sampling, like every scenario
        state["mon"] = logitwatch.attach(model, opt, run=name, client=client,
                                         sample_every=SAMPLE_EVERY,
                                         max_grad_norm=setting.max_norm, **extra)
        if sc.grad_spike is not None:
            at, factor = sc.grad_spike

            def spike(grad: torch.Tensor) -> torch.Tensor:
                return grad * factor if state.get("step") == at else grad

            for p in model.parameters():
                p.register_hook(spike)

    def on_loss(loss: torch.Tensor) -> None:
        state["mon"].log(loss=loss)

    def on_step(step: int, loss: float) -> None:
        state["step"] = step + 1
        if sc.head_drift is not None and step >= sc.head_drift[0]:
            with torch.no_grad():
                state["model"].head.weight.mul_(1.0 + sc.head_drift[1])

    state["step"] = 0
    t0 = time.perf_counter()
    result = train(setting, steps=sc.steps, on_model=on_model, on_loss=on_loss,
                   on_step=on_step, log=lambda m: None)
    state["mon"].close(timeout=30)
    frames.sort(key=lambda f: (f["rank"], f["seq"]))
    header = {
        "scenario": name,
        "label": outcome(result.losses, result.divergence_step),
        "regression": round(regression(result.losses), 4),
        "divergence_step": result.divergence_step,
        "expected": sc.expect,
        "mechanism": sc.mechanism,
        "setting": dataclasses.asdict(setting),
        "autocast": sc.autocast,
        "steps_done": result.steps_done,
        "sample_every": SAMPLE_EVERY,
        "frames": len(frames),
        "wall_s": round(time.perf_counter() - t0, 1),
        # every step's loss, for the peer detectors that watch each step (bench_alerts.py)
        "losses": [float(f"{x:.5g}") if math.isfinite(x) else str(x) for x in result.losses],
    }
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.jsonl", "w") as fh:
        fh.write(json.dumps(header) + "\n")
        for f in frames:
            fh.write(json.dumps(_compact(f), separators=(",", ":")) + "\n")
    return header


def _compact(frame: dict[str, Any]) -> dict[str, Any]:
    """Round floats to 5 significant digits (the files stay small; float32 has ~7)."""

    def r(v: Any) -> Any:
        return float(f"{v:.5g}") if isinstance(v, float) else v

    out = dict(frame)
    out["scalars"] = {k: r(v) for k, v in frame["scalars"].items()}
    out["heads"] = {k: [[r(x) for x in row] for row in m] for k, m in frame["heads"].items()}
    return out


def relabel(where: Path) -> int:
    """Rewrite the header label (and regression) of every file in ``where``."""
    files = sorted(where.glob("*.jsonl"))
    if not files:
        print(f"no recorded scenarios in {where}", file=sys.stderr)
        return 1
    for path in files:
        head, _, rest = path.read_text().partition("\n")
        h = json.loads(head)
        losses = [float(x) for x in h["losses"]]
        old = h["label"]
        h["label"] = outcome(losses, h["divergence_step"])
        h["regression"] = round(regression(losses), 4)
        sc = BY_NAME.get(h["scenario"])
        if sc is not None:
            h["expected"] = sc.expect
        path.write_text(json.dumps(h) + "\n" + rest)
        print(f"{h['scenario']:20s} {old:10s} -> {h['label']:10s} "
              f"(ends {h['regression']:.3f} nat above its best)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--out", type=Path, default=OUT,
                   help=f"where to write the files (default {OUT})")
    p.add_argument("--relabel", action="store_true",
                   help="recompute the label of every recorded file in --out and exit")
    a = p.parse_args(argv)
    if a.relabel:
        return relabel(a.out)
    if a.list:
        for s in SCENARIOS:
            print(f"{s.name:20s} {s.expect:10s} {s.mechanism}")
        return 0
    names = a.names or [s.name for s in SCENARIOS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; see --list")
    run: Callable[[str, Path], dict[str, Any]] = record
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for h in pool.map(run, names, [a.out] * len(names)):
            flag = "" if h["label"] == h["expected"] else f"  (meant {h['expected']})"
            print(f"{h['scenario']:20s} {h['label']:10s} divergence {h['divergence_step']!s:>5} "
                  f"steps {h['steps_done']:5d} frames {h['frames']:4d} {h['wall_s']:6.1f}s"
                  f"{flag}", flush=True)
    print(f"recorded {len(names)} scenario(s) into {a.out} in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
