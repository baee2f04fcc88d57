"""One demo training job: ``python -m logitwatch.demo.job --setting unstable --url URL``.

Trains the tiny demo transformer with logitwatch attached, prints progress and every alert
the collector sends back, and writes a JSON summary (``--result``).
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
    p.add_argument("--setting", required=True, choices=["unstable", "healthy"])
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
    state: dict[str, Any] = {"monitor": None, "first_alert": None}

    def log(msg: str) -> None:
        print(f"{tag} {msg}", flush=True)

    def on_alert(alert: dict[str, Any]) -> None:
        if state["first_alert"] is None:
            state["first_alert"] = alert
        log(f"ALERT from the collector: {alert.get('message')}")

    def on_model(model: Any, optimizer: Any) -> None:
        mon = logitwatch.attach(model, optimizer, run=run, url=a.url,
                                sample_every=a.sample_every, max_grad_norm=setting.grad_clip)
        mon.client.on_alert(on_alert)
        state["monitor"] = mon

    def on_loss(loss: Any) -> None:
        state["monitor"].log(loss=loss)  # the one extra line a non-HF training loop needs

    t0 = time.time()
    result = train(setting, steps=a.steps, on_model=on_model, on_loss=on_loss, log=log)
    mon = state["monitor"]
    if mon is not None:
        mon.close(timeout=30)
    summary = {
        "setting": a.setting,
        "run": run,
        "steps": result.steps_done,
        "divergence_step": result.divergence_step,
        "first_alert_step": (state["first_alert"] or {}).get("fired_step"),
        "final_loss": result.losses[-1] if result.losses else None,
        "wall_s": round(time.time() - t0, 2),
    }
    log("done: " + json.dumps(summary))
    if a.result:
        a.result.write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
