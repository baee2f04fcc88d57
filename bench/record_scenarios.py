"""Record the alert scenario suite: real tiny-model training runs on the CPU, every step.

Each scenario trains one model family (``bench/scenario_models.py``: the demo's SDPA GPT,
HF GPT-2, HF Llama with RoPE and GQA, HF Gemma 2 with soft-capped attention, a post-LN
``nn.TransformerEncoder``) with the REAL hooks attached (``logitwatch.attach`` at
``sample_every=1``, ``overhead_budget=None``), handing frames to a recorder that stands for
the client and keeps each one exactly as the client would put it on the wire. Every step is
recorded, so the frames a job sampling one step in ``k`` would send can be derived afterwards
(``scenario_frames.derive``). One file per scenario, ``bench/scenarios/<name>.jsonl.gz``:
the first line is a header object (label, divergence step, recovered bumps, split, spec and
every step's loss, gradient norm, clip flag and learning rate), every other line one frame
in the wire format of :mod:`logitwatch.wire`, floats rounded to 5 significant digits.

The label is measured on every step's loss, never by a detector under test
(``scenario_labels.py``, :func:`label`):

* ``diverging``: the run has a *final excursion*: a step ``i`` whose loss is non-finite, or
  whose 10-step mean exceeds the lowest earlier 10-step mean by more than 1 nat, after
  which the 10-step mean never comes back within 0.5 nat of that best for the rest of the
  run. ``divergence_step`` is the first such ``i``;
* ``degraded``: no such step, but the mean of the last 100 losses is at least 0.25 nat above
  the lowest 100-step mean of the run: it lost ground it had won and did not win it back. A
  monitor should warn about such a run; bench_alerts.py counts it neither as a catch nor as
  a false alarm;
* the losses of a scenario's injected bad batches (``RunSpec.bad_data``) are cut out of the
  loss stream before its 10- and 100-step means are taken: they measure the garbage, not the model
  (zero-byte batches are trivially predictable; random tokens cost 10-14 nats on any
  model), so they neither set the best nor open or close an excursion. Whether a run hit by
  garbage diverged, or ended above its best, is read on its own data around it; a
  non-finite loss still opens an excursion wherever it is;
* ``healthy``: neither. A loss excursion that came back within 0.5 nat (bad data, an LR
  bump) is a recovered bump: listed in the header (``bumps``: ``[[start, end], ...]``, end
  = the step its 10-step mean was back), not a divergence.

Training goes on after a first excursion (it may recover) and stops at the planned end, or
once the loss has been non-finite for 10 steps, or 100 steps after a divergence that has not
recovered by then (:func:`stop_reason`).

The suite is split ONCE, before any rule is tuned on it, into a tuning half and a held-out
half, and every held-out set since is its own split (``scenario_sets.py``: the sets and
``assign_splits``; the header's ``split``); bench_alerts.py reports them apart.

Usage::

    python bench/record_scenarios.py                 # all scenarios, 2 processes
    python bench/record_scenarios.py lr_jump healthy_s0 --jobs 1
    python bench/record_scenarios.py gpt2_lr_jump_s0 --out /tmp/try   # elsewhere
    python bench/record_scenarios.py --list
    python bench/record_scenarios.py --relabel       # recompute the labels of the files
    python bench/record_scenarios.py --composition   # runs per group, family, label, split

Each run uses ``torch.set_num_threads(1)``; run it under ``nice`` on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario_labels import excursions, injected_steps, label, regression, stop_reason  # noqa: E402
from scenario_models import RunSpec, train  # noqa: E402
from scenario_sets import ALL, BY_NAME, SPLIT_NAMES, SPLITS, Scenario  # noqa: E402

OUT = Path(__file__).resolve().parent / "scenarios"
SUFFIX = ".jsonl.gz"



# -- recording ----------------------------------------------------------------------------


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

    def shutdown(self, timeout: float = 10.0, **kwargs: Any) -> None:
        pass


def _time_now() -> float:
    return time.time()


def _r(v: Any) -> Any:
    """A float rounded to 5 significant digits (float32 has ~7); other values as they are."""
    return float(f"{v:.5g}") if isinstance(v, float) and math.isfinite(v) else v


def _wire(v: float | None) -> Any:
    from logitwatch.wire import encode_float

    return None if v is None else encode_float(_r(float(v)))


def _compact(frame: dict[str, Any]) -> dict[str, Any]:
    """Round floats to 5 significant digits and the time to the millisecond (the files
    stay small)."""
    out = dict(frame)
    out["time"] = round(frame["time"], 3)
    out["scalars"] = {k: _r(v) for k, v in frame["scalars"].items()}
    out["heads"] = {k: [[_r(x) for x in row] for row in m] for k, m in frame["heads"].items()}
    return out


def header_for(sc: Scenario, loss: list[float], **extra: Any) -> dict[str, Any]:
    """The label fields of a header, measured on every step's ``loss``."""
    bad = injected_steps(sc.spec)
    div, bumps = excursions(loss, bad)
    return {"scenario": sc.name, "label": label(loss, bad), "divergence_step": div,
            "bumps": bumps, "regression": round(regression(loss, ignore=bad), 4),
            "split": SPLITS[sc.name], "group": sc.group, "family": sc.spec.family,
            "expected": sc.expect, **({"expect_alert": sc.expect_alert}
                                      if sc.expect_alert else {}), **extra}


def record(name: str, out: Path = OUT) -> dict[str, Any]:
    """Train scenario ``name`` with the real hooks at every step; write
    ``out/<name>.jsonl.gz``; return its header."""
    import torch

    import logitwatch

    sc = BY_NAME[name]
    torch.set_num_threads(1)
    client = _Recorder(name)

    def attach(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        return logitwatch.attach(model, opt, run=name, client=client,  # type: ignore[arg-type]
                                 sample_every=1, max_grad_norm=sc.spec.max_norm,
                                 overhead_budget=None)

    bad = injected_steps(sc.spec)
    res = train(sc.spec, attach=attach, should_stop=lambda losses: stop_reason(losses, bad))
    frames = sorted(client.frames, key=lambda f: (f["rank"], f["seq"]))
    for f in frames:
        f.pop("history", None)  # none at every step; derived frames get their own
    # every step's numbers, for the labels and the peer detectors (bench_alerts.py); the
    # label is measured on the stored (rounded) losses, as --relabel and the tests do
    losses = [_wire(x) for x in res.losses]
    header = header_for(
        sc, _losses({"losses": losses}), mechanism=sc.mechanism,
        spec=dataclasses.asdict(sc.spec), steps_done=res.steps_done, stop=res.stop,
        sample_every=1, frames=len(frames), wall_s=round(res.wall_s, 1),
        qk_clips=res.qk_clips, losses=losses,
        grad_norms=[_wire(x) for x in res.grad_norms], clipped=res.clipped,
        lrs=[_wire(x) for x in res.lrs])
    if sc.spec.vocab != 256:
        header["tokenizer"] = tokenizer_id(sc.spec.vocab)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}{SUFFIX}.tmp"
    with gzip.open(tmp, "wt", compresslevel=9) as fh:
        fh.write(json.dumps(header, separators=(",", ":")) + "\n")
        for f in frames:
            fh.write(json.dumps(_compact(f), separators=(",", ":")) + "\n")
    tmp.replace(out / f"{name}{SUFFIX}")
    return header


def tokenizer_id(vocab: int) -> dict[str, Any]:
    """What made a BPE run's tokens (``scenario_models.bpe_tokenizer``): the library and
    its version, and the SHA-256 of the trained tokenizer's JSON. Another ``tokenizers``
    version may train other merges from the same corpus; a re-recording whose hash differs
    trained on other ids."""
    import tokenizers
    from scenario_models import bpe_tokenizer

    return {"library": "tokenizers", "version": tokenizers.__version__, "vocab": vocab,
            "sha256": hashlib.sha256(bpe_tokenizer(vocab).to_str().encode()).hexdigest()}


def _losses(h: dict[str, Any]) -> list[float]:
    from logitwatch.wire import decode_float

    return [decode_float(x) for x in h["losses"]]


def relabel(where: Path) -> int:
    """Recompute the label fields (and split) of every file in ``where`` from its losses."""
    files = sorted(where.glob(f"*{SUFFIX}"))
    if not files:
        print(f"no recorded scenarios in {where}", file=sys.stderr)
        return 1
    for path in files:
        with gzip.open(path, "rt") as fh:
            head = fh.readline()
            rest = fh.read()
        h = json.loads(head)
        sc = BY_NAME.get(h["scenario"])
        if sc is None:
            print(f"{h['scenario']}: not a scenario of this version; left as it is")
            continue
        old = (h["label"], h["divergence_step"])
        new = {**h, **header_for(sc, _losses(h))}
        if new != h:  # a file whose header stands is left byte for byte as it is
            h = new
            with gzip.open(path, "wt", compresslevel=9) as fh:
                fh.write(json.dumps(h, separators=(",", ":")) + "\n" + rest)
        print(f"{h['scenario']:30s} {old[0]:9s} {old[1]!s:>5} -> {h['label']:9s} "
              f"{h['divergence_step']!s:>5}  ends {h['regression']:.3f} nat above its best"
              f"{'  bumps ' + str(h['bumps']) if h['bumps'] else ''}")
    return 0


def composition(where: Path) -> int:
    """Print the recorded suite's composition: runs per mechanism group, family and label,
    for each half of the split, and the names in each half."""
    headers = []
    for path in sorted(where.glob(f"*{SUFFIX}")):
        with gzip.open(path, "rt") as fh:
            headers.append(json.loads(fh.readline()))
    if not headers:
        print(f"no recorded scenarios in {where}", file=sys.stderr)
        return 1
    labels = ("diverging", "degraded", "healthy")
    fams = sorted({h["family"] for h in headers})
    print(f"{'group':20s} {'split':7s} " + " ".join(f"{f:>8s}" for f in fams)
          + "   " + " ".join(f"{lab[:4]:>5s}" for lab in labels))
    groups = sorted({h["group"] for h in headers},
                    key=lambda g: (min(labels.index(h["expected"]) for h in headers
                                       if h["group"] == g), g))
    for g in groups:
        for sp in SPLIT_NAMES:
            sel = [h for h in headers if h["group"] == g and h["split"] == sp]
            cells = []
            for f in fams:
                n = [sum(h["family"] == f and h["label"] == lab for h in sel) for lab in labels]
                cells.append("/".join(map(str, n)) if any(n) else "-")
            print(f"{g:20s} {sp:7s} " + " ".join(f"{c:>8s}" for c in cells) + "   "
                  + " ".join(f"{sum(h['label'] == lab for h in sel):5d}" for lab in labels))
    for sp in SPLIT_NAMES:
        sel = [h for h in headers if h["split"] == sp]
        print(f"{'all':20s} {sp:7s} " + " ".join(
            f"{sum(h['family'] == f for h in sel):8d}" for f in fams) + "   "
            + " ".join(f"{sum(h['label'] == lab for h in sel):5d}" for lab in labels))
    print("(cells: diverging/degraded/healthy runs of that family)")
    for sp in SPLIT_NAMES:
        names = sorted(h["scenario"] for h in headers if h["split"] == sp)
        print(f"\n{sp} ({len(names)}): {', '.join(names)}")
    return 0


def _progress_line(h: dict[str, Any]) -> str:
    flag = "" if h["label"] == h["expected"] else f"  (meant {h['expected']})"
    return (f"{h['scenario']:30s} {h['family']:6s} {h['label']:9s} divergence "
            f"{h['divergence_step']!s:>5} steps {h['steps_done']:5d} {h['wall_s']:6.1f}s"
            f"{flag}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--out", type=Path, default=OUT,
                   help=f"where to write the files (default {OUT})")
    p.add_argument("--relabel", action="store_true",
                   help="recompute the label of every recorded file in --out and exit")
    p.add_argument("--composition", action="store_true",
                   help="print the recorded suite's runs per group, family, label and split")
    a = p.parse_args(argv)
    if a.relabel:
        return relabel(a.out)
    if a.composition:
        return composition(a.out)
    if a.list:
        for s in ALL:
            print(f"{s.name:30s} {s.spec.family:6s} {SPLITS[s.name]:7s} {s.expect:9s} "
                  f"{s.group:18s} {s.mechanism}")
        return 0
    names = a.names or [s.name for s in ALL]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; see --list")
    # longest first, so the two processes finish together
    names.sort(key=lambda n: -BY_NAME[n].spec.steps * _cost(BY_NAME[n].spec))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for fut in as_completed([pool.submit(record, n, a.out) for n in names]):
            print(_progress_line(fut.result()), flush=True)
    print(f"recorded {len(names)} scenario(s) into {a.out} in {time.perf_counter() - t0:.0f}s")
    return 0


def _cost(spec: RunSpec) -> float:
    """Relative cost of a step (for ordering only)."""
    return spec.n_layer * spec.d_model / 128


if __name__ == "__main__":
    sys.exit(main())
