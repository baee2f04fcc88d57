"""Two real processes, a gloo group and FSDP (FSDP2 ``fully_shard``, FSDP1 with flat and
original parameters): on every rank the frame's ``grad.norm`` is the *global* norm (with and
without the job clipping), the clip flag, the q/k norms of sharded parameters, attention and
final statistics equal a single-process reference, frames carry their rank, and the ranks
sample the same steps even when only one of them is told to sample less often. A failure
on one rank only never makes the ranks hang: only what needs the failed part is absent."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

STEPS = 3
MAX_NORM = 1.0

MODEL = textwrap.dedent('''
    import torch, torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    VOCAB = 64

    def make_model():
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                         attn_implementation="sdpa", bos_token_id=0, eos_token_id=0,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg)

    def batches():
        """One batch per rank: (rank, batch, time)."""
        return torch.randint(0, VOCAB, (2, 2, 8), generator=torch.Generator().manual_seed(1))
''')

WORKER = MODEL + textwrap.dedent('''
    import json, logging, os, sys
    import torch.distributed as dist
    from logitwatch.hooks import attach
    from logitwatch.hooks import _shard

    class Warnings(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    warnings_seen = Warnings()
    logging.getLogger("logitwatch.hooks").addHandler(warnings_seen)

    MODE, OUT = sys.argv[1], sys.argv[2]
    STEPS, MAX_NORM = int(sys.argv[3]), float(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def wrap(model):
        if MODE == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            for block in model.transformer.h:
                fully_shard(block)
            return fully_shard(model)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        return FSDP(model, device_id=torch.device("cpu"), use_orig_params=MODE == "fsdp1-orig")

    def clip_fns():
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        return [torch.nn.utils.clip_grad_norm_, FSDP.clip_grad_norm_]

    def broken(*args, **kwargs):
        raise MemoryError("injected: out of memory in a local computation")

    def inject(mon, kind):
        """Rank-local failures on rank 1 only: the local grad and q/k sums, or the
        frame building."""
        if kind == "local":
            for name in ("local_grad_sums", "_local_sums"):
                setattr(_shard.Sharding, name, broken)
        elif kind == "emit":
            mon._emit = broken
        elif kind == "grad":  # the grad part failed on this rank alone (disabled)
            mon.disabled.add("grad")

    def run(clip, steps, control_at=None, fail=None, overlap=False):
        saved = {n: getattr(_shard.Sharding, n) for n in ("local_grad_sums", "_local_sums")}
        warnings_seen.messages.clear()
        model = wrap(make_model())
        originals = clip_fns()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        frames = []
        mon = attach(model, opt, run="fsdp", sample_every=1, overhead_budget=None,
                     max_grad_norm=MAX_NORM, reduce_ranks=False)  # each rank's own frames
        mon.client.send = lambda step, scalars, heads, time=None, history=None: frames.append(
            {"step": step, "rank": mon.client.rank, "scalars": scalars, "heads": heads,
             "history": history})
        ids = batches()[rank]  # a different batch on each rank
        for step in range(steps):
            if step == control_at and rank == 0:  # the collector reached rank 0 first
                mon.client._control = {"sample_every": 3}
            if fail and step == 1 and rank == 1:
                inject(mon, fail)
            model(ids, labels=ids).loss.backward()
            if overlap:  # two clip calls whose parameter groups overlap (fsdp2)
                params = list(model.parameters())
                third = len(params) // 3
                torch.nn.utils.clip_grad_norm_(params[:2 * third], MAX_NORM)
                torch.nn.utils.clip_grad_norm_(params[third:], MAX_NORM)
            elif clip:
                if MODE == "fsdp2":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                else:
                    model.clip_grad_norm_(MAX_NORM)
            opt.step()
            opt.zero_grad()
        mon.close()
        for name, fn in saved.items():
            setattr(_shard.Sharding, name, fn)
        return {"frames": frames, "disabled": sorted(mon.disabled),
                "restored": all(a is b for a, b in zip(clip_fns(), originals)),
                "warnings": list(warnings_seen.messages), "steps": mon.step_index}

    result = {"plain": run(False, STEPS), "clip": run(True, STEPS),
              "control": run(False, 8, control_at=1),
              "fail-local": run(False, STEPS, fail="local"),
              "fail-emit": run(False, STEPS, fail="emit")}
    if MODE == "fsdp2":
        result["overlap-fail-grad"] = run(True, STEPS, fail="grad", overlap=True)
    with open(OUT, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    # gloo's background threads can abort the interpreter's own teardown ("terminate
    # called without an active exception"); the result is written, so leave at once.
    sys.stdout.flush()
    os._exit(0)
''')



def run_workers(tmp_path, gloo_pair, mode: str) -> list[dict]:
    gloo_pair(tmp_path, WORKER,
              lambda rank: [mode, str(tmp_path / f"{rank}.json"), str(STEPS), str(MAX_NORM)],
              env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]


def reference(clip: bool) -> list[dict]:
    """One process, both ranks' batches: the mean loss has FSDP's averaged gradient.

    Per step: the global grad norm, the clip flag, each rank's attention/final/loss
    statistics (a monitor on the same weights, one forward per rank's batch) and the
    q/k norms after the update.
    """
    from logitwatch.hooks import attach
    from logitwatch.hooks._qk import qk_norms
    from logitwatch.hooks._qk_find import find_qk

    ns: dict = {}
    exec(MODEL, ns)
    net = ns["make_model"]()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = ns["batches"]()
    qk = find_qk(net)
    out = []
    for _ in range(STEPS):
        per_rank: list[tuple[dict, dict]] = []
        mon = attach(net, run="ref", sample_every=1, overhead_budget=None)
        mon.client.send = lambda step, scalars, heads, time=None, sink=per_rank: sink.append(
            (scalars, heads))
        losses = []
        for ids in data:
            losses.append(net(ids, labels=ids).loss)
            mon.step()
        mon.close()
        (sum(losses) / 2).backward()
        norm = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in net.parameters() if p.grad is not None])).item()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        qk_after = {k: [v.tolist() for v in rows] for k, rows in qk_norms(qk).items()}
        out.append({"norm": norm, "clipped": norm > MAX_NORM, "ranks": per_rank, "qk": qk_after})
    return out


def close(a: float, b: float, rel: float = 1e-5, abs_: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def check_heads(got: dict, want: dict, names: list[str]) -> None:
    for name in names:
        assert name in got, f"{name} missing from the frame"
        g, w = torch.tensor(got[name]), torch.tensor(want[name])
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


ATTN = ["attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
        "attn.entropy_mean", "attn.entropy_min"]
QK = ["qk.q_weight_norm", "qk.k_weight_norm", "qk.q_bias_norm", "qk.k_bias_norm"]
FINAL = ["final.hidden_rms", "final.logz", "final.logit_max", "loss"]


def check_frame(frame: dict, want: dict, rank: int, *, clip: bool, exchanged: bool) -> None:
    """``frame`` equals the reference step ``want`` (``exchanged``: including what the
    ranks' exchange gives, grad.norm without the job's clip and the q/k norms)."""
    s = frame["scalars"]
    assert frame["rank"] == rank
    if exchanged:
        assert close(s["grad.norm"], want["norm"]), (s["grad.norm"], want["norm"])
        assert s["grad.clipped"] == float(want["clipped"])
        check_heads(frame["heads"], want["qk"], QK)
    if clip:  # observed from the job's own clip call, every step
        assert s["grad.clip_rate"] == float(want["clipped"])
    ref_scalars, ref_heads = want["ranks"][rank]
    for name in FINAL:
        assert close(s[name], ref_scalars[name], abs_=1e-5), name
    check_heads(frame["heads"], ref_heads, ATTN)


@pytest.mark.parametrize("mode", ["fsdp2", "fsdp1", "fsdp1-orig"])
def test_fsdp_two_process_gloo_whole_catalog(tmp_path, gloo_pair, mode: str) -> None:
    results = run_workers(tmp_path, gloo_pair, mode)
    refs = {clip: reference(clip) for clip in (False, True)}
    for clip, expected in refs.items():
        flags = [e["clipped"] for e in expected]
        assert any(flags) and not all(flags), f"MAX_NORM must split the steps: {flags}"
        for rank, result in enumerate(results):
            run = result["clip" if clip else "plain"]
            assert run["disabled"] == [], run["disabled"]
            assert run["warnings"] == [], run["warnings"]
            frames = run["frames"]
            assert [f["step"] for f in frames] == list(range(STEPS))
            for frame, want in zip(frames, expected, strict=True):
                check_frame(frame, want, rank, clip=clip, exchanged=True)
            assert run["restored"], "close() left a clip_grad_norm_ patched"
    # rank 0 alone is told sample_every=3 after step 1 (the collector reached it first):
    # both ranks still sample the same steps (a mismatch would hang or fail the run)
    for result in results:
        frames = result["control"]["frames"]
        assert result["control"]["disabled"] == []
        assert [f["step"] for f in frames] == [0, 1, 4, 7]
        assert [f["scalars"]["hooks.sample_every"] for f in frames] == [1.0, 1.0, 3.0, 3.0]
        # The unsampled steps between (no collective, no sync) came with the next frame.
        assert [f["history"] and f["history"]["steps"] for f in frames] == [
            None, None, [2, 3], [5, 6]]
        for f in frames[2:]:
            # the job never clips: no grad norm; the LM head's log Z and RMS, this rank's own
            assert sorted(f["history"]["scalars"]) == [
                "final.hidden_rms", "final.logz", "loss", "lr"]
            for name in ("loss", "final.logz", "final.hidden_rms"):
                assert all(math.isfinite(v) for v in f["history"]["scalars"][name]), name
    check_rank_local_failures(results, refs[False])
    if mode == "fsdp2":
        # two overlapping clip calls a step, and from step 1 rank 1's grad part is off: the
        # second call's new parameters were measured by a collective on rank 0 alone, which
        # hung both ranks; now no rank enters a collective the other may skip
        for rank, result in enumerate(results):
            run = result["overlap-fail-grad"]
            assert run["steps"] == STEPS
            assert ("grad" in run["disabled"]) == (rank == 1), run["disabled"]
            assert [f["step"] for f in run["frames"]] == list(range(STEPS))


def check_rank_local_failures(results: list[dict], expected: list[dict]) -> None:
    """From step 1, on rank 1 only: the local grad and q/k sums raise (an OOM), then, in
    a second run, the frame building raises. Before the end-of-step exchange, rank 1
    skipped its collectives and rank 0 waited forever (``run_workers`` would time out).
    Now both ranks finish every step, rank 1 logs each failure once, and rank 0 keeps
    sending; only the values that need rank 1's failed part are absent (on both ranks),
    the rest equal the reference."""
    for rank, result in enumerate(results):
        run = result["fail-local"]
        assert run["steps"] == STEPS
        assert run["disabled"] == (["grad", "qk"] if rank == 1 else [])
        failed = [m for m in run["warnings"] if "part of the monitor failed" in m]
        assert len(failed) == (2 if rank == 1 else 0), run["warnings"]
        if rank == 0:  # says once why the values are missing, pointing at the other rank
            assert sum("another rank" in m for m in run["warnings"]) == 2, run["warnings"]
        frames = run["frames"]
        assert [f["step"] for f in frames] == list(range(STEPS))
        check_frame(frames[0], expected[0], rank, clip=False, exchanged=True)
        for frame, want in zip(frames[1:], expected[1:], strict=True):
            assert "grad.norm" not in frame["scalars"] and "grad.clipped" not in frame["scalars"]
            assert not any(name.startswith("qk.") for name in frame["heads"])
            check_frame(frame, want, rank, clip=False, exchanged=False)
    # rank 1's frame building fails: it sends nothing more but still takes part in the
    # exchange, so rank 0's frames stay complete and exact
    run0, run1 = results[0]["fail-emit"], results[1]["fail-emit"]
    assert run1["steps"] == run0["steps"] == STEPS
    assert run1["disabled"] == ["step"]
    assert [f["step"] for f in run1["frames"]] == [0]
    assert sum("'step' part" in m for m in run1["warnings"]) == 1, run1["warnings"]
    assert run0["disabled"] == [] and run0["warnings"] == []
    assert [f["step"] for f in run0["frames"]] == list(range(STEPS))
    for frame, want in zip(run0["frames"], expected, strict=True):
        check_frame(frame, want, 0, clip=False, exchanged=True)


def test_unreadable_sharding_disables_the_collective_parts(monkeypatch, caplog) -> None:
    """If the sharding layout cannot be read (FSDP internals changed), attach still works,
    logs once, and the parts that would enter a collective (grad, qk) stay off."""
    from logitwatch.hooks import _monitor, attach

    def broken(model):
        raise AttributeError("'FlatParameter' object has no attribute '_shard_param_infos'")

    monkeypatch.setattr(_monitor, "find_sharding", broken)
    ns: dict = {}
    exec(MODEL, ns)
    net = ns["make_model"]()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    frames = []
    with caplog.at_level("WARNING", logger="logitwatch.hooks"):
        mon = attach(net, opt, run="x", sample_every=1, overhead_budget=None)
    mon.client.send = lambda step, scalars, heads, time=None: frames.append((scalars, heads))
    ids = ns["batches"]()[0]
    net(ids, labels=ids).loss.backward()
    opt.step()
    mon.close()
    assert mon.disabled == {"grad", "qk"}
    assert sum("'grad' part" in r.getMessage() for r in caplog.records) == 1
    scalars, heads = frames[0]
    assert "grad.norm" not in scalars and "loss" in scalars
    assert "attn.logit_max" in heads and not any(k.startswith("qk.") for k in heads)
