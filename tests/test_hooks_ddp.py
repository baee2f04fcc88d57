"""Two real processes, a gloo group and DDP: every rank reports the *global* grad norm
(gradients are all-reduced before the optimizer step) and its own rank."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

NET = textwrap.dedent('''
    import torch, torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)
            self.num_heads = 2
            self.lm_head = nn.Linear(8, 16)

        def forward(self, ids):
            x = self.emb(ids)
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, 2, 4).transpose(1, 2)
            k = self.k_proj(x).view(b, t, 2, 4).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, k, is_causal=True)
            return self.lm_head(x + y.transpose(1, 2).reshape(b, t, 8))
''')

WORKER = NET + textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from logitwatch.hooks import attach

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    frames = []
    mon = attach(model, opt, run="ddp", sample_every=1, overhead_budget=None,
                 reduce_ranks=False)  # each rank's own frames (reduction: test_hooks_reduce)
    mon.client.send = lambda step, scalars, heads, time=None: frames.append(
        {"step": step, "rank": mon.client.rank, "grad.norm": scalars["grad.norm"],
         "has_attn": "attn.logit_max" in heads})
    data = torch.randint(0, 16, (2, 4, 6), generator=torch.Generator().manual_seed(1))
    for step in range(2):
        ids = data[rank]  # a different batch on each rank
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    with open(sys.argv[1], "w") as f:
        json.dump(frames, f)
    dist.destroy_process_group()
    # gloo's background threads can abort the interpreter's own teardown ("terminate
    # called without an active exception"); the result is written, so leave at once.
    import os
    sys.stdout.flush()
    os._exit(0)
''')



def reference_norms() -> list[float]:
    """One process, both ranks' batches: the mean loss has DDP's averaged gradient."""
    ns: dict = {}
    exec(NET, ns)
    torch.manual_seed(0)
    net = ns["Net"]()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.randint(0, 16, (2, 4, 6), generator=torch.Generator().manual_seed(1))
    norms = []
    for _ in range(2):
        losses = [torch.nn.functional.cross_entropy(net(ids).reshape(-1, 16), ids.reshape(-1))
                  for ids in data]
        (sum(losses) / 2).backward()
        grads = [p.grad for p in net.parameters()]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        opt.step()
        opt.zero_grad()
    return norms


@pytest.mark.slow
def test_ddp_two_process_gloo_grad_norm_is_global(tmp_path, gloo_pair) -> None:
    gloo_pair(tmp_path, WORKER, lambda rank: [str(tmp_path / f"{rank}.json")])
    frames = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    expected = reference_norms()
    for rank, rank_frames in enumerate(frames):
        assert [f["step"] for f in rank_frames] == [0, 1]
        assert all(f["rank"] == rank and f["has_attn"] for f in rank_frames)
        for frame, norm in zip(rank_frames, expected, strict=True):
            assert frame["grad.norm"] == pytest.approx(norm, rel=1e-5)
