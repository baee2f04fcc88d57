"""Torch-side instrumentation: ``attach(model, optimizer, run=..., url=...) -> Monitor``.

See ``docs/ARCHITECTURE.md`` (Hooks API) for the contract and ``Monitor`` for the rules
(sampling, capture, failures).
"""

from ._attach import attach
from ._monitor import Monitor

__all__ = ["Monitor", "attach"]
