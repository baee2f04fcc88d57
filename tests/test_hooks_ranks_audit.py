"""The multi-rank hooks' audit (real gloo processes on CPU): nothing the monitor does may
make the ranks' collectives mismatch (a crashed or hung job), and the reduced frame says
what the docs say.

* A: a rank whose scalars fail at the end of a sampled step still enters the reduction;
* B: setting ``sample_every`` / ``overhead_budget`` mid-step on one rank never un-samples
  (or samples) the step in progress on that rank only;
* C: a reduce group narrower than the sharding group: both sample the same steps;
* D: ranks whose attention layouts disagree: the leader keeps its own ``attn.*``;
* E: the layout checksum tells ``{0, 3}`` from ``{1, 2}``;
* F: tensor parallel with ``reduce_ranks=<the data-parallel group>``: reduction off (one
  warning), never two leaders each sending a half-missing matrix;
* G: the collector's ``control["sample_every"]`` (heard by the leader only) can make a
  reduced job sample more often.
"""

from __future__ import annotations

import json
import math
import textwrap
from types import SimpleNamespace

import pytest
import torch
from test_hooks_ddp import NET
from test_hooks_tp import NET_TP

TWO = NET + textwrap.dedent('''
    import json, os, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from logitwatch.hooks import attach, record_attention

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode, out = sys.argv[1], sys.argv[2]
    E, H, D, L = 8, 2, 4, 4

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i
            self.q_proj, self.k_proj = nn.Linear(E, E), nn.Linear(E, E)

        def forward(self, x):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, H, D).transpose(1, 2)
            k = self.k_proj(x).view(b, t, H, D).transpose(1, 2)
            record_attention(q, k, is_causal=True, layer=self.i)
            s = (q @ k.transpose(-1, -2)) / D ** 0.5  # by hand: recorded above only
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = s.softmax(-1) @ k
            return x + y.transpose(1, 2).reshape(b, t, E)

    class Layers(nn.Module):  # runs some of its blocks only (LayerDrop, stages)
        def __init__(self, active):
            super().__init__()
            self.emb = nn.Embedding(16, E)
            self.blocks = nn.ModuleList(Block(i) for i in range(L))
            self.lm_head = nn.Linear(E, 16)
            self.active = active

        def forward(self, ids):
            x = self.emb(ids)
            for i, blk in enumerate(self.blocks):
                if i in self.active:
                    x = blk(x)
            return self.lm_head(x)

    torch.manual_seed(0)
    every, steps = 1, 3
    if mode == "collide":  # rank 0 runs layers {0, 3}, rank 1 {1, 2}: same sizes, sums
        model = Layers([0, 3] if rank == 0 else [1, 2])
    elif mode == "layout":  # rank 0 runs 4 layers, rank 1 three
        model = Layers([0, 1, 2, 3] if rank == 0 else [0, 1, 2])
    else:
        model = DDP(Net())
        if mode == "setter":
            every, steps = 3, 5
        if mode == "ctrl":
            every, steps = 4, 9
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = attach(model, opt, run="audit", sample_every=every, overhead_budget=None)
    frames, sampled = [], []

    def record(step, scalars, heads, time=None, history=None):
        frames.append({"step": step, "scalars": {k: v for k, v in scalars.items()
                                                 if isinstance(v, float)},
                       "heads": heads})

    mon.client.send = record
    reads = []
    if mode == "reads":  # what each rank reads back of its frames (a host read each)
        from logitwatch.hooks import _frames
        orig_collect = _frames.collect

        def collect(*args, **kwargs):
            reads.append(mon.step_index)
            return orig_collect(*args, **kwargs)

        _frames.collect = collect
    if mode == "ctrl" and rank == 0:  # the collector's answer (heard by the leader only)
        mon.client._control = {"sample_every": 1}
    if mode == "raise" and rank == 1:  # a rank-local failure (an OOM) in final.* at step 1
        from logitwatch.hooks import _final
        orig = _final.FinalStats.metrics

        def metrics(self):
            if mon.step_index == 1:
                raise MemoryError("injected on rank 1")
            return orig(self)

        _final.FinalStats.metrics = metrics
    data = torch.randint(0, 16, (2, 10, 2, 6), generator=torch.Generator().manual_seed(1))
    for step in range(steps):
        if mode == "setter" and rank == 1 and step == 0:
            mon.request_sample()  # agreed at the end of step 0: step 1 is sampled
        ids = data[rank, step]
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        mon.log(loss=loss)
        loss.backward()
        if mode == "setter" and step == 1:  # mid-step, one rank each
            if rank == 0:
                mon.sample_every = 3  # the same value
            else:
                mon.overhead_budget = None  # the same value
        sampled.append(mon.sampled)
        opt.step()
        opt.zero_grad()
    mon.close()
    with open(out, "w") as f:
        json.dump({"frames": frames, "sampled": sampled, "reads": reads}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
''')

FOUR = NET_TP + textwrap.dedent('''
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    tp = 2
    dp, part = divmod(rank, tp)
    if mode == "tp":  # ranks (0, 1) and (2, 3): a TP group each, replicas of each other
        groups = [dist.new_group([d * tp + i for i in range(tp)]) for d in range(world // tp)]
        dpg = [dist.new_group([d * tp + i for d in range(world // tp)]) for i in range(tp)]
        model = Net(H // tp, part, groups[dp])
        extra = {"tp_group": groups[dp], "reduce_ranks": dpg[part]}  # the DP group
        every, steps = 1, 3
    else:  # "mesh": a parameter on a (dp, mp) mesh (FSDP2 + TP), reduce over "dp"
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "mp"))
        model = Net()
        model.extra = nn.Parameter(distribute_tensor(torch.zeros(4, 2), mesh,
                                                     [Replicate(), Shard(0)]))
        extra = {"reduce_ranks": mesh.get_group("dp")}
        every, steps = 2, 6
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != "extra"], lr=0.0)
    mon = attach(model, opt, run="audit4", sample_every=every, overhead_budget=None, **extra)
    frames, sampled = [], []

    def record(step, scalars, heads, time=None, history=None):
        frames.append({"step": step, "heads": {k: v for k, v in heads.items()
                                               if k.startswith("attn.")}})

    mon.client.send = record
    data = torch.randint(0, 16, (2, 6, 4, 6), generator=torch.Generator().manual_seed(1))
    for step in range(steps):
        ids = data[dp, step]
        loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        if mode == "mesh" and rank == 0 and step == 1:
            mon.request_sample()  # one rank asks: agreed by all
        loss.backward()
        sampled.append(mon.sampled)
        opt.step()
        opt.zero_grad()
    reduced = mon._ranks is not None
    mon.close()
    with open(out, "w") as f:
        json.dump({"frames": frames, "sampled": sampled, "reduced": reduced}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
''')


def _run(tmp_path, gloo_pair, source: str, mode: str, world: int) -> list[dict]:  # type: ignore[no-untyped-def]
    gloo_pair(tmp_path, source, lambda r: [mode, str(tmp_path / f"{mode}{r}.json")],
              world=world, timeout=150, env=None)
    return [json.loads((tmp_path / f"{mode}{r}.json").read_text()) for r in range(world)]


def _steps(out: dict) -> list[int]:
    return [f["step"] for f in out["frames"]]


@pytest.mark.slow
def test_a_rank_whose_scalars_fail_still_enters_the_reduction(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """A: rank 1's ``final.*`` raise at step 1 (an OOM): it still reduces; the job ends."""
    out = _run(tmp_path, gloo_pair, TWO, "raise", 2)
    assert _steps(out[0]) == [0, 1, 2]
    assert out[1]["frames"] == []
    step1 = out[0]["frames"][1]
    # rank 1 gathered nothing at step 1 (NaN: not measured), its attention still pooled
    assert math.isnan(step1["heads"]["ranks.loss"][0][1])
    assert step1["scalars"]["reduce.attn_ranks"] == 2.0


@pytest.mark.slow
def test_ranks_that_do_not_send_read_nothing_back(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """Reduce-before-send: only the leader reads its frame back from the device; the other
    ranks' read-back (a host read of every matrix on an accelerator) was thrown away."""
    out = _run(tmp_path, gloo_pair, TWO, "reads", 2)
    assert _steps(out[0]) == [0, 1, 2] and out[1]["frames"] == []
    assert out[0]["reads"] == [0, 1, 2] and out[1]["reads"] == []


@pytest.mark.slow
def test_a_setter_mid_step_on_one_rank_keeps_the_agreed_step(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """B: step 1 is sampled by agreement (rank 1's request); rank 0 sets ``sample_every``
    and rank 1 ``overhead_budget`` during it: both still sample it, the job ends."""
    out = _run(tmp_path, gloo_pair, TWO, "setter", 2)
    assert out[0]["sampled"] == out[1]["sampled"] == [True, True, False, False, True]
    assert _steps(out[0]) == [0, 1, 4]


@pytest.mark.slow
def test_ranks_with_other_layers_keep_their_own_attention(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """D: rank 0 measures 4 layers, rank 1 three: the layouts disagree, and the leader's
    frame keeps its own ``attn.*`` (the warning's word) beside the gathered ``ranks.*``."""
    out = _run(tmp_path, gloo_pair, TWO, "layout", 2)
    assert _steps(out[0]) == [0, 1, 2]
    for frame in out[0]["frames"]:
        assert len(frame["heads"]["attn.logit_max"]) == 4
        assert "attn.logit_max_rank" not in frame["heads"]  # its own, not reduced
        assert len(frame["heads"]["ranks.loss"][0]) == 2  # still gathered


@pytest.mark.slow
def test_layers_0_3_and_1_2_are_not_merged(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """E: rank 0 measures layers {0, 3}, rank 1 {1, 2} (same count, width and old
    checksum): not merged as if the same layers; the leader keeps its own."""
    out = _run(tmp_path, gloo_pair, TWO, "collide", 2)
    assert _steps(out[0]) == [0, 1, 2]
    for frame in out[0]["frames"]:
        assert "attn.logit_max_rank" not in frame["heads"]
        assert "reduce.attn_ranks" not in frame["scalars"]
        assert len(frame["heads"]["attn.logit_max"]) == 2


@pytest.mark.slow
def test_the_collectors_sample_every_makes_a_reduced_job_sample_more(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """G: attached with ``sample_every=4`` on both ranks; the collector asks the leader for
    1: from the first agreement on every step is sampled, on both ranks."""
    out = _run(tmp_path, gloo_pair, TWO, "ctrl", 2)
    assert _steps(out[0]) == list(range(9))
    assert out[0]["sampled"] == out[1]["sampled"] == [True] * 9


@pytest.mark.slow
def test_a_reduce_group_narrower_than_the_sharding_group_samples_alike(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """C: a parameter on a (dp, mp) mesh shards over the whole job; reduce_ranks is the
    "dp" group; rank 0 alone asks for a sample: all four ranks sample the same steps."""
    out = _run(tmp_path, gloo_pair, FOUR, "mesh", 4)
    assert all(o["reduced"] for o in out)
    want = [True, False, True, True, False, True]  # 0, 2, the request (3), 3 + 2
    assert [o["sampled"] for o in out] == [want] * 4
    assert _steps(out[0]) == _steps(out[1]) == [0, 2, 3, 5]  # the "dp" groups' leaders
    assert out[2]["frames"] == out[3]["frames"] == []


@pytest.mark.slow
def test_tp_with_the_data_parallel_group_turns_reduction_off(tmp_path, gloo_pair) -> None:  # type: ignore[no-untyped-def]
    """F: ``reduce_ranks=<the DP group>`` under TP does not hold the TP partners: reduction
    is off (warned) and every rank sends its own heads; no half-missing matrices."""
    out = _run(tmp_path, gloo_pair, FOUR, "tp", 4)
    assert not any(o["reduced"] for o in out)
    for o in out:
        assert _steps(o) == [0, 1, 2]
        for frame in o["frames"]:
            m = frame["heads"]["attn.logit_max"]
            assert len(m) == 2 and all(len(row) == 2 for row in m)  # its own 2 heads
            assert all(math.isfinite(v) for row in m for v in row)


# -- in process: the pieces ------------------------------------------------------------------


def _stats(heads: int) -> SimpleNamespace:
    return SimpleNamespace(maximum=torch.zeros(heads), capped_max=None, capped_p99=None)


def test_the_layout_checksum_is_position_sensitive() -> None:
    """E: the header's checksum of layers {0, 3} and {1, 2} (of equal widths) differ, as do
    equal layers of other widths; equal layouts agree."""
    from logitwatch.hooks._reduce import _header

    def header(layers: dict[int, int]) -> list[int]:
        attn = {layer: _stats(w) for layer, w in layers.items()}
        return _header(attn, sorted(attn), {})

    assert header({0: 2, 3: 2})[:4] != header({1: 2, 2: 2})[:4]
    assert header({0: 2, 1: 4})[:4] != header({0: 4, 1: 2})[:4]
    assert header({0: 2, 3: 2}) == header({3: 2, 0: 2})
    assert all(0 <= v < 2**62 for v in header({0: 2, 3: 2, 31: 64})[:4])


def test_reduced_values_without_attention_keep_the_senders_attention() -> None:
    """D: a reduction whose layouts disagreed holds only the gathered ``ranks.*``; applying
    it keeps the frame's own ``attn.*``."""
    from logitwatch.hooks._reduce import Reduced

    own = [torch.ones(2)]
    heads = {"attn.logit_max": own, "qk.q_weight_norm": own}
    scalars: dict = {}
    Reduced(heads={"ranks.loss": [torch.zeros(2)]}, scalars={"reduce.ranks": 2.0}).apply(
        scalars, heads)
    assert heads["attn.logit_max"] is own and "ranks.loss" in heads
    assert scalars == {"reduce.ranks": 2.0}
    Reduced(heads={"attn.logit_p99": own}).apply(scalars, heads)
    assert "attn.logit_max" not in heads and heads["attn.logit_p99"] is own
