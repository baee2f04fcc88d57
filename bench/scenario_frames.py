"""The recorded scenarios' frames as a job sampling one step in ``k`` would send them.

Every scenario is recorded at every step (``record_scenarios.py``). A job whose hooks
sample one step in ``k`` samples step 0, then every ``k``-th step, and (with a client that
sends it) carries in each frame the scalars of the steps in between as ``history``
(``logitwatch.wire``). :func:`derive` builds exactly those frames from the recording:

* the recorded frames at the steps a 1-in-``k`` job samples (:func:`schedule`): step 0,
  then ``k`` steps after the previous sample, and the step after a learning-rate jump or
  climb past the schedule's settled peak, or after a loss or gradient-norm spike (the hooks
  sample it at once; ``spike_watch=False``: a job whose hooks cannot read those at no cost,
  such as one sharded over ranks);
* ``seq`` renumbered 1..n;
* ``optim.adaptive`` (whether the optimizer bounds a kick's update), which the hooks send
  since round fourteen: a run recorded before gets the value its optimizer's class gives
  (:func:`read_run`, from the header's ``spec.optimizer``);
* ``history``: the steps after the previous derived frame and before this one, with their
  ``loss``, ``grad.norm``, ``grad.clipped``, ``lr``, ``final.logz`` and ``final.hidden_rms``
  (wire floats; null where a step did not have the series); none on the first frame or at
  ``k = 1``. The recording's log Z pools every position of the batch, where the hooks'
  unsampled steps estimate it on 64 of them (``hooks/_final.step_final``; measured off by
  0.08-0.17 nat, standard deviation, on these models: docs/ALERTS.md);
* ``k`` may also be a function of the step, the interval in effect after a sample at that
  step (the hooks' overhead budget widens or narrows it during a run);
* the scalars that describe the sampling itself follow ``k``: ``hooks.sample_every`` = k
  (at the frame's step, or for a frame without heads at the sample before it),
  ``grad.clip_rate`` = the share of clipped steps since the previous frame (what the hooks
  count on the device between two samples), and ``hooks.overhead`` (the monitor's share
  of training time at the recorded interval) is left out;
* every ``flush_every`` (10) unsampled steps, the frame the hooks send ahead of the next
  sample (``history_every``, ``logitwatch.hooks._history_flush``): the last of those steps
  with its history scalars (no heads, ``hooks.history_flush`` = 1) and the steps before
  it as its history. A CPU job sends it at once; a CUDA job once its copy is done,
  typically a step later (not modelled: the bench's "on arrival" figures are the CPU's).
  Also at once, on a CPU job, after an unsampled step that made the LR watch sample the
  next one or that the spike watch flagged (sampled next or not: round forty-seven), with
  what was kept since the last frame;
* where the run ended between two samples, the frame ``Monitor.close()`` sends: the last
  step with its history scalars (no heads, ``hooks.closing`` = 1) and the steps before it
  since the previous frame as its history (with ``history=False`` there is none, as the
  hooks send none to a client that does not take history).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logitwatch.hooks._optim_kind import adaptive_by_name

HISTORY_SCALARS = ("loss", "grad.norm", "grad.clipped", "lr", "final.logz", "final.hidden_rms")
#: Per-sample scalars that only describe the recorded interval (dropped from derived frames).
INTERVAL_ONLY = ("hooks.overhead",)
#: The hooks' default ``history_every`` (``logitwatch.hooks._history_flush``).
FLUSH_EVERY = 10


def read_run(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Header and frames of a recorded scenario (``.jsonl.gz`` or ``.jsonl``)."""
    from logitwatch.server.alerts.replay import read_frames

    header, frames = read_frames(path)
    if header is None:
        raise ValueError(f"{path}: no header line (label, divergence_step)")
    # the hooks send ``optim.adaptive`` (whether the optimizer bounds a kick's update) since
    # round fourteen; a run recorded before gets the value its optimizer's class gives
    kind = adaptive_by_name([_OPTIMIZER_CLASS.get(str((header.get("spec") or {}).get(
        "optimizer")), "")])
    if kind is not None:
        for f in frames:
            f.setdefault("scalars", {}).setdefault("optim.adaptive", kind)
    return header, frames


#: ``RunSpec.optimizer`` -> the torch class ``build_optimizer`` makes
_OPTIMIZER_CLASS = {"adamw": "AdamW", "adam": "Adam", "rmsprop": "RMSprop", "sgd": "SGD"}


def read_header(path: str | Path) -> dict[str, Any]:
    """Only the header line of a recorded scenario (cheap: the frames are not parsed)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:  # type: ignore[operator]
        return json.loads(fh.readline())


def _clip_rate(values: list[Any]) -> float | None:
    flags = [float(v) for v in values if isinstance(v, (int, float))]
    return sum(flags) / len(flags) if flags else None


Interval = int | Callable[[int], int]


def _interval(k: Interval) -> Callable[[int], int]:
    """``k`` as a function of the step (an int: the same at every step), checked >= 1. A
    function must be pure: it is called again for the same step."""
    if callable(k):
        def at(step: int) -> int:
            v = k(step)
            if v < 1:
                raise ValueError(f"the interval at step {step} must be >= 1, got {v}")
            return v
        return at
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return lambda step: k


def derive(frames: list[dict[str, Any]], k: Interval, *, history: bool = True,
           spike_watch: bool = True, flush_every: int | None = FLUSH_EVERY,
           ) -> list[dict[str, Any]]:
    """The frames of ``frames`` (one per step, in step order) that a job sampling one step
    in ``k`` sends, as it sends them (see the module docstring). ``k`` may be a function of
    the step: the interval in effect after a sample at that step, as the hooks' overhead
    budget widens or narrows it during a run. ``history=False`` leaves the history out (a
    collector that does not take it); ``flush_every`` (the hooks' ``history_every``, None:
    off) sends the kept steps ahead of the next frame."""
    k_at = _interval(k)
    by_step = {f["step"]: f for f in frames}
    sampled, watched = _plan(frames, k_at, spike_watch=spike_watch)
    flush = flush_every if history and flush_every else None
    out: list[dict[str, Any]] = []
    prev: int | None = None  # the last sampled step
    kept: list[int] = []  # unsampled steps since the last frame sent (sampled or flush)
    for f in frames:
        step = f["step"]
        if step not in sampled:
            if prev is not None:
                kept.append(step)
            if flush is not None and kept and (len(kept) >= flush or step in watched):
                out.append(_scalars_frame(by_step[step], kept[:-1], by_step, len(out) + 1,
                                          flag="hooks.history_flush", every=k_at(prev)))
                kept = []
            continue
        between = [] if prev is None else list(range(prev + 1, step))
        g = {key: v for key, v in f.items() if key != "history"}
        scalars = {n: v for n, v in f["scalars"].items() if n not in INTERVAL_ONLY}
        if "hooks.sample_every" in scalars:
            scalars["hooks.sample_every"] = float(k_at(step))
        if "grad.clip_rate" in scalars and "grad.clipped" in scalars:
            window = [*between, step] if prev is not None else [step]
            rate = _clip_rate([by_step[s]["scalars"].get("grad.clipped")
                               for s in window if s in by_step])
            if rate is not None:
                scalars["grad.clip_rate"] = rate
        g["scalars"] = scalars
        g["seq"] = len(out) + 1
        if history and kept:
            g["history"] = _history(kept, by_step)
        kept = []
        out.append(g)
        prev = step
    last = frames[-1]["step"] if frames else None
    if history and kept and kept[-1] == last:
        out.append(_scalars_frame(frames[-1], kept[:-1], by_step, len(out) + 1,
                                  flag="hooks.closing", every=k_at(prev or 0)))
    return out


def schedule(frames: list[dict[str, Any]], k: Interval, *,
             spike_watch: bool = True) -> list[int]:
    """The steps a job sampling one step in ``k`` samples, as the hooks choose them: the
    first step, then ``k`` steps after the last sample (``k`` of that sample's step, where
    it is a function), and the step after one whose
    learning rate jumped or climbed past its settled peak (``logitwatch.hooks._lrwatch``)
    or whose loss or gradient norm spiked (``logitwatch.hooks._stepwatch``; a single-process
    job on the CPU reads them at once, an accelerator job typically a step later): the same
    code the hooks run."""
    return sorted(_plan(frames, k, spike_watch=spike_watch)[0])


def _plan(frames: list[dict[str, Any]], k: Interval, *,
          spike_watch: bool = True) -> tuple[set[int], set[int]]:
    """:func:`schedule`'s steps, and the steps whose LR watch made the hooks sample the
    next one or whose loss or gradient norm the spike watch flagged (sampled next or not,
    past its burst): a CPU job flushes the history kept up to such a step at once
    (``logitwatch.hooks._frames._flush_between(now=True)``)."""
    from logitwatch.hooks._lrwatch import LrWatch
    from logitwatch.hooks._stepwatch import StepWatch
    from logitwatch.wire import decode_float

    def num(v: Any) -> float | None:
        return None if v is None else decode_float(v)

    k_at = _interval(k)
    watch, spikes, last, force = LrWatch(), StepWatch(), None, False
    out: set[int] = set()
    watched: set[int] = set()
    for f in frames:
        step = f["step"]
        if force or last is None or step >= last + k_at(last):
            out.add(step)
            last = step
        sc = f["scalars"]
        lr = sc.get("lr")
        force = isinstance(lr, (int, float)) and watch.step(step, float(lr))
        if force:
            watched.add(step)
        if spike_watch:
            force = spikes.step(step, num(sc.get("loss")), num(sc.get("grad.norm"))) or force
            if spikes.flagged:  # anomalous: flushed at once, sampled next or not
                watched.add(step)
    return out, watched


def _history(steps: list[int], by_step: dict[int, Any]) -> dict[str, Any]:
    return {"steps": steps, "scalars": {
        name: [by_step[s]["scalars"].get(name) for s in steps]
        for name in HISTORY_SCALARS if any(name in by_step[s]["scalars"] for s in steps)}}


def _scalars_frame(f: dict[str, Any], between: list[int], by_step: dict[int, Any],
                   seq: int, *, flag: str, every: int) -> dict[str, Any]:
    """A frame without heads at ``f``'s step with its history scalars and the steps before
    it since the previous frame as its history: what ``Monitor.close()`` sends when the run
    ended between two samples (``flag`` ``hooks.closing``), and a flush of the history
    between samples (``hooks.history_flush``)."""
    g = {key: v for key, v in f.items() if key not in ("history", "scalars", "heads")}
    scalars = {n: f["scalars"][n] for n in HISTORY_SCALARS if f["scalars"].get(n) is not None}
    scalars.update({flag: 1.0, "hooks.sample_every": float(every)})
    g.update(seq=seq, heads={}, scalars=scalars)
    if between:
        g["history"] = _history(between, by_step)
    return g


def history_supported() -> bool:
    """Whether this collector's frame schema takes ``history``."""
    from logitwatch.server.schemas import FrameIn

    return "history" in FrameIn.model_fields
