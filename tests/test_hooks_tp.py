"""Tensor-parallel shards assembled into the full layer x head matrix (hooks/_tp.py with
_reduce): four real processes (gloo), two data-parallel replicas of a two-layer, four-head
model whose heads are split by hand across two tensor-parallel ranks each; rank 0's reduced
frame equals that of the unsplit model on two data-parallel ranks. A q/k weight sharded by
head as a DTensor on a "tp" mesh is found as tensor parallel."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

#: The model of the workers (this file's and the ranks audit's): heads split by hand across a
#: TP group, the row-parallel output summed over it.
NET_TP = textwrap.dedent('''
    import json, os, sys
    import torch, torch.nn.functional as F
    import torch.distributed as dist
    from torch import nn
    from logitwatch.hooks import attach

    H, D, E = 4, 2, 8  # heads, head dim, width

    class Sum(torch.autograd.Function):  # row-parallel output: summed over the TP group
        @staticmethod
        def forward(ctx, x, group):
            y = x.clone()
            dist.all_reduce(y, group=group)
            return y

        @staticmethod
        def backward(ctx, g):
            return g, None

    class Attn(nn.Module):
        def __init__(self, heads, part, group):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(E, H * D) for _ in range(3))
            self.o_proj = nn.Linear(H * D, E, bias=False)
            self.num_heads, self.group = H, group
            if part is not None:  # keep heads [part * heads, (part + 1) * heads)
                rows = slice(part * heads * D, (part + 1) * heads * D)
                with torch.no_grad():
                    for lin in (self.q_proj, self.k_proj, self.v_proj):
                        w, b = lin.weight[rows].clone(), lin.bias[rows].clone()
                        lin.weight, lin.bias = nn.Parameter(w), nn.Parameter(b)
                    self.o_proj.weight = nn.Parameter(self.o_proj.weight[:, rows].clone())
                self.num_heads = heads

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, self.num_heads, D).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = self.o_proj(y.transpose(1, 2).reshape(b, t, self.num_heads * D))
            return Sum.apply(y, self.group) if self.group is not None else y

    class Net(nn.Module):
        def __init__(self, heads=H, part=None, group=None):
            super().__init__()
            self.emb = nn.Embedding(16, E)
            self.layers = nn.ModuleList(Attn(heads, part, group) for _ in range(2))
            self.lm_head = nn.Linear(E, 16)

        def forward(self, ids):
            x = self.emb(ids)
            for layer in self.layers:
                x = x + layer(x)
            return self.lm_head(x)

''')

WORKER = NET_TP + textwrap.dedent('''
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    found = None
    if mode == "tp":  # ranks (0, 1) and (2, 3): a TP group each, replicas of each other
        tp = 2
        groups = [dist.new_group([d * tp + i for i in range(tp)]) for d in range(world // tp)]
        dp, part = divmod(rank, tp)
        model = Net(H // tp, part, groups[dp])
        extra = {"tp_group": groups[dp]}
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from logitwatch.hooks._tp import find_tp
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        probe = nn.Module()
        probe.q_proj = nn.Linear(E, H * D)
        probe.q_proj.weight = nn.Parameter(distribute_tensor(
            probe.q_proj.weight.detach(), mesh["tp"], [Shard(0)]))
        t = find_tp(probe)
        found = [t.size, t.rank] if t is not None else None
    else:
        dp, model, extra = rank, Net(), {}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights every step
    frames = []
    mon = attach(model, opt, run="tp", sample_every=1, overhead_budget=None, **extra)

    def record(step, scalars, heads, time=None, history=None):
        frames.append({"step": step, "scalars": scalars, "heads": heads})

    mon.client.send = record
    data = torch.randint(0, 16, (2, 3, 4, 6), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        ids = data[dp, step]
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        mon.log(loss=loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    with open(out, "w") as f:
        json.dump({"frames": frames, "found": found}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
''')


def _run(tmp_path, gloo_pair, mode: str, world: int) -> list[dict]:  # type: ignore[no-untyped-def]
    gloo_pair(tmp_path, WORKER, lambda r: [mode, str(tmp_path / f"{mode}{r}.json")],
              world=world, timeout=240)
    return [json.loads((tmp_path / f"{mode}{r}.json").read_text()) for r in range(world)]


def _m(frame: dict, name: str) -> np.ndarray:
    return np.array(frame["heads"][name], dtype=np.float64)


@pytest.mark.slow
def test_tensor_parallel_heads_assemble_into_the_full_matrix(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    full = _run(tmp_path, gloo_pair, "full", 2)  # unsplit, two data-parallel ranks
    tp = _run(tmp_path, gloo_pair, "tp", 4)  # the same, each replica's heads on two ranks
    assert [out["found"] for out in tp] == [[2, 0], [2, 1], [2, 0], [2, 1]]
    assert all(out["frames"] == [] for out in tp[1:]) and full[1]["frames"] == []
    ref, got = full[0]["frames"], tp[0]["frames"]
    assert [f["step"] for f in got] == [f["step"] for f in ref] == [0, 1, 2]
    for a, b in zip(got, ref, strict=True):
        assert _m(a, "attn.logit_max").shape == (2, 4)  # 2 layers x all 4 heads
        for name in ("attn.logit_max", "attn.logit_p99", "attn.entropy_min"):
            np.testing.assert_allclose(_m(a, name), _m(b, name), rtol=1e-5, atol=1e-6)
        for name in ("attn.logit_mean", "attn.logit_std", "attn.entropy_mean"):
            np.testing.assert_allclose(_m(a, name), _m(b, name), rtol=1e-4, atol=1e-5)
        # the global rank that held each head's max: replica d's ranks are 2d and 2d + 1
        np.testing.assert_array_equal(_m(a, "attn.logit_max_rank") // 2,
                                      _m(b, "attn.logit_max_rank"))
        # every rank's loss; the TP ranks of a replica have the same one
        np.testing.assert_allclose(_m(a, "ranks.loss")[0, ::2], _m(b, "ranks.loss")[0],
                                   rtol=1e-5)
        assert a["scalars"]["reduce.ranks"] == 4 and a["scalars"]["reduce.attn_ranks"] == 4
        assert a["scalars"]["loss.ranks_mean"] == pytest.approx(
            b["scalars"]["loss.ranks_mean"], rel=1e-5)


def test_find_tp_explicit_and_none() -> None:
    from torch import nn

    from logitwatch.hooks._tp import TensorParallel, find_tp

    model = nn.Sequential(nn.Linear(2, 2))
    assert find_tp(model) is None  # plain weights: every rank computes every head
    with pytest.raises(ValueError):
        find_tp(model, tp_rank=1)
    with pytest.raises(ValueError):
        TensorParallel(2, 2)
