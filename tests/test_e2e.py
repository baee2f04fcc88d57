"""End to end, for real: hooks in a training loop -> client thread -> uvicorn collector on
loopback -> SQLite -> API, the alert path to a real local webhook receiver, and the demo."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import logitwatch  # noqa: E402
from logitwatch.demo.runner import Collector, run_jobs  # noqa: E402
from tests.webhook_tools import WebhookReceiver  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


class Attn(torch.nn.Module):
    """Causal self-attention through SDPA that also keeps an explicit eager reference."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.qkv, self.o = h, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ref_max: Any = None

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        with torch.no_grad():  # explicit eager reference: q k^T / sqrt(d), causal pairs only
            s = q @ k.transpose(-1, -2) / math.sqrt(d // self.h)
            s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            self.ref_max = s.amax(dim=(0, 2, 3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Tiny(torch.nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, h: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.attn = torch.nn.ModuleList(Attn(d, h) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx: Any) -> Any:
        x = self.emb(idx)
        for a in self.attn:
            x = x + a(x)
        return self.head(x)


def test_stored_maxima_equal_an_eager_reference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    refs: dict[int, list[list[float]]] = {}
    losses: list[float] = []
    with Collector(f"sqlite:///{tmp_path / 'e2e.db'}") as col:
        mon = logitwatch.attach(model, opt, run="e2e", url=col.url, sample_every=4,
                                max_grad_norm=1.0)
        for step in range(13):
            idx = torch.randint(0, 64, (4, 16))
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
            mon.log(loss=loss)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            refs[step] = [a.ref_max.tolist() for a in model.attn]
            losses.append(loss.item())
        mon.close(timeout=30)
        runs = httpx.get(f"{col.url}/api/v1/runs").json()
        (run,) = [r for r in runs if r["name"] == "e2e"]
        assert run["last_step"] == 12
        loss_series = httpx.get(f"{col.url}/api/v1/runs/{run['id']}/series",
                                params={"name": "loss"}).json()
        # the sampled steps 0, 4, 8, 12 and, in their frames' histories, every step between
        assert loss_series["steps"] == list(range(13))
        assert loss_series["values"] == pytest.approx(losses, rel=1e-6)
        for step in (0, 4, 8, 12):
            h = httpx.get(f"{col.url}/api/v1/runs/{run['id']}/heatmap",
                          params={"name": "attn.logit_max", "step": step}).json()
            assert h["step"] == step
            got = [x for row in h["values"] for x in row]
            want = [x for row in refs[step] for x in row]
            assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_demo_alerts_before_divergence_and_calls_the_webhook(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    with Collector(f"sqlite:///{tmp_path / 'demo.db'}", webhook_url=receiver.url) as col:
        lines: list[str] = []
        results = {r["setting"]: r for r in run_jobs(
            col.url, settings=["unstable", "fused", "healthy"], steps=None, seed=0,
            stamp="t", echo=lines.append)}
        assert receiver.got.wait(20), "the webhook never received the alert"
        runs = {r["name"]: r for r in httpx.get(f"{col.url}/api/v1/runs").json()}
        alerts = {
            name: httpx.get(f"{col.url}/api/v1/runs/{r['id']}/alerts").json()
            for name, r in runs.items()
        }
    unstable, healthy = results["unstable"], results["healthy"]
    assert unstable["divergence_step"] is not None, "the unstable demo did not diverge"
    assert healthy["divergence_step"] is None, "the healthy demo diverged"
    # the same run as the unstable one, with its fuses on auto: trained through, at its
    # healthy twin's loss or below (the backed-off lr), QK-clip acting
    fused = results["fused"]
    assert fused["divergence_step"] is None and fused["steps"] == healthy["steps"]
    assert fused["final_loss_50"] < healthy["final_loss_50"] + 0.1, (fused, healthy)
    assert fused["fuses"]["clip_steps"] > 100 and fused["fuses"]["backoffs"] > 0
    fired = min(a["fired_step"] for a in alerts["unstable-t"])
    assert fired < unstable["divergence_step"], (fired, unstable["divergence_step"])
    assert alerts["healthy-t"] == []
    # both jobs closed their monitors: finished, and no "no data" alert will follow
    assert runs["healthy-t"]["status"] == "finished"
    assert runs["unstable-t"]["status"] in ("finished", "diverged")
    # The job itself heard about it through the ingest answers (the return path).
    assert unstable["first_alert_step"] is not None
    hook = receiver.received[0]
    assert hook["alert"]["run"] == "unstable-t" and "layer" in hook["text"]


def test_fused_demo_job_reports_its_fuses_and_streams_their_series(tmp_path: Path) -> None:
    """The demo's fused job for 220 steps: its logits pass tau 50 on the way (about step
    140 for seed 0), QK-clip acts, the job says so and the fuse series reach the
    collector."""
    with Collector(f"sqlite:///{tmp_path / 'demo.db'}") as col:
        lines: list[str] = []
        (result,) = run_jobs(col.url, settings=["fused"], steps=220, seed=0, stamp="t",
                             echo=lines.append)
        (run,) = [r for r in httpx.get(f"{col.url}/api/v1/runs").json()
                  if r["name"] == "fused-t"]
        series = {name: httpx.get(f"{col.url}/api/v1/runs/{run['id']}/series",
                                  params={"name": name}).json()
                  for name in ("fuse.qk_clip.heads", "fuse.qk_clip.state", "loss")}
    fuses = result["fuses"]
    assert fuses["clip_steps"] > 0 and 100 <= fuses["first_clip"] <= fuses["last_clip"]
    assert any(line.startswith("[fused] fuse qk_clip: clip at step") for line in lines)
    assert result["divergence_step"] is None
    heads = series["fuse.qk_clip.heads"]
    assert heads["values"] and max(heads["values"]) > 0
    assert series["fuse.qk_clip.state"]["values"][-1] == 2  # acting
    assert series["loss"]["steps"][-1] == 219
