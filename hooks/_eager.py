"""Capture of HF transformers' eager attention (``attn_implementation="eager"``).

HF attention modules call the module-level ``eager_attention_forward`` of their own
``modeling_<model>`` module (looked up by name at call time) with post-RoPE
``query (B, H, T, D)``, ``key (B, H_kv, S, D)``, an additive float ``attention_mask
(B, 1, T, S)`` (causal, padding and sliding window already in it), ``scaling`` and, for
Gemma 2, ``softcap``. We replace that name with a wrapper for as long as any
monitor needs it (a reference count per patched module) and restore the original when
the last one detaches. The wrapper only does work for attention modules registered by a
monitor whose capture is active; otherwise it is one dict lookup and a call.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import torch

__all__ = ["EagerOwner", "EagerToken", "install", "uninstall"]

log = logging.getLogger("logitwatch.hooks")

_NAME = "eager_attention_forward"


class EagerOwner(Protocol):
    """What the wrapper needs from a monitor."""

    capturing: bool
    eager_depth: int

    def record_eager(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
        softcap: float | None = None,
    ) -> None: ...


class EagerToken:
    """What one :func:`install` did, for :func:`uninstall`."""

    def __init__(self, owner: EagerOwner) -> None:
        self.owner = owner
        self.module_ids: list[int] = []
        self.patched: list[str] = []
        #: id(attention module) -> its row in the per-head matrices (:func:`attention_rows`)
        self.rows: dict[int, int] = {}


class _Patch:
    def __init__(self, module: ModuleType, original: Callable[..., Any]) -> None:
        self.module = module
        self.original = original
        self.wrapper = _make_wrapper(original)
        self.users = 0


_lock = threading.Lock()
_patches: dict[str, _Patch] = {}
_owners: dict[int, list[EagerOwner]] = {}


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def eager_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if torch.compiler.is_compiling():  # a compiled block: not measured, not rewritten
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        for owner in _owners.get(id(module), ()):
            if owner.capturing:
                scaling = kwargs["scaling"] if "scaling" in kwargs else (args[0] if args else None)
                got, cap = None, kwargs.get("softcap")
                if getattr(owner, "attn_rewrite", None) is not None:  # QK-norm, soft-cap
                    got = owner.rewrite_eager(original, module, query, key, value,
                                              attention_mask, args, kwargs)
                rq, rk = (query, key) if got is None else (got.query, got.key)
                owner.record_eager(module, rq, rk, attention_mask, scaling,
                                   cap if got is None or got.softcap is None else got.softcap)
                owner.eager_depth += 1
                try:
                    if got is not None:
                        return got.func(*got.args, **got.kwargs)
                    return original(module, query, key, value, attention_mask, *args, **kwargs)
                finally:
                    owner.eager_depth -= 1
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    return eager_attention_forward


def _home_module(module: torch.nn.Module) -> ModuleType | None:
    """The Python module whose ``eager_attention_forward`` ``module.forward`` calls."""
    forward = inspect.unwrap(type(module).forward)
    namespace = getattr(forward, "__globals__", None)
    if not namespace or not callable(namespace.get(_NAME)):
        return None
    home = sys.modules.get(namespace.get("__name__", ""))
    if home is None or vars(home) is not namespace:
        return None
    return home


def attention_rows(modules: list[torch.nn.Module]) -> dict[int, int]:
    """Each attention module's row: its ``layer_idx`` when every attention module has a
    distinct one (a decoder: what the SDPA path's call order gives too), else its place in
    module order (an encoder-decoder such as T5 numbers its encoder's, its decoder's and its
    cross-attention's layers each from 0: keyed by ``layer_idx`` they were pooled into
    one row). Attention modules: those whose ``forward`` calls ``eager_attention_forward``."""
    attn = [m for m in modules
            if _NAME in getattr(getattr(inspect.unwrap(type(m).forward), "__code__", None),
                                "co_names", ())]
    idx = [getattr(m, "layer_idx", None) for m in attn]
    if all(isinstance(i, int) and not isinstance(i, bool) for i in idx) \
            and len(set(idx)) == len(idx):
        return {id(m): int(i) for m, i in zip(attn, idx, strict=True)}  # type: ignore[arg-type]
    return {id(m): row for row, m in enumerate(attn)}


def install(model: torch.nn.Module, owner: EagerOwner) -> EagerToken:
    """Patch the eager attention of every HF-style attention module found in ``model``."""
    token = EagerToken(owner)
    homed: list[torch.nn.Module] = []
    with _lock:
        for module in model.modules():
            home = _home_module(module)
            if home is None:
                continue
            _owners.setdefault(id(module), []).append(owner)
            token.module_ids.append(id(module))
            homed.append(module)
            name = home.__name__
            if name in token.patched:
                continue
            patch = _patches.get(name)
            if patch is None:
                patch = _Patch(home, getattr(home, _NAME))
                setattr(home, _NAME, patch.wrapper)
                _patches[name] = patch
            patch.users += 1
            token.patched.append(name)
    token.rows = attention_rows(homed)
    return token


def uninstall(token: EagerToken) -> None:
    """Undo :func:`install`; restores the original function when no monitor needs it."""
    with _lock:
        for module_id in token.module_ids:
            owners = _owners.get(module_id, [])
            if token.owner in owners:
                owners.remove(token.owner)
            if not owners:
                _owners.pop(module_id, None)
        for name in token.patched:
            patch = _patches.get(name)
            if patch is None:
                continue
            patch.users -= 1
            if patch.users > 0:
                continue
            del _patches[name]
            if getattr(patch.module, _NAME, None) is patch.wrapper:
                setattr(patch.module, _NAME, patch.original)
            else:  # someone patched over us: keep theirs; ours is a pass-through now
                log.warning(
                    "logitwatch: %s.%s was replaced by someone else; left as is",
                    name,
                    _NAME,
                )
        token.module_ids.clear()
        token.patched.clear()
