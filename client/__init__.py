"""Transport from the training job to the collector (stdlib + httpx; never imports torch).

``Client`` queues one frame per sampled step and ships batches from a background thread;
``ClientConfig`` holds its validated settings. See ``logitwatch/wire.py`` for the frame.
"""

from ._client import AlertCallback, Client
from .config import ClientConfig

__all__ = ["AlertCallback", "Client", "ClientConfig"]
