"""logitwatch: a training-health monitor for PyTorch transformer training.

``import logitwatch`` stays light (no torch, no httpx): ``logitwatch.attach``,
``logitwatch.Monitor`` and ``logitwatch.record_attention`` load ``logitwatch.hooks``
(torch) on first use, ``Client`` and ``ClientConfig`` load ``logitwatch.client``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logitwatch.client import Client, ClientConfig
    from logitwatch.hooks import Monitor, attach, record_attention

__all__ = ["Client", "ClientConfig", "Monitor", "attach", "record_attention"]

_LAZY = {
    "attach": "logitwatch.hooks",
    "Monitor": "logitwatch.hooks",
    "record_attention": "logitwatch.hooks",
    "Client": "logitwatch.client",
    "ClientConfig": "logitwatch.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'logitwatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
