"""Reduce before sending on three real processes (gloo, DDP): rank 0 sends one frame per
sampled step with the group's per-head statistics (max and who held it, an upper-bound p99,
pooled mean/std/entropy, min entropy) and every rank's loss; the other ranks send nothing
unless the collector's control names them; requests to sample are agreed by all ranks."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
from test_hooks_ddp import NET

WORLD = 3

WORKER = NET + textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from logitwatch.hooks import attach

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    frames = []
    every = 2 if mode == "agree" else 1
    mon = attach(model, opt, run="red", sample_every=every, overhead_budget=None,
                 reduce_ranks=(mode != "plain"))

    def record(step, scalars, heads, time=None, history=None):
        frames.append({"step": step, "rank": mon.client.rank, "scalars": scalars,
                       "heads": heads})

    mon.client.send = record
    if mode == "reduce" and rank == 0:  # what a collector's answer would ask
        mon.client._control = {"detail_ranks": [2]}
    data = torch.randint(0, 16, (3, 4, 6), generator=torch.Generator().manual_seed(1))
    steps = 6 if mode == "agree" else 3
    for step in range(steps):
        ids = data[rank][:, : 6 - rank]  # other lengths and batches on each rank
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        mon.log(loss=loss)
        if mode == "agree" and rank == 1 and step == 1:
            mon.request_sample()  # one rank only, on a step outside the schedule
        loss.backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    with open(out, "w") as f:
        json.dump(frames, f)
    dist.destroy_process_group()
    import os
    sys.stdout.flush()
    os._exit(0)
''')


def _run(tmp_path, gloo_pair, mode: str) -> list[list[dict]]:
    gloo_pair(tmp_path, WORKER, lambda rank: [mode, str(tmp_path / f"{mode}{rank}.json")],
              world=WORLD)
    return [json.loads((tmp_path / f"{mode}{r}.json").read_text()) for r in range(WORLD)]


def _m(frame: dict, name: str) -> np.ndarray:
    return np.array(frame["heads"][name], dtype=np.float64)


@pytest.mark.slow
def test_reduce_before_send_on_three_ranks(tmp_path, gloo_pair) -> None:
    plain = _run(tmp_path, gloo_pair, "plain")
    red = _run(tmp_path, gloo_pair, "reduce")
    assert [f["step"] for f in red[0]] == [0, 1, 2]
    assert red[1] == []  # not asked: nothing sent
    # rank 2 was named by rank 0's control: its own frames from the next sampled step
    assert [f["step"] for f in red[2]] == [1, 2]
    for own, ref in zip(red[2], plain[2][1:], strict=True):
        assert own["heads"]["attn.logit_max"] == ref["heads"]["attn.logit_max"]
        assert "attn.logit_max_rank" not in own["heads"]
    for step, frame in enumerate(red[0]):
        refs = [plain[r][step] for r in range(WORLD)]
        stack = {n: np.stack([_m(f, n) for f in refs]) for n in refs[0]["heads"]
                 if n.startswith("attn.")}
        np.testing.assert_array_equal(_m(frame, "attn.logit_max"),
                                      stack["attn.logit_max"].max(0))
        np.testing.assert_array_equal(_m(frame, "attn.logit_max_rank"),
                                      stack["attn.logit_max"].argmax(0))
        np.testing.assert_array_equal(_m(frame, "attn.logit_p99"),
                                      stack["attn.logit_p99"].max(0))
        np.testing.assert_array_equal(_m(frame, "attn.entropy_min"),
                                      stack["attn.entropy_min"].min(0))
        # pooled over each rank's count of valid (causal) logits: t(t+1)/2 per row
        counts = np.array([4 * (6 - r) * (7 - r) / 2 for r in range(WORLD)])[:, None, None]
        mean = (stack["attn.logit_mean"] * counts).sum(0) / counts.sum()
        sq = ((stack["attn.logit_std"] ** 2 + stack["attn.logit_mean"] ** 2) * counts).sum(0)
        std = np.sqrt(sq / counts.sum() - mean**2)
        np.testing.assert_allclose(_m(frame, "attn.logit_mean"), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_m(frame, "attn.logit_std"), std, rtol=1e-4, atol=1e-5)
        rows = np.array([4 * (6 - r) for r in range(WORLD)])[:, None, None]
        ent = (stack["attn.entropy_mean"] * rows).sum(0) / rows.sum()
        np.testing.assert_allclose(_m(frame, "attn.entropy_mean"), ent, rtol=1e-5, atol=1e-6)
        losses = [f["scalars"]["loss"] for f in refs]
        np.testing.assert_allclose(frame["heads"]["ranks.loss"], [losses], rtol=1e-6)
        s = frame["scalars"]
        assert s["loss"] == pytest.approx(losses[0], rel=1e-6)  # its own, as its history
        assert s["loss.ranks_mean"] == pytest.approx(sum(losses) / WORLD, rel=1e-6)
        assert s["loss.ranks_max"] == pytest.approx(max(losses), rel=1e-6)
        assert s["loss.ranks_min"] == pytest.approx(min(losses), rel=1e-6)
        assert s["reduce.ranks"] == WORLD and s["reduce.attn_ranks"] == WORLD
        assert s["grad.norm"] == pytest.approx(refs[0]["scalars"]["grad.norm"], rel=1e-6)
        assert frame["heads"]["qk.q_weight_norm"] == refs[0]["heads"]["qk.q_weight_norm"]
    assert all(math.isfinite(v) for f in red[0] for v in f["scalars"].values())


@pytest.mark.slow
def test_a_request_on_one_rank_is_agreed_by_all(tmp_path, gloo_pair) -> None:
    frames = _run(tmp_path, gloo_pair, "agree")
    # every 2 steps; rank 1 asked during step 1: agreed at the end of step 2, so step 3
    assert [f["step"] for f in frames[0]] == [0, 2, 3, 5]
    assert frames[1] == [] and frames[2] == []


def test_pack_orders_values_and_keeps_the_lowest_rank() -> None:
    import torch

    from logitwatch.hooks._reduce import pack, unpack

    x = torch.tensor([float("-inf"), -3.5, -0.0, 0.0, 1e-30, 2.0, 7e30, float("inf"),
                      float("nan")])
    keys = pack(x, 5)
    assert torch.all(keys[1:] >= keys[:-1])
    back, ranks = unpack(keys)
    assert torch.equal(back[:-1], x[:-1]) and torch.isnan(back[-1]) and set(ranks.tolist()) == {5}
    tie = torch.maximum(pack(torch.tensor([2.0]), 7), pack(torch.tensor([2.0]), 3))
    assert unpack(tie)[1].item() == 3


def test_detail_ranks_name_the_alerting_heads_ranks() -> None:
    from types import SimpleNamespace as NS

    from logitwatch.server.store.detail import detail_ranks

    frames = [NS(run="r", step=10, heads={"attn.logit_max_rank": [[0, 3], [5, 1]]}),
              NS(run="r", step=20, heads={"attn.logit_max_rank": [[0, 4], [6, 1]]}),
              NS(run="plain", step=5, heads={"attn.logit_max": [[1.0]]})]
    alert = NS(run="r", rank=0, layer=1, head=0, heads=[0, 1])
    assert detail_ranks(frames, [alert]) == [1, 6]  # the newest frame's ranks
    assert detail_ranks(frames, [NS(run="r", rank=9, layer=None, head=None, heads=None)]) == [9]
    assert detail_ranks(frames, [NS(run="plain", rank=2, layer=0, head=0, heads=None)]) == []
