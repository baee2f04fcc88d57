"""``bench_fuses.py qknorm``: the demo's unstable run with the temporary QK-norm auto
(alone and with LR backoff), with soft-cap auto, without a fuse, and its healthy twin, the
float16 overflow taken from the q/k the SDPA call receives (:class:`KernelSpy`,
:func:`kernel_attention`, :func:`qknorm_run`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from fuses_common import Recorder, windows
from torch.overrides import TorchFunctionMode

from logitwatch.hooks import attach
from logitwatch.hooks.fuses import LRBackoff, QKNorm, SoftCap


class KernelSpy(TorchFunctionMode):
    """The q/k/scale of the last SDPA call as the kernel receives it. Entered around the
    whole run, so below the monitor's mode: it sees a call after a fuse rewrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[Any, Any, Any] | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            a = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                          "scale"), args, strict=False))
            a.update(kwargs)
            self.last = (a["query"], a["key"], a.get("scale"))
        return func(*args, **kwargs)


def kernel_attention(spy: KernelSpy) -> Callable[..., torch.Tensor]:
    """The demo's ``attention`` with its float16 overflow taken from the ``q``/``k`` the
    SDPA call received (the demo's own takes them before the call, so a fuse that rewrites
    the call would not change its emulated overflow). A call a fuse computed explicitly
    (soft-cap: float32 scores, capped) has no float16 scores: no overflow."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from logitwatch.demo import model as demo_model

    plain = demo_model.attention

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  attn_dtype: str) -> torch.Tensor:
        if attn_dtype != "float16":
            return plain(q, k, v, scale=scale, attn_dtype=attn_dtype)
        qh, kh, vh = q.to(torch.float16), k.to(torch.float16), v.to(torch.float16)
        spy.last = None
        backend = sdpa_kernel(SDPBackend.MATH) if q.device.type == "cpu" else nullcontext()
        with backend:
            out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                   scale=scale)
        out = out.to(torch.float32)
        if spy.last is not None:
            rq, rk, rs = spy.last
            out = out + demo_model.fp16_overflow_poison(rq, rk, rs if rs else scale)
        return out

    return attention


def qknorm_run(name: str, steps: int, make: Callable[[], list | None], seed: int
               ) -> dict[str, Any]:
    from logitwatch.demo import model as demo_model
    from logitwatch.demo.train import SETTINGS, train

    setting = dataclasses.replace(SETTINGS["healthy" if name == "healthy" else "unstable"],
                                  seed=seed)
    rec = Recorder()
    box: dict[str, Any] = {}
    spy = KernelSpy()

    def on_model(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        box["mon"] = attach(model, opt, run="bench", client=rec, sample_every=10,
                            overhead_budget=None, max_grad_norm=setting.max_norm,
                            fuses=make())

    plain = demo_model.attention
    demo_model.attention = kernel_attention(spy)
    t0 = time.perf_counter()
    try:
        with spy:
            res = train(setting, steps=steps, on_model=on_model,
                        on_loss=lambda loss: box["mon"].log(loss=loss), log=lambda _: None,
                        num_threads=1)
    finally:
        demo_model.attention = plain
        box["mon"].close()
    wall = time.perf_counter() - t0
    mon = box["mon"]
    events = [e.as_dict() for e in mon.fuses.events] if mon.fuses else []
    norm = next((f for f in mon.fuses if f.name == "qk_norm"), None) if mon.fuses else None
    cap = next((f for f in mon.fuses if f.name == "soft_cap"), None) if mon.fuses else None
    out: dict[str, Any] = {
        "run": name, "seed": seed, "steps_done": res.steps_done,
        "diverged_at": res.divergence_step,
        "final_loss": statistics.fmean(res.losses[-50:]) if res.losses else None,
        "max_logit": windows(rec.frames, "attn.logit_max"),
        "ms_per_step": round(1e3 * wall / max(1, res.steps_done), 2),
        "events": [[e["step"], e["fuse"], e["action"], e.get("layers")] for e in events
                   if e["action"] not in ("suggest",)][:40],
    }
    if norm is not None:
        out["steps_inserted"] = norm.steps_inserted
        out["steps_annealing"] = norm.steps_annealing
        out["raw_max"] = {f["step"] // 100 * 100: f["scalars"]["fuse.qk_norm.raw_max"]
                          for f in rec.frames if "fuse.qk_norm.raw_max" in f["scalars"]}
        trace = list(norm.trace)
        out["lambda"] = [[s, layer, round(lam, 4)] for s, layer, lam in trace[:: max(
            1, len(trace) // 24)]]
    if cap is not None:
        out["steps_capped"] = cap.steps_capped
        out["received_max"] = windows(rec.frames, "fuse.soft_cap.logit_max")
    return out


def qknorm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The demo's unstable run with the temporary QK-norm auto, with soft-cap auto, without
    a fuse, and its healthy twin (learned QK-norm), every run with the kernel-side overflow
    (:func:`kernel_attention`)."""
    steps = args.steps or 1200
    limit = args.tau
    plans: list[tuple[str, Callable[[], list | None]]] = [
        ("unstable, no fuse", lambda: None),
        (f"unstable, QK-norm auto (limit {limit:g})",
         lambda: [QKNorm(limit=limit, mode="auto", anneal=0.1, total_steps=steps)]),
        (f"unstable, QK-norm + LR backoff auto (limit {limit:g})",
         lambda: [QKNorm(limit=limit, mode="auto", anneal=0.1, total_steps=steps),
                  LRBackoff(mode="auto", rules=())]),
        (f"unstable, soft-cap auto (cap {limit:g})",
         lambda: [SoftCap(cap=limit, mode="auto")]),
        ("healthy", lambda: None),
    ]
    out = []
    for name, make in plans[: args.plans]:
        r = qknorm_run(name, steps, make, args.seed)
        print(json.dumps(r), flush=True)
        out.append(r)
    return out
