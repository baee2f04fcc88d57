"""One demo training job: ``python -m logitwatch.demo.job --setting unstable --url URL``.

Trains the tiny demo transformer with logitwatch attached (with the setting's fuses, if it
has any), prints progress, every alert the collector sends back and the first action of
each kind a fuse takes, and writes a JSON summary (``--result``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--setting", required=True, choices=["unstable", "fused", "healthy"])
    p.add_argument("--url", default=None, help="collector URL (none: measure only)")
    p.add_argument("--run", default=None, help="run name (default: demo-<setting>)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-every", type=int, default=10)
    p.add_argument("--result", type=Path, default=None, help="write a JSON summary here")
    a = p.parse_args(argv)

    import torch

    import logitwatch
    from logitwatch.demo.train import SETTINGS, train

    torch.set_num_threads(1)
    setting = SETTINGS[a.setting]
    if a.seed != setting.seed:
        from dataclasses import replace

        setting = replace(setting, seed=a.seed)
    run = a.run or f"demo-{a.setting}"
    tag = f"[{a.setting}]"
    state: dict[str, Any] = {"monitor": None, "first_alert": None, "events": 0,
                             "said": set()}

    def log(msg: str) -> None:
        print(f"{tag} {msg}", flush=True)

    def on_alert(alert: dict[str, Any]) -> None:
        if state["first_alert"] is None:
            state["first_alert"] = alert
        log(f"ALERT from the collector: {alert.get('message')}")

    def on_model(model: Any, optimizer: Any) -> None:
        mon = logitwatch.attach(model, optimizer, run=run, url=a.url,
                                sample_every=a.sample_every, max_grad_norm=setting.grad_clip,
                                fuses=setting.fuses)
        mon.client.on_alert(on_alert)
        state["monitor"] = mon

    def on_loss(loss: Any) -> None:
        state["monitor"].log(loss=loss)  # the one extra line a non-HF training loop needs

    def on_step(step: int, loss: float) -> None:
        events = state["monitor"].fuses.events
        if len(events) == state["events"]:
            return
        for e in list(events)[state["events"]:]:
            if (e.fuse, e.action) not in state["said"]:  # the first of each kind
                state["said"].add((e.fuse, e.action))
                log(f"fuse {e.fuse}: {_describe(e.as_dict())}")
        state["events"] = len(events)

    t0 = time.time()
    result = train(setting, steps=a.steps, on_model=on_model, on_loss=on_loss,
                   on_step=on_step if setting.fuses else None, log=log)
    mon = state["monitor"]
    fuses = fuse_summary([e.as_dict() for e in mon.fuses.events]) if setting.fuses else None
    if mon is not None:
        mon.close(timeout=30)
    summary = {
        "setting": a.setting,
        "run": run,
        "steps": result.steps_done,
        "divergence_step": result.divergence_step,
        "first_alert_step": (state["first_alert"] or {}).get("fired_step"),
        "final_loss": result.losses[-1] if result.losses else None,
        "final_loss_50": (sum(result.losses[-50:]) / len(result.losses[-50:])
                          if result.losses else None),
        "fuses": fuses,
        "wall_s": round(time.time() - t0, 2),
    }
    log("done: " + json.dumps(summary))
    if a.result:
        a.result.write_text(json.dumps(summary))
    return 0


def _describe(e: dict[str, Any]) -> str:
    """One event in words (its step and action, then the details that matter)."""
    what = {"clip": "clipped {heads} head-step(s) over {steps} step(s), smallest factor "
                    "{factor_min:.3g}",
            "backoff": "lr x{factor:g}, back over {steps} steps ({reason})",
            "rollback": "rolled back to the state of step {to_step} ({reason})",
            }.get(e["action"])
    try:
        detail = what.format(**e) if what else ""
    except (KeyError, ValueError, TypeError):
        detail = ""
    return f"{e['action']} at step {e['step']}" + (f": {detail}" if detail else "")


def fuse_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the fuses did, from their events: steps with a clip (and the first and last),
    LR backoffs started, rollbacks (at step -> to step)."""
    clips = [e for e in events if e["action"] == "clip"]
    return {
        "clip_steps": sum(int(e.get("steps", 1) or 1) for e in clips),
        "first_clip": clips[0]["step"] if clips else None,
        "last_clip": clips[-1]["step"] if clips else None,
        "backoffs": sum(e["action"] == "backoff" for e in events),
        "rollbacks": [[e["step"], e.get("to_step")] for e in events
                      if e["action"] == "rollback"],
    }


if __name__ == "__main__":
    sys.exit(main())
