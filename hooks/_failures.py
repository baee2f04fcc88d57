"""How a :class:`~logitwatch.hooks._monitor.Monitor` fails: a part that raises is disabled
after its first failure and logged once; a warning that must disable nothing (under
sharding a rank keeps entering every collective) is logged once per key. Training goes on
unchanged either way."""

from __future__ import annotations

import logging
import sys

__all__ = ["PARTS", "FailuresMixin"]

log = logging.getLogger("logitwatch.hooks")

#: The parts of a monitor that a failure disables independently.
PARTS = ("attention", "final", "qk", "loss", "grad", "history", "step")


class FailuresMixin:
    """Failure handling for :class:`~logitwatch.hooks._monitor.Monitor` (its state lives
    there: ``disabled`` and the warn-once keys ``_warned``)."""

    def _warn_once(self, key: str, what: str) -> None:
        """Log ``what`` once per ``key`` with the traceback; disables nothing (under
        sharding a rank keeps entering every collective, whatever failed)."""
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("logitwatch: %s; training continues unaffected", what,
                    exc_info=sys.exc_info()[0] is not None)

    def _fail(self, part: str, exc: BaseException | None = None) -> None:
        """Disable ``part`` after its first failure; log once with the traceback."""
        if part in self.disabled:
            return
        self.disabled.add(part)
        log.warning(
            "logitwatch: the %r part of the monitor failed and is disabled for the rest of "
            "the run; training continues unaffected",
            part,
            exc_info=exc if exc is not None else True,
        )
