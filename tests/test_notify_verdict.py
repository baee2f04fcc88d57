"""A page says what changed before the evidence: a webhook's first line.

Two recorded runs (real tiny models, every step) go through a collector with a webhook
receiver on loopback: an early momentum-SGD warm-up catapult whose loss jumps at step 57
(shown, info) and again at 68 (paged: the second jump within 20 steps after the gradient
built up, unclipped), then calms down; and a Llama whose one random batch at step 409
lifts the loss for a step and recovers. The page's first line gives the step it paged and
why, though the alert fired as info eleven steps before and its message tells that first;
a resolve says when, and whether it had paged or recovered without paging.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings
from tests.dashboard_tools import WAIT_MS, Collector, ingest
from tests.scenario_tools import BENCH, load
from tests.webhook_tools import WebhookReceiver

CATAPULT = "f62_gpt2_plain_sgd"
OUTLIER = "f62_llama_outlier_random"


def _frames(name: str) -> list[dict[str, Any]]:
    frames_mod = load("scenario_frames")
    _, frames = frames_mod.read_run(BENCH / "scenarios" / f"{name}.jsonl.gz")
    return frames_mod.derive(frames, 1)


def _texts(hook: WebhookReceiver, rule: str, run: str) -> list[str]:
    return [b["text"] for b in hook.received
            if b["alert"]["rule"] == rule and b["alert"]["run"] == run]


def test_a_page_and_a_resolve_lead_with_what_changed(sqlite_url: str) -> None:
    with WebhookReceiver() as hook, TestClient(create_app(Settings(
            db_url=sqlite_url, webhook_url=hook.url, webhook_info=True))) as c:
        for name in (CATAPULT, OUTLIER):
            for f in _frames(name):  # one request a step, as a job sampling every step
                r = c.post("/api/v1/ingest", json={"frames": [f]})
                assert r.status_code == 200, r.text
        deadline = time.time() + 20
        while time.time() < deadline and not (
                any(x.startswith("[logitwatch] RESOLVED")
                    for x in _texts(hook, "loss_jump", CATAPULT))
                and any("recovered without paging" in x
                        for x in _texts(hook, "loss_jump", OUTLIER))):
            time.sleep(0.1)

    fired, paged, resolved = _texts(hook, "loss_jump", CATAPULT)[:3]
    # fired as info: the message, as it always was (nothing changed but the firing)
    assert fired.startswith(f"[logitwatch] FIRING info loss_jump in run {CATAPULT} "
                            f"(rank 0): {CATAPULT}: rank 0: the loss jumped")
    assert "\n" not in fired.split("\nWhat to do")[0]
    # paged eleven steps later: the first line says so, and why; the message follows
    first, rest = paged.split("\n", 1)
    assert first.startswith(f"[logitwatch] FIRING critical loss_jump in run {CATAPULT} "
                            "(rank 0): paged at step 68 (fired as info at step 57): it "
                            "jumped again at step 68: episode 2 within 20 steps")
    assert first.endswith(".") and len(first) < 400
    assert rest.startswith(f"{CATAPULT}: rank 0: the loss jumped far out of its recent range")
    assert "Escalated to critical at step 68" in rest
    # resolved: when, and that it had paged
    first, rest = resolved.split("\n", 1)
    assert first.startswith(f"[logitwatch] RESOLVED critical loss_jump in run {CATAPULT} "
                            "(rank 0): resolved at step ")
    assert first.endswith("(it paged at step 68).")
    # the outlier's bump, shown and recovered: its resolve says it never paged
    outlier = _texts(hook, "loss_jump", OUTLIER)
    assert outlier[0].startswith("[logitwatch] FIRING info loss_jump")
    first = outlier[-1].split("\n", 1)[0]
    assert first.startswith(f"[logitwatch] RESOLVED info loss_jump in run {OUTLIER} "
                            "(rank 0): resolved at step ")
    assert first.endswith(", recovered without paging.")


@pytest.mark.browser
def test_the_card_of_an_alert_that_paged_later_says_so_first(tmp_path: Path,
                                                              chromium: Any) -> None:
    """On the dashboard the catapult's card says "paged (critical) at step 68: ..." right
    under its header, before "when it fired (step 57)" and the message."""
    c = Collector(tmp_path / "x.db")
    try:
        ingest(c.url, _frames(CATAPULT)[:120])
        run_id = httpx.get(f"{c.url}/api/v1/runs", timeout=30).json()[0]["id"]
        page = chromium.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{c.url}/runs/{run_id}")
        page.wait_for_function("['1', 'error'].includes(document.body.dataset.ready)",
                               timeout=WAIT_MS)
        order = page.evaluate("""async (id) => {
            const { alertCard } = await import('/static/js/alert_card.js');
            const alerts = await (await fetch(`/api/v1/runs/${id}/alerts`)).json();
            const a = alerts.find((x) => x.rule === 'loss_jump');
            const card = alertCard(a);
            return [...card.children].map((n) => n.textContent.slice(0, 90));
        }""", run_id)
        page.close()
    finally:
        c.stop()
    assert order[1].startswith("paged (critical) at step 68: it jumped again at step 68"), order
    assert order[2].startswith("when it fired (step 57)"), order
