"""A run's config (hyperparameters) sent by the job: ``attach(config=...)``, the HF and
Lightning callbacks, ``Client.set_config``; it arrives in ``GET /runs`` of a real uvicorn
collector, also when the collector comes up after the job started."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from logitwatch.client import Client, ClientConfig
from logitwatch.client._runconfig import MAX_CONFIG_BYTES, clean_config
from logitwatch.demo.runner import Collector, free_port
from logitwatch.hooks import attach


def run_config(url: str, name: str, timeout: float = 20.0) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while True:
        runs = httpx.get(f"{url}/api/v1/runs", timeout=10).json()
        got = next((r.get("config") for r in runs if r["name"] == name), None)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.lm_head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.lm_head(y)


def test_clean_config_keeps_json_values_within_bounds() -> None:
    body, left = clean_config({
        "lr": 3e-4, "steps": 1000, "name": "gpt", "warm": True, "none": None,
        "betas": (0.9, 0.95), "nested": {"a": 1, "obj": object()}, "nan": math.nan,
        "module": nn.Linear(2, 2), "scalar": torch.tensor(0.5), 7: "a non-str key",
    })
    assert body == {"lr": 3e-4, "steps": 1000, "name": "gpt", "warm": True, "none": None,
                    "betas": [0.9, 0.95], "nested": {"a": 1}, "scalar": 0.5,
                    "7": "a non-str key"}
    assert left == ["nan", "module"]
    big, left = clean_config({f"k{i}": i for i in range(300)} | {"blob": "x" * 900,
                                                                 "text": ["y" * 900] * 30})
    assert len(big) <= 256 and "text" in left
    assert len(str(big)) < 2 * MAX_CONFIG_BYTES
    with pytest.raises(TypeError):
        clean_config([("lr", 1)])  # type: ignore[arg-type]


def test_a_jobs_config_arrives_in_the_runs_list(tmp_path: Path) -> None:
    with Collector(f"sqlite:///{tmp_path / 'c.db'}") as col:
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        config = {"lr": 3e-4, "batch_size": 8, "model": "tiny", "betas": [0.9, 0.95],
                  "optimizer": opt}  # not JSON: left out
        mon = attach(model, opt, run="cfg", url=col.url, sample_every=2,
                     overhead_budget=None, config=config)
        for _ in range(4):
            ids = torch.randint(0, 32, (2, 8))
            loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            mon.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        mon.close()
        assert run_config(col.url, "cfg") == {"lr": 3e-4, "batch_size": 8, "model": "tiny",
                                              "betas": [0.9, 0.95]}
    with pytest.raises(TypeError, match="config must be a dict"):
        attach(Tiny(), run="x", config=[("lr", 1)])  # type: ignore[arg-type]


def test_config_is_retried_until_the_collector_comes_up(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = Client(url, run="late", config=ClientConfig(max_backoff=0.5, spool_interval=0.2,
                                                         interval=0.1))
    client.set_config({"lr": 0.1, "seed": 3})
    client.send(0, {"loss": 2.0}, {})
    time.sleep(1.0)  # nobody listens: frames and config wait
    with Collector(f"sqlite:///{tmp_path / 'c.db'}", port=port) as col:
        assert run_config(col.url, "late") == {"lr": 0.1, "seed": 3}
        client.shutdown(5.0)


def test_a_later_config_replaces_an_earlier_one(tmp_path: Path) -> None:
    """Two ``set_config`` calls while the collector is down: the second replaces the first,
    also once both would be sent (the first's sender stops before the second puts; two
    senders used to put in turn, and the older config could land last)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = Client(url, run="twice", config=ClientConfig(max_backoff=0.5, spool_interval=0.2,
                                                          interval=0.1))
    client.set_config({"lr": 0.1})
    client.send(0, {"loss": 2.0}, {})
    client.set_config({"lr": 0.2, "seed": 4})
    time.sleep(1.0)
    with Collector(f"sqlite:///{tmp_path / 'c.db'}", port=port) as col:
        assert run_config(col.url, "twice") is not None
        client.shutdown(5.0)
        time.sleep(0.5)  # anything still in flight lands
        assert run_config(col.url, "twice") == {"lr": 0.2, "seed": 4}


def test_hf_callback_sends_the_training_arguments(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from test_integrations import hf_trainer

    from logitwatch.hooks.hf import LogitwatchCallback

    with Collector(f"sqlite:///{tmp_path / 'c.db'}") as col:
        callback = LogitwatchCallback(run="hf", url=col.url, sample_every=2,
                                      overhead_budget=None, config={"data": "tiny-random"})
        hf_trainer(tmp_path, callback).train()  # type: ignore[attr-defined]
        got = run_config(col.url, "hf")
    assert got is not None
    assert got["learning_rate"] == 1e-3 and got["max_steps"] == 5
    assert got["max_grad_norm"] == 0.5 and got["data"] == "tiny-random"
    assert got["save_strategy"] == "no"  # an enum, as its value
    assert all(v is not None and not isinstance(v, (list, dict)) for v in got.values())


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_callback_sends_the_hparams(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    from test_integrations import lightning_fit

    from logitwatch.hooks.lightning import LogitwatchCallback

    with Collector(f"sqlite:///{tmp_path / 'c.db'}") as col:
        callback = LogitwatchCallback(run="pl", url=col.url, sample_every=1,
                                      overhead_budget=None)
        lightning_fit(callback, hparams={"lr": 0.1, "width": 16})
        assert run_config(col.url, "pl") == {"lr": 0.1, "width": 16}
