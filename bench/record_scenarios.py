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
half (:func:`assign_splits`; the header's ``split``); bench_alerts.py reports them apart.

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
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario_labels import excursions, injected_steps, label, regression, stop_reason  # noqa: E402
from scenario_models import RunSpec, train  # noqa: E402
from scenario_specs import SCENARIOS, Scenario  # noqa: E402
from scenario_specs_fresh import FRESH  # noqa: E402
from scenario_specs_fresh2 import FRESH2  # noqa: E402
from scenario_specs_fresh3 import FRESH3  # noqa: E402
from scenario_specs_fresh4 import FRESH4  # noqa: E402
from scenario_specs_fresh5 import FRESH5  # noqa: E402
from scenario_specs_fresh6 import FRESH6  # noqa: E402
from scenario_specs_fresh7 import FRESH7  # noqa: E402
from scenario_specs_fresh8 import FRESH8  # noqa: E402
from scenario_specs_fresh9 import FRESH9  # noqa: E402
from scenario_specs_fresh10 import FRESH10  # noqa: E402
from scenario_specs_fresh11 import FRESH11  # noqa: E402
from scenario_specs_fresh12 import FRESH12  # noqa: E402
from scenario_specs_fresh13 import FRESH13  # noqa: E402
from scenario_specs_fresh14 import FRESH14  # noqa: E402
from scenario_specs_fresh15 import FRESH15  # noqa: E402
from scenario_specs_fresh16 import FRESH16  # noqa: E402
from scenario_specs_fresh17 import FRESH17  # noqa: E402
from scenario_specs_fresh18 import FRESH18  # noqa: E402
from scenario_specs_fresh19 import FRESH19  # noqa: E402
from scenario_specs_fresh20 import FRESH20  # noqa: E402
from scenario_specs_fresh21 import FRESH21  # noqa: E402
from scenario_specs_fresh22 import FRESH22  # noqa: E402
from scenario_specs_fresh23 import FRESH23  # noqa: E402
from scenario_specs_fresh24 import FRESH24  # noqa: E402
from scenario_specs_fresh25 import FRESH25  # noqa: E402
from scenario_specs_fresh26 import FRESH26  # noqa: E402
from scenario_specs_fresh27 import FRESH27  # noqa: E402
from scenario_specs_fresh28 import FRESH28  # noqa: E402
from scenario_specs_fresh29 import FRESH29  # noqa: E402
from scenario_specs_fresh30 import FRESH30  # noqa: E402
from scenario_specs_fresh31 import FRESH31  # noqa: E402
from scenario_specs_fresh32 import FRESH32  # noqa: E402
from scenario_specs_fresh33 import FRESH33  # noqa: E402
from scenario_specs_fresh34 import FRESH34  # noqa: E402
from scenario_specs_fresh35 import FRESH35  # noqa: E402
from scenario_specs_fresh36 import FRESH36  # noqa: E402
from scenario_specs_fresh37 import FRESH37  # noqa: E402
from scenario_specs_fresh38 import FRESH38  # noqa: E402
from scenario_specs_fresh39 import FRESH39  # noqa: E402
from scenario_specs_fresh40 import FRESH40  # noqa: E402
from scenario_specs_fresh41 import FRESH41  # noqa: E402
from scenario_specs_fresh42 import FRESH42  # noqa: E402
from scenario_specs_fresh43 import FRESH43  # noqa: E402
from scenario_specs_fresh44 import FRESH44  # noqa: E402
from scenario_specs_fresh45 import FRESH45  # noqa: E402
from scenario_specs_fresh46 import FRESH46  # noqa: E402
from scenario_specs_fresh47 import FRESH47  # noqa: E402
from scenario_specs_fresh48 import FRESH48  # noqa: E402
from scenario_specs_fresh49 import FRESH49  # noqa: E402
from scenario_specs_fresh50 import FRESH50  # noqa: E402
from scenario_specs_fresh51 import FRESH51  # noqa: E402
from scenario_specs_fresh52 import FRESH52  # noqa: E402
from scenario_specs_fresh53 import FRESH53  # noqa: E402
from scenario_specs_fresh54 import FRESH54  # noqa: E402
from scenario_specs_fresh55 import FRESH55  # noqa: E402
from scenario_specs_fresh56 import FRESH56  # noqa: E402
from scenario_specs_fresh57 import FRESH57  # noqa: E402
from scenario_specs_fresh58 import FRESH58  # noqa: E402
from scenario_specs_fresh59 import FRESH59  # noqa: E402
from scenario_specs_fresh60 import FRESH60  # noqa: E402
from scenario_specs_fresh61 import FRESH61  # noqa: E402
from scenario_specs_fresh62 import FRESH62  # noqa: E402
from scenario_specs_fresh63 import FRESH63  # noqa: E402
from scenario_specs_fresh64 import FRESH64  # noqa: E402
from scenario_specs_fresh65 import FRESH65  # noqa: E402
from scenario_specs_fresh66 import FRESH66  # noqa: E402
from scenario_specs_fresh67 import FRESH67  # noqa: E402
from scenario_specs_fresh68 import FRESH68  # noqa: E402
from scenario_specs_fresh69 import FRESH69  # noqa: E402
from scenario_specs_fresh70 import FRESH70  # noqa: E402
from scenario_specs_fresh71 import FRESH71  # noqa: E402
from scenario_specs_fresh72 import FRESH72  # noqa: E402
from scenario_specs_fresh73 import FRESH73  # noqa: E402
from scenario_specs_fresh74 import FRESH74  # noqa: E402
from scenario_specs_fresh75 import FRESH75  # noqa: E402
from scenario_specs_fresh76 import FRESH76  # noqa: E402
from scenario_specs_fresh77 import FRESH77  # noqa: E402
from scenario_specs_fresh78 import FRESH78  # noqa: E402
from scenario_specs_fresh79 import FRESH79  # noqa: E402
from scenario_specs_fresh80 import FRESH80  # noqa: E402
from scenario_specs_fresh81 import FRESH81  # noqa: E402
from scenario_specs_fresh82 import FRESH82  # noqa: E402
from scenario_specs_fresh83 import FRESH83  # noqa: E402
from scenario_specs_fresh84 import FRESH84  # noqa: E402
from scenario_specs_fresh85 import FRESH85  # noqa: E402
from scenario_specs_fresh86 import FRESH86  # noqa: E402
from scenario_specs_long1 import LONG1  # noqa: E402
from scenario_specs_long2 import LONG2  # noqa: E402
from scenario_specs_qkclip1 import QKCLIP1  # noqa: E402
from scenario_specs_qkclip2 import QKCLIP2  # noqa: E402
from scenario_specs_qkclip3 import QKCLIP3  # noqa: E402

OUT = Path(__file__).resolve().parent / "scenarios"
SUFFIX = ".jsonl.gz"

#: the held-out sets, each fixed and recorded after the one before it had been read, in the
#: order they were fixed: each is its own split, named by its key (a new set: one entry here)
HELD_OUT: dict[str, list[Scenario]] = {
    "fresh": FRESH, "fresh2": FRESH2, "fresh3": FRESH3, "fresh4": FRESH4, "fresh5": FRESH5,
    "fresh6": FRESH6, "fresh7": FRESH7, "fresh8": FRESH8, "fresh9": FRESH9, "fresh10": FRESH10,
    "fresh11": FRESH11, "fresh12": FRESH12, "fresh13": FRESH13, "fresh14": FRESH14,
    "fresh15": FRESH15, "fresh16": FRESH16, "fresh17": FRESH17, "fresh18": FRESH18,
    "fresh19": FRESH19, "fresh20": FRESH20, "fresh21": FRESH21,
    "fresh22": FRESH22, "fresh23": FRESH23, "fresh24": FRESH24,
    "fresh25": FRESH25, "fresh26": FRESH26, "fresh27": FRESH27,
    "fresh28": FRESH28, "fresh29": FRESH29, "fresh30": FRESH30, "fresh31": FRESH31,
    "fresh32": FRESH32, "fresh33": FRESH33,
    "fresh34": FRESH34, "fresh35": FRESH35, "fresh36": FRESH36,
    "fresh37": FRESH37, "fresh38": FRESH38, "fresh39": FRESH39,
    "fresh40": FRESH40, "fresh41": FRESH41,
    "fresh42": FRESH42, "fresh43": FRESH43, "fresh44": FRESH44,
    "fresh45": FRESH45, "fresh46": FRESH46, "fresh47": FRESH47,
    "fresh48": FRESH48, "fresh49": FRESH49, "fresh50": FRESH50, "fresh51": FRESH51,
    "fresh52": FRESH52, "long1": LONG1, "long2": LONG2, "fresh53": FRESH53,
    "fresh54": FRESH54, "fresh55": FRESH55,
    "fresh56": FRESH56, "fresh57": FRESH57, "fresh58": FRESH58,
    "fresh59": FRESH59, "fresh60": FRESH60, "fresh61": FRESH61,
    "fresh62": FRESH62, "fresh63": FRESH63, "fresh64": FRESH64,
    "fresh65": FRESH65, "fresh66": FRESH66, "fresh67": FRESH67,
    "fresh68": FRESH68, "fresh69": FRESH69,
    "fresh70": FRESH70, "fresh71": FRESH71, "fresh72": FRESH72,
    "fresh73": FRESH73, "fresh74": FRESH74,
    "fresh75": FRESH75, "fresh76": FRESH76, "fresh77": FRESH77,
    "fresh78": FRESH78, "fresh79": FRESH79, "qkclip1": QKCLIP1,
    "qkclip2": QKCLIP2, "fresh80": FRESH80, "fresh81": FRESH81,
    "qkclip3": QKCLIP3, "fresh82": FRESH82, "fresh83": FRESH83,
    "fresh84": FRESH84, "fresh85": FRESH85, "fresh86": FRESH86}
ALL: list[Scenario] = [*SCENARIOS, *(s for runs in HELD_OUT.values() for s in runs)]
BY_NAME = {s.name: s for s in ALL}


# -- the split ----------------------------------------------------------------------------


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def assign_splits(scenarios: list[Scenario]) -> dict[str, str]:
    """``{name: "tune" | "holdout"}``, fixed by the names and specs alone, never by results.

    Stratified by (mechanism group, family): within each stratum the scenarios are ordered
    by the SHA-256 of their name and dealt alternately to the two halves; the stratum's
    first card goes to the half that has received fewer so far (ties: tune), so strata of
    odd size do not all favour one half.
    """
    strata: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in scenarios:
        strata[(s.group, s.spec.family)].append(s.name)
    out: dict[str, str] = {}
    counts = {"tune": 0, "holdout": 0}
    for key in sorted(strata):
        names = sorted(strata[key], key=_hash)
        first = "tune" if counts["tune"] <= counts["holdout"] else "holdout"
        second = "holdout" if first == "tune" else "tune"
        for j, name in enumerate(names):
            half = first if j % 2 == 0 else second
            out[name] = half
            counts[half] += 1
    return out


SPLITS = assign_splits(SCENARIOS)
SPLITS.update({s.name: split for split, runs in HELD_OUT.items() for s in runs})
SPLIT_NAMES = ("tune", "holdout", *HELD_OUT)


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
