"""Fast tests of the demo training job (model, data, divergence rule, train loop)."""

from __future__ import annotations

import math
import string

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from logitwatch.demo import data as demo_data
from logitwatch.demo.model import GPTConfig, TinyGPT, attention
from logitwatch.demo.train import SETTINGS, divergence_step, train


class _CountSDPA(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.dtype, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append((args[0].dtype, dict(kwargs)))
        return func(*args, **kwargs)


def _qk_with_score(score: float, head_dim: int = 16) -> tuple[torch.Tensor, ...]:
    """q = k = a vector whose q.k*scale equals ``score`` at every pair of one head."""
    scale = head_dim**-0.5
    vec = torch.full((head_dim,), math.sqrt(score / scale / head_dim))
    q = vec.expand(1, 1, 4, head_dim).clone()
    return q, q.clone(), torch.randn(1, 1, 4, head_dim), scale


@pytest.mark.parametrize("attn_dtype", ["float32", "float16"])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_forward_shapes(attn_dtype: str, qk_norm: bool) -> None:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(d_model=32, n_layer=2, n_head=4, seq_len=16,
                              qk_norm=qk_norm, attn_dtype=attn_dtype))
    idx = torch.randint(0, 256, (3, 16))
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 256) and logits.dtype == torch.float32 and loss is None
    logits, loss = model(idx, idx)
    assert loss is not None and loss.shape == () and math.isfinite(loss.item())
    assert abs(loss.item() - math.log(256)) < 0.5


@pytest.mark.parametrize("attn_dtype", ["float32", "float16"])
def test_model_calls_sdpa(attn_dtype: str) -> None:
    model = TinyGPT(GPTConfig(d_model=32, n_layer=3, n_head=4, seq_len=8, attn_dtype=attn_dtype))
    with _CountSDPA() as mode:
        model(torch.randint(0, 256, (2, 8)))
    expected = torch.float32 if attn_dtype == "float32" else torch.float16
    assert [dtype for dtype, _ in mode.calls] == [expected] * 3
    for _, kwargs in mode.calls:
        assert kwargs["is_causal"] is True and kwargs["scale"] == pytest.approx(8**-0.5)


def test_float16_scores_beyond_half_range_give_nan() -> None:
    q, k, v, scale = _qk_with_score(70_000.0)
    assert torch.isfinite(attention(q, k, v, scale=scale, attn_dtype="float32")).all()
    out = attention(q, k, v, scale=scale, attn_dtype="float16")
    assert not torch.isfinite(out).any()
    q, k, v, scale = _qk_with_score(60_000.0)
    assert torch.isfinite(attention(q, k, v, scale=scale, attn_dtype="float16")).all()


def test_float16_overflow_only_counts_causal_pairs() -> None:
    q, k, v, scale = _qk_with_score(1.0)
    k[..., 3, :] *= 70_000.0  # only the last key is huge: seen by the last query only
    out = attention(q, k, v, scale=scale, attn_dtype="float16")
    assert torch.isfinite(out[..., :3, :]).all() and torch.isnan(out[..., 3, :]).all()


def test_model_loss_nan_when_float16_logits_overflow() -> None:
    torch.manual_seed(0)
    idx = torch.randint(0, 256, (2, 16))
    for dtype, finite in (("float32", True), ("float16", False)):
        torch.manual_seed(1)
        model = TinyGPT(GPTConfig(d_model=32, n_layer=1, n_head=2, seq_len=16, attn_dtype=dtype))
        with torch.no_grad():
            model.blocks[0].attn.qkv.weight[:64] *= 2000.0  # q and k rows
        _, loss = model(idx, idx)
        assert math.isfinite(loss.item()) is finite


def test_divergence_step() -> None:
    smooth = [5.0 - 0.01 * i for i in range(200)]
    assert divergence_step(smooth) is None
    assert divergence_step([]) is None
    assert divergence_step(smooth[:50] + [float("nan")] + smooth[50:]) == 50
    assert divergence_step([3.0, float("inf")]) == 1
    jumped = [3.0] * 100 + [5.0] * 20  # mean of 10 rises by 2 nats: crosses +1 at 5 of 10
    assert divergence_step(jumped) == 105
    noisy = [3.0 + (1.5 if i % 7 == 0 else 0.0) for i in range(300)]  # single spikes
    assert divergence_step(noisy) is None


def test_corpus_is_clean_ascii_text() -> None:
    text = demo_data.load_corpus()
    assert 300_000 <= len(text) <= 600_000
    assert set(text) <= set(string.printable)
    machine_paths = ["/" + "home" + "/", "/" + "work" + "/", "site-packages"]
    assert not any(p in text for p in machine_paths)


def test_batches_are_deterministic() -> None:
    a = demo_data.ByteData(seq_len=32, batch_size=4, seed=7)
    b = demo_data.ByteData(seq_len=32, batch_size=4, seed=7)
    c = demo_data.ByteData(seq_len=32, batch_size=4, seed=8)
    for _ in range(3):
        (xa, ya), (xb, yb), (xc, _) = a.batch(), b.batch(), c.batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and not torch.equal(xa, xc)
    assert xa.shape == (4, 32) and xa.dtype == torch.long
    assert torch.equal(xa[:, 1:], ya[:, :-1])
    assert demo_data.decode(demo_data.encode("byte text")) == "byte text"
    (va, _), (vb, _) = a.val_batches(1)[0], b.val_batches(1)[0]
    assert torch.equal(va, vb)


def test_train_hooks_and_clip_intercept(monkeypatch: pytest.MonkeyPatch) -> None:
    clip_calls: list[float] = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, *args, **kwargs):  # noqa: ANN001, ANN202
        clip_calls.append(max_norm)
        return real_clip(params, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    seen: dict[str, object] = {}
    steps: list[tuple[int, float]] = []
    logs: list[str] = []
    setting = SETTINGS["healthy"]
    result = train(setting, steps=4, on_model=lambda m, o: seen.update(model=m, opt=o),
                   on_step=lambda s, v: steps.append((s, v)), log=logs.append)
    assert isinstance(seen["model"], TinyGPT)
    assert isinstance(seen["opt"], torch.optim.Optimizer)
    assert [s for s, _ in steps] == [0, 1, 2, 3] and result.steps_done == 4
    assert [v for _, v in steps] == result.losses and result.divergence_step is None
    assert clip_calls == [setting.max_norm] * 4 and logs
    again = train(setting, steps=4, log=lambda _: None)
    assert again.losses == result.losses  # deterministic per seed


def test_settings_differ_only_in_qk_norm() -> None:
    unstable, healthy = SETTINGS["unstable"], SETTINGS["healthy"]
    assert not unstable.qk_norm and healthy.qk_norm and unstable.attn_dtype == "float16"
    fields = {k for k in vars(unstable) if getattr(unstable, k) != getattr(healthy, k)}
    assert fields == {"name", "description", "qk_norm"}


def test_fused_setting_is_the_unstable_run_with_fuses_on_auto() -> None:
    unstable, fused = SETTINGS["unstable"], SETTINGS["fused"]
    fields = {k for k in vars(unstable) if getattr(unstable, k) != getattr(fused, k)}
    assert fields == {"name", "description", "fuses"}
    assert unstable.fuses is None and SETTINGS["healthy"].fuses is None
    from logitwatch.hooks.fuses import FuseSet, LRBackoff, QKClip

    built = {f.name: f for f in FuseSet.build(fused.fuses, None)}
    assert set(built) == {"qk_clip", "lr_backoff"}
    assert isinstance(built["qk_clip"], QKClip) and built["qk_clip"].tau == 50.0
    assert isinstance(built["lr_backoff"], LRBackoff)
    assert all(f.mode == "auto" for f in built.values())
