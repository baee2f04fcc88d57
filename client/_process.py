"""The client's ties to its process: fork hooks and how the interpreter is exiting.

A forked child (DataLoader worker, ``torch.multiprocessing``) gets fresh queues and
threads for every live client (:meth:`Client._after_fork`); the parent makes the shared
TLS context before the fork so the child inherits it. At exit, a client asks whether the
interpreter is ending on an uncaught exception, to decide whether the run finished.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import TYPE_CHECKING

from ._http import shared_ssl_context

if TYPE_CHECKING:
    from ._client import Client

#: the clients that post to a collector, for the fork hooks (weak: a client may be dropped)
LIVE: weakref.WeakSet[Client] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(LIVE):
        try:
            client._after_fork()
        except Exception:  # pragma: no cover - never break the child
            pass


def _before_fork() -> None:
    """In the parent, just before a fork: make the shared TLS context if a live client
    will need one, so the child inherits it instead of creating it (see
    :func:`~logitwatch.client._http.shared_ssl_context`)."""
    try:
        if any(c.url is not None for c in list(LIVE)):
            shared_ssl_context()
    except Exception:  # pragma: no cover - never break the fork
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def exiting_on_exception() -> bool:
    """Whether the interpreter is exiting because of an uncaught exception: Python keeps
    it in ``sys.last_exc`` (3.12) / ``sys.last_value`` before it runs the exit hooks. Not
    in an interactive session, where an error at the prompt does not end it. An exit
    through ``sys.exit(code)`` is a normal exit, whatever the code (the hooks are not told
    it)."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return False
    return (getattr(sys, "last_exc", None) is not None
            or getattr(sys, "last_value", None) is not None)
