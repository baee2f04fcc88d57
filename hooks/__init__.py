"""Torch-side instrumentation: ``attach(model, optimizer, run=..., url=...) -> Monitor``.

See ``docs/HOOKS.md`` for the signals, their exact definitions, the adapter for other
attention implementations, ``torch.compile`` notes and measured cost; ``Monitor`` for the
rules (sampling, capture, failures). Framework callbacks live in
``logitwatch.hooks.hf`` (transformers ``Trainer``) and ``logitwatch.hooks.lightning``.
"""

from ._adapter import record_attention
from ._attach import attach
from ._monitor import Monitor

__all__ = ["Monitor", "attach", "record_attention"]
