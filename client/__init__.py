"""Transport from the training job to the collector (stdlib + httpx; never imports torch).

``Client`` queues one frame per sampled step and ships gzip-compressed batches from a
background thread; frames the collector cannot take yet (down, slow, answering errors)
wait in a crash-safe disk spool (``_spool.py``) and are replayed in order, and what a job
leaves behind is sent with ``logitwatch push SPOOL``. ``ClientConfig`` holds the validated
settings. See ``logitwatch/wire.py`` for the frame.

Modules: ``_codec`` (pack on the training thread, encode off it), ``_queue`` (the backlog:
memory, spool index, batch in flight, counters), ``_backlog_spool`` (the backlog's disk
side: spilling to the spool within its budget, reading it back), ``_spool`` (segment
files), ``_worker`` (sender and spooler threads), ``_http`` (one request, retry schedule),
``_push`` (the CLI's replay), ``_client`` (the public class, lifecycle, fork).
"""

from ._client import AlertCallback, Client
from .config import ClientConfig

__all__ = ["AlertCallback", "Client", "ClientConfig"]
