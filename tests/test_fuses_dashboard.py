"""A fuse applied and undone with one click (docs/FUSES.md): a real collector (uvicorn), a
real job (a tiny torch model attached with QK-clip in suggest mode, training in a thread)
and headless Chromium.

Rank 1 of the run is seeded with frames whose head (1, 2) climbs until an attention-logit
alert fires; the alert stores the fuse that addresses it (``evidence.fuses``) and shows
what the job (rank 0) says of it. A click on "apply QK-clip" sets ``control.fuses`` for
the run; the job acts on the next ingest answer (clipping its heads, ``fuse.qk_clip.state``
2 on the charts); the card shows who applied it and at which step; "undo" puts the job's
weights back. ``logitwatch alerts --json`` carries the same. A read token cannot apply.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from click.testing import CliRunner
from test_dashboard import frames
from test_dashboard import tab as tab  # noqa: F401  (fixture)
from test_fuses import IDS, Net

from logitwatch.cli import main as cli
from logitwatch.hooks import attach
from logitwatch.hooks.fuses import QKClip
from tests.dashboard_tools import WAIT_MS, Collector, ingest

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_torch_thread")]


def wait_for(what: Any, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Job(threading.Thread):
    """A training job on a tiny model (lr 0: only the fuse changes its weights)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.model = Net(layers=2)  # 2 layers x 4 heads, as the seeded frames
        self.w0 = self.model.blocks[0].c_attn.weight.detach().clone()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.0)
        self.mon = attach(self.model, self.opt, run="dash-run", project="browser-test",
                          url=url, sample_every=1, overhead_budget=None, lm_head=False,
                          fuses=[QKClip(tau=1.0)])  # suggest: acts once applied
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            loss = self.model(IDS)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            self.mon.client.flush(5.0)
            time.sleep(0.05)
        self.mon.close()


def test_apply_and_undo_a_fuse_from_the_alert(tmp_path: Path, rising_rule: None,
                                              tab: Any) -> None:  # noqa: F811
    server = Collector(tmp_path / "x.db")
    job = None
    try:
        url = server.url
        seeded = [dict(f, rank=1) for f in frames(range(15), {(1, 2): 6})]
        ingest(url, seeded)
        job = Job(url)
        job.start()
        run_id = httpx.get(f"{url}/api/v1/runs", params={"name": "dash-run"}).json()[0]["id"]
        alerts = f"{url}/api/v1/runs/{run_id}/alerts"

        def logit_alert() -> dict | None:
            for a in httpx.get(alerts).json():
                if a["rule"].startswith("attn_logit") and a.get("fuses"):
                    if a["fuses"][0]["job"] == "suggesting":
                        return a
            return None

        alert = wait_for(logit_alert)
        assert alert["evidence"]["fuses"] == ["qk_clip", "qk_norm", "soft_cap"]
        assert alert["fuses"][0]["control"] is None and not job.mon.fuses["qk_clip"].engaged

        tab.goto(f"{url}/runs/{run_id}")
        card = tab.locator(f"[data-id='{alert['id']}']").first
        card.wait_for(timeout=WAIT_MS)
        if card.evaluate("n => n.tagName") == "DETAILS":  # a folded card: open it
            card.locator("summary").first.click()
        apply = tab.locator("button.fuse-apply", has_text="apply QK-clip").first
        apply.wait_for(timeout=WAIT_MS)
        apply.click()
        tab.wait_for_selector("button.fuse-undo", timeout=WAIT_MS)
        wait_for(lambda: job.mon.fuses["qk_clip"].engaged)  # the job acted on the answer
        clip = [e for e in job.mon.fuses.events if e.action == "apply"]
        assert clip and clip[0].detail["by"] == "control"
        assert not torch.allclose(job.model.blocks[0].c_attn.weight.detach(), job.w0)
        # on the charts: the job's own series say it acts
        series = f"{url}/api/v1/runs/{run_id}/series"
        wait_for(lambda: 2.0 in [v for v in httpx.get(series, params={
            "name": "fuse.qk_clip.state"}).json()["values"] if isinstance(v, float)])
        # in the alert: what was asked, by whom, at which step
        got = wait_for(lambda: next((a for a in httpx.get(alerts).json()
                                     if a["id"] == alert["id"]
                                     and a["fuses"][0]["job"] == "acting"), None))
        f = got["fuses"][0]
        assert f["control"] == "apply" and f["actions"][-1]["action"] == "apply"
        assert f["actions"][-1]["alert_id"] == alert["id"] and f["actions"][-1]["by"] == "open"
        assert "fuse QK-clip" in tab.locator(".fuse-state").first.inner_text()
        assert "applied" in tab.locator(".fuse-state").first.inner_text()

        tab.locator("button.fuse-undo").first.click()
        wait_for(lambda: not job.mon.fuses["qk_clip"].engaged)
        assert job.mon.fuses.events[-1].action == "undo"
        wait_for(lambda: tab.locator("button.fuse-apply").count() > 0)
        assert not tab.errors
    finally:
        if job is not None:
            job.stop.set()
            job.join(20)
        server.stop()
    torch.testing.assert_close(job.model.blocks[0].c_attn.weight.detach(), job.w0,
                               rtol=1e-5, atol=1e-6)  # lr 0: undo restores the weights
    out = CliRunner().invoke(cli, ["alerts", "--run", "dash-run", "--json", "--db",
                                   f"sqlite:///{tmp_path / 'x.db'}"])
    assert out.exit_code == 0, out.output
    import json

    listed = json.loads(out.stdout)
    mine = next(a for a in listed if a["id"] == alert["id"])
    assert [e["action"] for e in mine["fuses"][0]["actions"]] == ["apply", "undo"]


def test_applying_a_fuse_needs_an_ingest_token_of_the_run(tmp_path: Path) -> None:
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, migrate, session_scope
    from logitwatch.server.store.tokens import create_token

    db = f"sqlite:///{tmp_path / 't.db'}"
    engine = make_engine(db)
    migrate(engine)
    with session_scope(sessionmaker(engine)) as s:
        ingest_a = create_token(s, project="alpha", scope="ingest").secret
        ingest_b = create_token(s, project="beta", scope="ingest").secret
        read_a = create_token(s, project="alpha", scope="read").secret
    engine.dispose()
    server = Collector(tmp_path / "t.db")
    try:
        url = server.url
        frame = {"run": "r", "seq": 0, "step": 0, "time": time.time(),
                 "scalars": {"loss": 1.0, "fuse.qk_clip.state": 1.0}}
        r = httpx.post(f"{url}/api/v1/ingest", json={"frames": [frame]},
                       headers={"Authorization": f"Bearer {ingest_a}"})
        assert r.status_code == 200 and "fuses" not in r.json()["control"]
        body = {"fuse": "qk_clip", "action": "apply"}
        post = f"{url}/api/v1/runs/r/fuses"
        assert httpx.post(post, json=body).status_code == 401
        assert httpx.post(post, json=body, headers={
            "Authorization": f"Bearer {read_a}"}).status_code == 403
        assert httpx.post(post, json=body, headers={
            "Authorization": f"Bearer {ingest_b}"}).status_code == 404  # another project
        assert httpx.post(post, json={"fuse": "nope", "action": "apply"}, headers={
            "Authorization": f"Bearer {ingest_a}"}).status_code == 422
        r = httpx.post(post, json=body, headers={"Authorization": f"Bearer {ingest_a}"})
        assert r.status_code == 200, r.text
        assert r.json()["fuses"] == {"qk_clip": "apply"}
        assert r.json()["job"] == {"qk_clip": "suggesting"}
        frame = dict(frame, seq=1, step=1)
        r = httpx.post(f"{url}/api/v1/ingest", json={"frames": [frame]},
                       headers={"Authorization": f"Bearer {ingest_a}"})
        assert r.json()["control"]["fuses"] == {"qk_clip": "apply"}  # to the job
    finally:
        server.stop()
